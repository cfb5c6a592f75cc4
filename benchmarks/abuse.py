"""``python -m benchmarks abuse``: does the server hold while one client abuses it?

Each attack runs at full size against a fresh llmsim server subprocess, while a few
well-behaved clients ("victims") keep streaming short chat completions and probing
``GET /health``.  A row reports the attack, the server's CPU (share of a core) and peak
RSS while it ran, the victims' time to first token p50/p99 during the attack against
the same victims just before it on the same server, and a verdict:

* ``holds``: the server did to the attack what it should (the attack's own check), no
  traceback in its log, every health probe answered, and the victims' TTFT p99 stayed
  within 3x (or +100 ms of) the p99 without the attack;
* ``degraded``: the attack was handled, but the victims suffered;
* ``fails``: the attack was not handled (or the server died).

The connection-level attacks are in ``benchmarks/attacks_conn.py``; the HTTP/2 ones, if
present, come from ``benchmarks/attacks_h2.py`` (each runs once, to its end).  ``--quick`` shortens
the attacks and their timeouts, not their size.  The machine is shared: compare the
"during" columns with the "before" ones of the same row, not across runs.
"""

from __future__ import annotations

import http.client
import importlib
import math
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import orjson
import trio

from benchmarks.attacks_conn import (
    Attack,
    AttackFn,
    Outcome,
    Target,
    cleartext_on_tls,
    slow_bodies,
    slow_clients,
    tls_client_context,
)
from benchmarks.loadgen.records import chat_body
from benchmarks.loadgen.stats import percentiles
from benchmarks.report import environment, print_table, write_json
from benchmarks.scenarios import Options
from benchmarks.servers import MODEL, SAMPLE_INTERVAL, RunningServer, ServerSpec, running

__all__ = ["attacks", "run"]

VICTIMS = 4
BEFORE_SECONDS = 5.0
#: The attack gets this long to reach full size before the victims' "during" window.
SETTLE_SECONDS = 2.0
HEALTH_INTERVAL = 0.2
READY_TIMEOUT = 60.0
SERVER_FLAGS = ("--time-to-first-token", "50ms", "--inter-token-latency", "10ms", "--max-num-seqs", "4096")


def attacks(quick: bool) -> list[Attack]:
    """Every attack, at full size; ``quick`` shortens timeouts and durations only."""
    body_timeout = 10.0 if quick else 30.0
    rows = [
        Attack(
            "slow body: 300 connections x 1 byte / 5 s (HTTP/1.1)",
            slow_bodies(300, 5.0, body_timeout),
            server_flags=("--body-read-timeout", f"{body_timeout:g}s"),
            duration=body_timeout + 12.0,
        ),
        Attack(
            "fd exhaustion: 1,100 slow clients, server at 1,024 fds",
            slow_clients(1100),
            fd_limit=1024,
            duration=10.0 if quick else 30.0,
        ),
        Attack(
            "fd exhaustion, cap lifted (--max-connections 5000): EMFILE back-off",
            slow_clients(1100),
            server_flags=("--max-connections", "5000"),
            fd_limit=1024,
            duration=10.0 if quick else 30.0,
        ),
        Attack(
            "cleartext HTTP/1.1 + h2c on the TLS port",
            cleartext_on_tls,
            server_flags=("--self-signed-certs",),
            tls=True,
            duration=5.0 if quick else 15.0,
        ),
    ]
    return rows + _h2_attacks(quick)


def _h2_attacks(quick: bool) -> list[Attack]:
    """The HTTP/2 attacks of ``benchmarks/attacks_h2.py`` (helper D's), at full size."""
    try:
        h2 = importlib.import_module("benchmarks.attacks_h2")
    except ImportError:
        return []
    chat = {"path": "/v1/chat/completions", "body": chat_body(MODEL, 100)}
    stall = 10.0 if quick else 30.0
    return [
        Attack("HTTP/2 PING flood: 1,000,000 frames", _h2(h2.ping_flood)),
        Attack("HTTP/2 PING flood, ACKs never read", _h2(h2.ping_flood, read=False)),
        Attack("HTTP/2 SETTINGS flood: 1,000,000 frames", _h2(h2.settings_flood)),
        Attack("HTTP/2 rapid reset: 100,000 streams", _h2(h2.rapid_reset)),
        Attack("HTTP/2 rapid reset, chat requests", _h2(h2.rapid_reset, **chat)),
        Attack(
            "HTTP/2 never-reading client: 256 streams, window 0",
            _h2(h2.never_reading, hold=stall + 10.0, **chat),
            server_flags=("--write-stall-timeout", f"{stall:g}s"),
            duration=stall + 12.0,
        ),
        Attack("HTTP/2 16 MiB frame x10", _h2(h2.huge_frame)),
        Attack("HTTP/2 header block, 1 CONTINUATION byte / s", _h2(h2.slow_header_block, limit=30.0)),
    ]


def _h2(attack: Callable[..., Awaitable[Any]], **options: Any) -> AttackFn:
    """One of attacks_h2's coroutines as an attack of this table: it runs once, to its
    end, and held if the server stopped it (GOAWAY, resets or a close)."""

    def run_attack(target: Target, stop: threading.Event) -> Outcome:
        outcome = trio.run(partial(attack, target.host, target.port, **options))
        stop.wait()
        sent = f"{outcome.frames_sent:,} frames, {outcome.bytes_sent / 2**20:.1f} MiB in {outcome.seconds:.1f} s"
        if not options.get("read", True):  # it cannot see the answer: judged by RSS and the others
            return Outcome(True, f"{sent}; reads nothing, so judged by RSS and the victims", attrs.asdict(outcome))
        summary = f"{sent}; the server: {outcome.verdict}"
        return Outcome(outcome.verdict != "not stopped", summary, attrs.asdict(outcome))

    return run_attack


def run(options: Options) -> dict[str, Any]:
    rows = []
    todo = attacks(options.quick)
    for attack in todo:
        print(f"  {attack.name} ...", flush=True)
        rows.append(_run_attack(attack, options.log_dir))
    if not any(attack.name.startswith("HTTP/2") for attack in todo):
        rows.append({"attack": "HTTP/2 attacks", "verdict": "skipped", "summary": "benchmarks/attacks_h2.py not found"})
    payload = {"scenario": "abuse", "environment": environment(), "quick": options.quick, "results": rows}
    _print(rows)
    write_json(options.results_dir, "abuse", payload)
    return payload


def _run_attack(attack: Attack, log_dir: Path) -> dict[str, Any]:
    spec = _server_spec(attack)
    with _serving(spec, attack.tls, log_dir) as (server, target):
        before = _Victims(target).run_for(BEFORE_SECONDS)
        stop = threading.Event()
        outcome: list[Outcome] = []
        attacker = threading.Thread(target=lambda: outcome.append(attack.run(target, stop)), daemon=True)
        attacker.start()
        time.sleep(SETTLE_SECONDS)
        begin = time.perf_counter()
        during = _Victims(target).run_for(attack.duration - SETTLE_SECONDS)
        end = time.perf_counter()
        stop.set()
        attacker.join(timeout=60)
        time.sleep(2 * SAMPLE_INTERVAL)  # let the sampler pass the end of the window
        cpu, _, rss = server.usage_between(begin, end)
        alive = server.process.poll() is None
    log_text = (log_dir / f"{spec.name}.log").read_text(errors="replace")
    result = outcome[0] if outcome else Outcome(False, "the attack did not finish")
    tracebacks = log_text.count("Traceback")
    row = {
        "attack": attack.name,
        "server_cpu_share": cpu / (end - begin),
        "server_rss_mib": rss / 2**20,
        "ttft_before": before.ttft(),
        "ttft_during": during.ttft(),
        "victim_errors": during.errors,
        "health_ok": during.health_ok,
        "health_probes": during.health_probes,
        "tracebacks_in_log": tracebacks,
        "emfile_log_lines": log_text.count("cannot accept connections"),
        "summary": result.summary,
        "details": result.details,
        "server_alive": alive,
    }
    row["verdict"] = _verdict(row, result.held and alive and tracebacks == 0)
    return row


def _verdict(row: dict[str, Any], handled: bool) -> str:
    if not handled:
        return "fails"
    before, during = row["ttft_before"]["p99"], row["ttft_during"]["p99"]
    slower = not during <= max(3 * before, before + 0.1)  # (NaN: no victim finished)
    if slower or row["victim_errors"] or row["health_ok"] < row["health_probes"]:
        return "degraded"
    return "holds"


def _print(rows: list[dict[str, Any]]) -> None:
    table = []
    for r in rows:
        if "ttft_before" not in r:
            table.append([r["attack"], "-", "-", "-", "-", r["verdict"]])
            continue
        b, d = r["ttft_before"], r["ttft_during"]
        table.append(
            [
                r["attack"],
                f"{r['server_cpu_share']:.2f}",
                f"{r['server_rss_mib']:.0f}",
                f"{_ms(b['p50'])} / {_ms(b['p99'])}",
                f"{_ms(d['p50'])} / {_ms(d['p99'])}",
                r["verdict"],
            ]
        )
    print_table(
        "abuse: one attack at a time, 4 victim streams + health probes (TTFT in ms; machine shared, compare per row)",
        ["attack", "CPU (cores)", "RSS MiB", "victims TTFT p50/p99 before", "during", "verdict"],
        table,
    )
    for r in rows:
        extra = "" if "health_ok" not in r else f"; health {r['health_ok']}/{r['health_probes']} answered"
        extra += "" if not r.get("tracebacks_in_log") else f"; {r['tracebacks_in_log']} tracebacks in the log"
        print(f"  {r['attack']}: {r['summary']}{extra}")


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.0f}"


# --- the server ----------------------------------------------------------------------------


def _server_spec(attack: Attack) -> ServerSpec:
    name = "abuse-" + "".join(ch if ch.isalnum() else "-" for ch in attack.name.split(":")[0]).strip("-")
    command = [sys.executable, "-m", "llmsim", "serve", "--port", "{port}", "--model", MODEL]
    command += ["--shutdown-grace-period", "0", *SERVER_FLAGS, *attack.server_flags]
    if attack.fd_limit is not None:  # lowered in a shell that then becomes the server (same pid)
        command = ["sh", "-c", f"ulimit -n {attack.fd_limit} && exec " + " ".join(command)]
    return ServerSpec(name, tuple(command))


@contextmanager
def _serving(spec: ServerSpec, tls: bool, log_dir: Path) -> Iterator[tuple[RunningServer, Target]]:
    """``spec`` running, ready (one streamed chat completion, over TLS if ``tls``) and sampled."""

    def target(server: RunningServer) -> Target:
        return Target("127.0.0.1", server.port, tls)

    with running(spec, log_dir, lambda server: _wait_ready(server, target(server))) as server:
        yield server, target(server)


def _wait_ready(server: RunningServer, target: Target) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.spec.name} exited with status {server.process.returncode}")
        if not math.isnan(_chat_ttft(target)):
            return
        time.sleep(0.1)
    raise TimeoutError(f"{server.spec.name} not ready after {READY_TIMEOUT:.0f} s")


# --- the victims ---------------------------------------------------------------------------


def _connect(target: Target, timeout: float) -> http.client.HTTPConnection:
    if target.tls:
        return http.client.HTTPSConnection(target.host, target.port, timeout=timeout, context=tls_client_context())
    return http.client.HTTPConnection(target.host, target.port, timeout=timeout)


_CHAT = orjson.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 10}
)


def _chat_ttft(target: Target) -> float:
    """Seconds to the first ``data:`` line of one streamed chat completion; NaN on failure."""
    started = time.perf_counter()
    try:
        connection = _connect(target, 10.0)
        connection.request("POST", "/v1/chat/completions", _CHAT, {"Content-Type": "application/json"})
        response = connection.getresponse()
        first = math.nan
        for line in response:
            if line.startswith(b"data:") and math.isnan(first):
                first = time.perf_counter() - started
        connection.close()
        return first if response.status == 200 else math.nan
    except OSError:
        return math.nan


@attrs.define(eq=False)
class _Victims:
    """:data:`VICTIMS` threads streaming chat completions one after another (a new
    connection each: a victim never sits idle on a kept-alive one), and one probing
    ``GET /health`` every :data:`HEALTH_INTERVAL` seconds."""

    target: Target
    ttfts: list[float] = attrs.field(factory=list)
    errors: int = 0
    health_ok: int = 0
    health_probes: int = 0

    def run_for(self, seconds: float) -> _Victims:
        stop_at = time.monotonic() + seconds
        threads = [threading.Thread(target=self._chat, args=(stop_at,)) for _ in range(VICTIMS)]
        threads.append(threading.Thread(target=self._health, args=(stop_at,)))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return self

    def ttft(self) -> dict[str, float]:
        p = percentiles(self.ttfts)
        return {"p50": p.p50, "p99": p.p99, "count": p.count}

    def _chat(self, stop_at: float) -> None:
        while time.monotonic() < stop_at:
            ttft = _chat_ttft(self.target)
            if math.isnan(ttft):
                self.errors += 1
            else:
                self.ttfts.append(ttft)

    def _health(self, stop_at: float) -> None:
        while time.monotonic() < stop_at:
            self.health_probes += 1
            try:
                connection = _connect(self.target, 2.0)
                connection.request("GET", "/health")
                self.health_ok += connection.getresponse().status == 200
                connection.close()
            except OSError:
                pass
            time.sleep(HEALTH_INTERVAL)
