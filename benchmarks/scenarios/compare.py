"""Compare: this checkout's llmsim against another revision's, side by side in one run.

``python -m benchmarks compare --against DIR`` where DIR is a checkout of another llmsim
revision (``git worktree add /tmp/base <rev>``).  Both native servers stream 200-token
chat completions at zero simulated latency, under the throughput scenario's loads, with
the rounds interleaved (old, new, old, new ...) so that a drift in the machine's
background load hits both alike.  The other revision runs from this virtualenv with
``PYTHONPATH=DIR``, so only llmsim's own code differs.  Reported per load: medians of
tokens/s and of server CPU seconds per million tokens, and new/old ratios of both.
"""

from __future__ import annotations

import statistics
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchmarks.report import environment, print_table, ratio, write_json
from benchmarks.scenarios import Options
from benchmarks.scenarios.measure import measure
from benchmarks.scenarios.throughput import LOADS, MAX_TOKENS, ROOMY, ZERO_LATENCY, chat_load
from benchmarks.servers import ServerSpec, llmsim, running

__all__ = ["run"]

NEW = "this checkout"
OLD = "--against"


def _servers(against: Path) -> tuple[ServerSpec, ServerSpec]:
    new = llmsim(NEW, "--server", "native", *ROOMY, *ZERO_LATENCY)
    # PYTHONSAFEPATH: ``python -m`` puts the working directory ahead of PYTHONPATH, so run
    # from this checkout it would start this checkout's llmsim on both sides.
    old = ServerSpec(OLD, ("env", f"PYTHONPATH={against}", "PYTHONSAFEPATH=1", *new.argv))
    return old, new


def run(options: Options) -> dict[str, Any]:
    if options.against is None:
        raise SystemExit("compare needs --against DIR: a checkout of the llmsim revision to compare with")
    against = options.against.resolve()
    if not (against / "llmsim" / "__init__.py").is_file():
        raise SystemExit(f"--against {against}: no llmsim package there")
    duration, warmup, rounds = (3.0, 1.0, 2) if options.quick else (10.0, 2.0, 4)
    samples: list[dict[str, Any]] = []
    with ExitStack() as stack:
        servers = [stack.enter_context(running(spec, options.log_dir)) for spec in _servers(against)]
        for round_index in range(rounds):
            for load in LOADS:
                # Alternate which server goes first, so neither always follows the other.
                for server in servers if round_index % 2 == 0 else reversed(servers):
                    result = measure(server, chat_load(server, load, duration, warmup, options.processes))
                    samples.append(
                        {
                            "round": round_index,
                            "server": server.spec.name,
                            "load": result.summary.label,
                            "tokens_per_second": result.summary.tokens_per_second,
                            "cpu_seconds_per_million_tokens": result.cpu_seconds_per_million_tokens,
                            "errors": result.summary.errors,
                        }
                    )
    rows = _rows(samples)
    payload = {
        "scenario": "compare",
        "environment": environment(),
        "against": str(against),
        "duration_seconds": duration,
        "rounds": rounds,
        "results": rows,
        "samples": samples,
    }
    print_table(
        f"this checkout vs {against} (native server, zero latency, {MAX_TOKENS}-token streaming chat; "
        f"medians of {rounds} interleaved rounds)",
        ("load", "old tok/s", "new tok/s", "new/old", "old CPU s/Mtok", "new CPU s/Mtok", "new/old CPU", "errors"),
        [
            (
                row["load"],
                row["old_tokens_per_second"],
                row["new_tokens_per_second"],
                row["throughput_ratio"],
                row["old_cpu_seconds_per_million_tokens"],
                row["new_cpu_seconds_per_million_tokens"],
                row["cpu_ratio"],
                row["errors"],
            )
            for row in rows
        ],
    )
    write_json(options.results_dir, "compare", payload)
    return payload


def _rows(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for load in dict.fromkeys(sample["load"] for sample in samples):

        def median(server: str, key: str, load: str = load) -> float:
            return statistics.median(s[key] for s in samples if s["load"] == load and s["server"] == server)

        old_tps, new_tps = median(OLD, "tokens_per_second"), median(NEW, "tokens_per_second")
        old_cpu = median(OLD, "cpu_seconds_per_million_tokens")
        new_cpu = median(NEW, "cpu_seconds_per_million_tokens")
        rows.append(
            {
                "load": load,
                "old_tokens_per_second": old_tps,
                "new_tokens_per_second": new_tps,
                "throughput_ratio": ratio(new_tps, old_tps),
                "old_cpu_seconds_per_million_tokens": old_cpu,
                "new_cpu_seconds_per_million_tokens": new_cpu,
                "cpu_ratio": ratio(new_cpu, old_cpu),
                "errors": sum(s["errors"] for s in samples if s["load"] == load),
            }
        )
    return rows
