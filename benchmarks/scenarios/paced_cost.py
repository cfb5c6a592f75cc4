"""Paced cost: server CPU per paced token, request intake, and latency error (issue 16's proof).

llmsim native with TTFT 100 ms and ITL 20 ms streams ``ignore_eos`` chat completions to
h2load (C, it only reads): HTTP/2 20 x 50 and 40 x 50 streams, HTTP/1.1 (``--h1``) 1,000
and 2,000 connections.  Each load is split over :data:`INSTANCES` h2load processes started
a stream lifetime apart / :data:`INSTANCES`, so that the streams' waves (paced streams
that start together end together) are spread over the lifetime and the load is steady.
The measured window starts once every instance runs; tokens and requests are the
server's own counters (``vllm:generation_tokens_total`` and ``vllm:request_success_total``
on ``/metrics``, read at both ends of the window), CPU is ``/proc/<pid>/stat`` (user and
system) and busy is ``/proc/<pid>/schedstat``.  Every load runs at 100 and at 400 tokens
per request: ``cpu = T * tokens + R * requests`` for both gives T (µs per token) and R
(µs per request, its set-up and end).

Then (:mod:`.paced_intake`) request intake in process, and (:mod:`.paced_latency`) the
latency error at 2,000 HTTP/2 streams and at low load, against the paced blaster too.

``--against DIR`` runs the same server from another llmsim checkout (``git worktree add
/tmp/base HEAD~1``) beside this one, loads interleaved, for a before/after table.  At the
HTTP/1.1 loads :mod:`benchmarks.floor`'s C pacer runs beside them too (where a C compiler
is): one ``send()`` per token per connection and nothing else, the floor the issue names,
measured in the same run ("x floor" = llmsim / floor).

    python -m benchmarks paced_cost [--quick] [--rounds N] [--against DIR]
"""

from __future__ import annotations

import http.client
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs
import orjson
import psutil

from benchmarks import floor
from benchmarks.external import parse_h2load, shell
from benchmarks.loadgen.records import chat_body
from benchmarks.loadgen.runner import runnable_seconds
from benchmarks.report import environment, print_table, ratio, write_json
from benchmarks.scenarios import Options, paced_latency
from benchmarks.scenarios.measure import CLEANUP_TIMEOUT
from benchmarks.servers import MODEL, RunningServer, ServerSpec, llmsim, running

__all__ = ["LOADS", "Load", "Reading", "cost_row", "measure_cost", "paced_server", "parse_metrics", "run", "split_cost"]

ROOT = Path(__file__).resolve().parents[2]
TTFT, ITL = 0.100, 0.020
SHORT, LONG = 100, 400
#: h2load processes per load, started a lifetime / INSTANCES apart.
INSTANCES = 10
#: After the last instance started, before the window opens (its connections are set up).
SETTLE = 0.5
SCRAPE_TIMEOUT = 30.0
#: How late (a share of the time) the server may fall before an instance's last wave ends in the window.
LATE_SHARE = 0.15
#: Goals in µs of server CPU per paced token (issue 16), by HTTP/2?
GOALS = {True: 4.5, False: 9.0}
INTAKE_GOAL_US, STREAM_GOAL_BYTES = 100.0, 20_000
NEW, OLD, FLOOR = "this checkout", "--against", "floor (C pacer)"
FLAGS = (
    *("--server", "native", "--max-num-seqs", "12000", "--max-waiting-queue-length", "12000"),
    *("--max-concurrent-streams", "1000"),
)
#: The server's soft fd limit raised to its hard limit (--max-connections defaults to 90 % of it).
RAISE_FD_LIMIT = ("sh", "-c", 'ulimit -n "$(ulimit -Hn)" 2>/dev/null; exec "$@"', "sh")
METRICS = ("vllm:generation_tokens_total", "vllm:request_success_total")


@attrs.frozen
class Load:
    label: str
    http2: bool
    connections: int
    streams: int

    @property
    def concurrency(self) -> int:
        return self.connections * self.streams


LOADS = (
    Load("h2 20x50", True, 20, 50),
    Load("h2 40x50", True, 40, 50),
    Load("h1 1000", False, 1000, 1),
    Load("h1 2000", False, 2000, 1),
)


def paced_server(name: str, source: Path, ttft: float = TTFT) -> ServerSpec:
    """llmsim from the checkout ``source`` paced at ``ttft`` and :data:`ITL`, its fd limit
    raised (``PYTHONSAFEPATH``: the working directory must not shadow ``source``)."""
    paced = ("--time-to-first-token", f"{ttft * 1000:g}ms", "--inter-token-latency", f"{ITL * 1000:g}ms")
    if ttft != TTFT:
        name = f"{name} {ttft * 1000:g}ms"
    spec = llmsim(name, *FLAGS, *paced)
    return ServerSpec(name, (*RAISE_FD_LIMIT, "env", f"PYTHONPATH={source}", "PYTHONSAFEPATH=1", *spec.argv))


def parse_metrics(text: str, names: tuple[str, ...] = METRICS) -> dict[str, float]:
    """The value of each of ``names`` in a Prometheus text page, summed over its label sets."""
    totals = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, brace, rest = line.partition("{")
        if brace:
            value = rest.rpartition("}")[2].split()[0]
        else:
            name, _, value = line.partition(" ")
        name = name.strip()
        if name in totals:
            totals[name] += float(value.split()[0])
    return totals


@attrs.frozen
class Reading:
    """The server's counters at one time (``scrape``: how long ``/metrics`` took)."""

    at: float
    user: float
    system: float
    runnable: float
    tokens: float
    requests: float
    scrape: float = 0.0


def read_counters(server: RunningServer, connection: http.client.HTTPConnection) -> Reading:
    """``/metrics`` over ``connection`` (opened before the load: a new connection would wait
    behind the load's in the accept queue), then CPU at once, so both describe the same
    moment: the page's render, give or take its way back."""
    started = time.perf_counter()
    connection.request("GET", "/metrics")
    counts = parse_metrics(connection.getresponse().read().decode())
    times = psutil.Process(server.process.pid).cpu_times()
    runnable = runnable_seconds(server.process.pid)
    now = time.perf_counter()
    tokens, requests = (counts[name] for name in METRICS)
    return Reading(now, times.user, times.system, runnable, tokens, requests, scrape=now - started)


def split_cost(short: tuple[float, float], long: tuple[float, float]) -> tuple[float, float]:
    """(T µs per token, R µs per request) from two loads' (µs per token, requests per token):
    ``cpu / token = T + R * requests / token``.  NaN when the two cannot be told apart."""
    (x1, y1), (x2, y2) = short, long
    if not all(map(math.isfinite, (x1, y1, x2, y2))) or y1 == y2:
        return math.nan, math.nan
    per_request = (x1 - x2) / (y1 - y2)
    return x1 - per_request * y1, per_request


def cost_row(before: Reading, after: Reading) -> dict[str, float]:
    """What the server spent between two readings, per token."""
    tokens, requests = after.tokens - before.tokens, after.requests - before.requests
    window = after.at - before.at
    user, system = after.user - before.user, after.system - before.system
    per = 1e6 / tokens if tokens > 0 else math.nan
    return {
        "window_seconds": window,
        "tokens": tokens,
        "requests": requests,
        "us_per_token": (user + system) * per,
        "user_us_per_token": user * per,
        "sys_us_per_token": system * per,
        "requests_per_token": requests / tokens if tokens > 0 else math.nan,
        "tokens_per_second": tokens / window,
        "requests_per_second": requests / window,
        "server_busy": (after.runnable - before.runnable) / window,
    }


def _h2load(port: int, load: Load, connections: int, requests: int, body: Path) -> list[str]:
    command = ["h2load", "-c", str(connections), "-m", str(load.streams), "-n", str(requests), "-t", "1"]
    command += ["-d", str(body), "-H", "content-type: application/json"]
    if not load.http2:
        command.append("--h1")
    return [*command, f"http://127.0.0.1:{port}/v1/chat/completions"]


def measure_cost(server: RunningServer, load: Load, tokens: int, window: float, scratch: Path) -> dict[str, Any]:
    """One paced load from staggered h2load instances; the server's cost over ``window`` s."""
    body = scratch / f"paced_body_{tokens}.json"
    body.write_bytes(chat_body(MODEL, tokens))
    lifetime = TTFT + (tokens - 1) * ITL
    count = min(INSTANCES, load.connections)
    offsets = [index * lifetime / count for index in range(count)]
    opens = offsets[-1] + SETTLE
    closes = opens + window
    processes: list[tuple[list[str], subprocess.Popen[str]]] = []
    metrics = http.client.HTTPConnection("127.0.0.1", server.port, timeout=SCRAPE_TIMEOUT)
    try:
        read_counters(server, metrics)  # connected, and the page's code warm
        start = time.perf_counter() + 0.2
        for index, offset in enumerate(offsets):
            connections = load.connections // count + (index < load.connections % count)
            # Waves enough to run past the window, with room for the server being late.
            waves = math.ceil((closes + LATE_SHARE * (closes - offset) + 0.5 - offset) / lifetime)
            command = _h2load(server.port, load, connections, connections * load.streams * waves, body)
            _sleep_until(start + offset)
            processes.append((command, subprocess.Popen(command, stdout=subprocess.PIPE, text=True)))
        _sleep_until(start + opens)
        before = read_counters(server, metrics)
        _sleep_until(start + closes)
        after = read_counters(server, metrics)
        short = sum(process.poll() is not None for _, process in processes)
        results = [
            parse_h2load(command, process.communicate(timeout=lifetime * 3 + 60)[0]) for command, process in processes
        ]
    finally:
        metrics.close()
        for _, process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    cleanup = server.wait_idle(CLEANUP_TIMEOUT)
    return {
        "load": load.label,
        "http2": load.http2,
        "streams": load.concurrency,
        "max_tokens": tokens,
        **cost_row(before, after),
        "scrape_seconds": max(before.scrape, after.scrape),
        "h2load_errors": sum(r.failed + r.errored for r in results),
        "h2load_succeeded": sum(r.succeeded for r in results),
        #: h2load instances that ended inside the window (the load fell short there).
        "instances_ended_early": short,
        "server_cleanup_seconds": cleanup,
        "h2load_command": shell(processes[0][0]) if processes else "",
    }


def _sleep_until(at: float) -> None:
    time.sleep(max(0.0, at - time.perf_counter()))


def _fd_limit_check(needed: int) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        print(f"warning: fd hard limit {hard} < {needed}: the 2,000-connection loads may fail", file=sys.stderr)


def _sources(options: Options) -> list[tuple[str, Path]]:
    sources = [(NEW, ROOT)]
    if options.against is not None:
        against = options.against.resolve()
        if not (against / "llmsim" / "__init__.py").is_file():
            raise SystemExit(f"--against {against}: no llmsim package there")
        sources.insert(0, (OLD, against))
    return sources


def run(options: Options) -> dict[str, Any]:
    if shutil.which("h2load") is None:
        raise SystemExit("paced_cost needs h2load (nghttp2-client)")
    rounds = options.rounds or 2
    window = 3.0 if options.quick else 10.0
    sources = _sources(options)
    _fd_limit_check(max(load.connections for load in LOADS) * 12 // 10 + 100)
    options.log_dir.mkdir(parents=True, exist_ok=True)
    samples: list[dict[str, Any]] = []
    floor_spec = floor.h1_pacer(FLOOR, options.log_dir / "floor", TTFT, ITL)
    if floor_spec is None:
        print("no C compiler: the HTTP/1.1 floor (benchmarks.floor) is not measured", file=sys.stderr)
    with ExitStack() as stack:
        servers = [stack.enter_context(running(paced_server(name, path), options.log_dir)) for name, path in sources]
        floors = [] if floor_spec is None else [stack.enter_context(running(floor_spec, options.log_dir))]
        for round_index in range(rounds):
            for load in LOADS:
                serving = servers if load.http2 else [*servers, *floors]
                for tokens in (SHORT, LONG):
                    # Alternate which server goes first, so none always follows another.
                    for server in serving if round_index % 2 == 0 else reversed(serving):
                        row = measure_cost(server, load, tokens, window, options.log_dir)
                        samples.append({"round": round_index, "server": server.spec.name, **row})
                        print(
                            f"  {server.spec.name} {load.label} {tokens} tok: {row['us_per_token']:.2f} µs/token",
                            flush=True,
                        )
    payload: dict[str, Any] = {
        "scenario": "paced_cost",
        "configured": {"ttft_seconds": TTFT, "itl_seconds": ITL, "max_tokens": [SHORT, LONG]},
        "window_seconds": window,
        "rounds": rounds,
        "h2load_instances": INSTANCES,
        "against": str(options.against.resolve()) if options.against else None,
        "goals": {
            "us_per_token_http2": GOALS[True],
            "us_per_token_http1": GOALS[False],
            "intake_us": INTAKE_GOAL_US,
            "bytes_per_stream": STREAM_GOAL_BYTES,
        },
        "environment": environment(),
        "cost": _medians(samples),
        "split": _split(samples),
        "samples": samples,
    }
    # Written after each part: a later part that fails loses only itself.
    write_json(options.results_dir, "paced_cost", payload)
    payload["intake"] = intake = _intake(sources, options.quick)
    write_json(options.results_dir, "paced_cost", payload)
    _print(payload["cost"], payload["split"], intake)
    latency = paced_latency.run_parts(options, sources, paced_server)
    payload.update(latency)
    paced_latency.print_tables(latency)
    write_json(options.results_dir, "paced_cost", payload)
    _plot(payload, options.results_dir / "paced_cost.png")
    return payload


def _plot(payload: dict[str, Any], path: Path) -> None:
    from benchmarks import plots  # matplotlib: only when the scenario runs

    plots.paced_cost(payload, path)


COST_KEYS = (
    "us_per_token",
    "user_us_per_token",
    "sys_us_per_token",
    "requests_per_token",
    "tokens_per_second",
    "requests_per_second",
    "server_busy",
)


def _medians(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per server, load and length: medians over rounds, errors summed, and the ratio
    to the ``--against`` server's median (when there is one)."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for sample in samples:
        groups.setdefault((sample["server"], sample["load"], sample["max_tokens"]), []).append(sample)
    rows = []
    for (server, load, tokens), group in groups.items():
        row: dict[str, Any] = {"server": server, "load": load, "max_tokens": tokens, "http2": group[0]["http2"]}
        row["streams"] = group[0]["streams"]
        row.update({key: statistics.median(g[key] for g in group) for key in COST_KEYS})
        row["h2load_errors"] = sum(g["h2load_errors"] for g in group)
        row["instances_ended_early"] = sum(g["instances_ended_early"] for g in group)
        rows.append(row)
    for key, name in (("ratio_to_against", OLD), ("ratio_to_floor", FLOOR)):
        bases = {(r["load"], r["max_tokens"]): r for r in rows if r["server"] == name}
        for row in rows:
            base = bases.get((row["load"], row["max_tokens"]))
            unrelated = base is None or row["server"] in (name, FLOOR)  # (the floor has neither ratio)
            row[key] = math.nan if unrelated else ratio(row["us_per_token"], base["us_per_token"])
    return rows


def _split(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """T and R per server and load: solved per round, then the median over rounds."""
    pairs: dict[tuple[str, str], list[tuple[float, float]]] = {}
    by_key = {(s["round"], s["server"], s["load"], s["max_tokens"]): s for s in samples}
    for (round_index, server, load, tokens), short in by_key.items():
        long = by_key.get((round_index, server, load, LONG))
        if tokens != SHORT or long is None:
            continue
        solved = split_cost(
            (short["us_per_token"], short["requests_per_token"]), (long["us_per_token"], long["requests_per_token"])
        )
        pairs.setdefault((server, load), []).append(solved)
    return [
        {
            "server": server,
            "load": load,
            "us_per_token": statistics.median(t for t, _ in solved),
            "us_per_request": statistics.median(r for _, r in solved),
        }
        for (server, load), solved in pairs.items()
    ]


def _intake(sources: list[tuple[str, Path]], quick: bool) -> list[dict[str, Any]]:
    """:mod:`.paced_intake` in a process per source (run by path: its imports are llmsim's)."""
    script = Path(__file__).with_name("paced_intake.py")
    requests = "500" if quick else "2000"
    rows = []
    for name, source in sources:
        environ = {**os.environ, "PYTHONPATH": str(source), "PYTHONSAFEPATH": "1"}
        command = [sys.executable, str(script), "--max-tokens", str(SHORT), "10000", "--requests", requests]
        output = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=600, check=True).stdout
        rows += [{"server": name, **row} for row in orjson.loads(output)]
    return rows


def _print(rows: list[dict[str, Any]], split: list[dict[str, Any]], intake: list[dict[str, Any]]) -> None:
    print_table(
        f"server CPU per paced token (TTFT {TTFT * 1000:g} ms, ITL {ITL * 1000:g} ms, h2load; counts from /metrics;"
        " medians over rounds; x before = this / --against; x floor = this / the C pacer)",
        [
            "server",
            "load",
            "tok/req",
            "µs/token",
            "x before",
            "x floor",
            "user µs",
            "sys µs",
            "tok/s",
            "req/s",
            "srv busy",
            "h2load errors",
            "short",
            "goal µs",
        ],
        [
            [
                r["server"],
                r["load"],
                r["max_tokens"],
                r["us_per_token"],
                r["ratio_to_against"],
                r["ratio_to_floor"],
                r["user_us_per_token"],
                r["sys_us_per_token"],
                r["tokens_per_second"],
                r["requests_per_second"],
                r["server_busy"],
                r["h2load_errors"],
                r["instances_ended_early"],
                f"<= {GOALS[r['http2']]:g}",
            ]
            for r in rows
        ],
    )
    print_table(
        f"per token and per request (cpu = T x tokens + R x requests, from the {SHORT}- and {LONG}-token loads)",
        ["server", "load", "T µs/token", "R µs/request"],
        [[s["server"], s["load"], s["us_per_token"], s["us_per_request"]] for s in split],
    )
    print_table(
        "request intake in process (application entry to Engine.submit, GC included; no protocol layer:"
        f" the goal <= {INTAKE_GOAL_US:g} µs includes it) and memory per in-flight stream (tracemalloc)",
        ["server", "max_tokens", "intake µs mean", "median", "KB/stream", "goal KB"],
        [
            [
                i["server"],
                i["max_tokens"],
                i["cpu_us_mean"],
                i["cpu_us_median"],
                i["bytes_per_stream"] / 1000,
                f"<= {STREAM_GOAL_BYTES / 1000:g}",
            ]
            for i in intake
        ],
    )
