"""The latency parts of the ``paced_cost`` scenario, with this project's load generator.

* **Fidelity at 2,000 HTTP/2 streams** (40 connections x 50, 100-token chats, TTFT 100 ms,
  ITL 20 ms, arrivals spread over one lifetime as in ``fidelity``): TTFT and ITL p50/p99
  against the configuration and against the paced blaster measured in the same run.
* **Low-load bias**: HTTP/1.1, one worker process, 10-token chats (short, so that one
  stream gives many TTFT samples), ITL 20 ms: TTFT 50 ms with 1 and 8 concurrent streams,
  and TTFT 100 ms with 1 stream.  Median TTFT and ITL error against the configuration
  and against the blaster (which rounds onto llmsim's 2 ms step grid as llmsim does,
  to the nearest grid time), and the same loads once more through the lean client
  (:mod:`benchmarks.loadgen.lean`: blocking sockets, what the issue's goal is about;
  the load generator itself adds about 2.5 ms to a TTFT).

Each server (llmsim of every source, the blaster) stays up through its part and the
loads are interleaved across them, one round.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchmarks.loadgen.lean import lean_ttfts
from benchmarks.loadgen.runner import LoadSpec
from benchmarks.report import percent_error, print_table
from benchmarks.scenarios import Options
from benchmarks.scenarios.measure import measure
from benchmarks.servers import MODEL, ServerSpec, running

__all__ = ["BLASTER", "latency_row", "print_tables", "run_parts"]

ITL = 0.020
FIDELITY_TTFT, FIDELITY_TOKENS, FIDELITY_LOAD = 0.100, 100, (40, 50)
LOW_TOKENS = 10
#: (TTFT seconds, concurrent HTTP/1.1 streams)
LOW_LOADS = ((0.050, 1), (0.050, 8), (0.100, 1))
BLASTER = "paced blaster"
MEDIAN_GOAL_PERCENT = 1.0


def _blaster(ttft: float) -> ServerSpec:
    argv = (sys.executable, "-m", "benchmarks.loadgen.blaster", "--port", "{port}", "--ttft", f"{ttft:g}")
    return ServerSpec(f"{BLASTER} {ttft * 1000:g}ms", (*argv, "--itl", f"{ITL:g}"))


def latency_row(summary: Any, ttft: float, reference: dict[str, Any] | None) -> dict[str, Any]:
    """TTFT and ITL p50/p99 of a load summary, their error against the configuration
    (% and ms) and against ``reference`` (the blaster's row of the same load, in %)."""
    row: dict[str, Any] = {"streams_measured": summary.streams_measured, "errors": summary.errors}
    for metric, configured in (("ttft", ttft), ("itl", ITL)):
        for quantile in ("p50", "p99"):
            measured = getattr(getattr(summary, metric), quantile)
            key = f"{metric}_{quantile}"
            row[key] = measured
            row[f"{key}_error_ms"] = (measured - configured) * 1000
            row[f"{key}_error_percent"] = percent_error(measured, configured)
            row[f"{key}_vs_blaster_percent"] = _relative(measured, reference[key] if reference else math.nan)
    row["tokens_per_second"] = summary.tokens_per_second
    row["client_busy"] = summary.client_busy
    return row


def _relative(measured: float, reference: float) -> float:
    """Percent error against ``reference``; NaN without one (0: every event in one read)."""
    return percent_error(measured, reference) if reference and not math.isnan(reference) else math.nan


def _run_loads(
    specs: list[ServerSpec], loads: list[dict[str, Any]], options: Options, ttft: float, *, lean: bool = False
) -> list[dict[str, Any]]:
    """Every load on every server (the blaster last in ``specs``), interleaved; with
    ``lean``, each load once more through the lean client (:mod:`benchmarks.loadgen.lean`)."""
    rows = []
    with ExitStack() as stack:
        servers = [stack.enter_context(running(spec, options.log_dir)) for spec in specs]
        for load in loads:
            measured = []
            for server in servers:
                spec = LoadSpec(port=server.port, model=MODEL, **load)
                result = measure(server, spec)
                lean_p50 = _lean_p50(server.port, load) if lean else math.nan
                measured.append((server.spec.name, result, lean_p50))
            *mine, (blaster_name, blaster, blaster_lean) = measured
            reference = latency_row(blaster.summary, ttft, None)
            for name, result, lean_p50 in mine:
                row = latency_row(result.summary, ttft, reference)
                row.update(server=name, load=result.summary.label, server_busy=result.server_busy, ttft_configured=ttft)
                rows.append(row | _lean_row(lean_p50, ttft, blaster_lean))
            rows.append(
                {
                    **reference,
                    "server": blaster_name,
                    "load": blaster.summary.label,
                    "server_busy": blaster.server_busy,
                    "ttft_configured": ttft,
                }
                | _lean_row(blaster_lean, ttft, math.nan)
            )
    return rows


def _lean_p50(port: int, load: dict[str, Any]) -> float:
    streams, duration, tokens = load["connections"], load["duration"], load["max_tokens"]
    return lean_ttfts(port, model=MODEL, streams=streams, duration=duration, max_tokens=tokens).p50


def _lean_row(p50: float, ttft: float, reference: float) -> dict[str, float]:
    """The lean client's median TTFT, its error against the configuration and against
    the blaster's (NaN where not measured)."""
    return {
        "lean_ttft_p50": p50,
        "lean_ttft_p50_error_percent": percent_error(p50, ttft),
        "lean_ttft_p50_vs_blaster_percent": _relative(p50, reference),
    }


#: (name, source checkout, TTFT seconds) -> llmsim paced at that TTFT and :data:`ITL`
ServerFactory = Callable[[str, Path, float], ServerSpec]


def run_parts(
    options: Options, sources: list[tuple[str, Path]], server: ServerFactory
) -> dict[str, list[dict[str, Any]]]:
    duration = 7.0 if options.quick else 15.0
    low_duration = 6.0 if options.quick else 15.0
    lifetime = FIDELITY_TTFT + (FIDELITY_TOKENS - 1) * ITL
    connections, streams = FIDELITY_LOAD
    fidelity_load = {
        "http2": True,
        "connections": connections,
        "streams": streams,
        "duration": duration,
        "warmup": round(lifetime, 1) + 1.0,
        "ramp": round(lifetime, 1),
        "max_tokens": FIDELITY_TOKENS,
        "processes": options.processes,
    }
    low: list[dict[str, Any]] = []
    fidelity: list[dict[str, Any]] = []
    for ttft in sorted({t for t, _ in LOW_LOADS} | {FIDELITY_TTFT}):
        specs = [*(server(name, source, ttft) for name, source in sources), _blaster(ttft)]
        loads = [
            {"connections": n, "duration": low_duration, "warmup": 1.0, "max_tokens": LOW_TOKENS, "processes": 1}
            for t, n in LOW_LOADS
            if t == ttft
        ]
        if ttft == FIDELITY_TTFT:
            fidelity = _run_loads(specs, [fidelity_load], options, ttft)
        low += _run_loads(specs, loads, options, ttft, lean=True)
    return {"fidelity_2000": fidelity, "low_load": low}


def print_tables(latency: dict[str, list[dict[str, Any]]]) -> None:
    print_table(
        f"fidelity at 2,000 HTTP/2 streams (our load generator, TTFT {FIDELITY_TTFT * 1000:g} ms, ITL {ITL * 1000:g}"
        " ms; error % vs configured / vs the paced blaster; goal: medians 5 %, p99 25 %)",
        [
            "server",
            "TTFT p50",
            "err %",
            "vs blaster %",
            "TTFT p99",
            "err %",
            "vs blaster %",
            "ITL p50",
            "err %",
            "ITL p99",
            "err %",
            "vs blaster %",
            "tok/s",
            "errors",
            "srv busy",
            "cli busy",
        ],
        [
            [
                r["server"],
                r["ttft_p50"] * 1000,
                r["ttft_p50_error_percent"],
                r["ttft_p50_vs_blaster_percent"],
                r["ttft_p99"] * 1000,
                r["ttft_p99_error_percent"],
                r["ttft_p99_vs_blaster_percent"],
                r["itl_p50"] * 1000,
                r["itl_p50_error_percent"],
                r["itl_p99"] * 1000,
                r["itl_p99_error_percent"],
                r["itl_p99_vs_blaster_percent"],
                r["tokens_per_second"],
                r["errors"],
                r["server_busy"],
                r["client_busy"],
            ]
            for r in latency["fidelity_2000"]
        ],
    )
    print_table(
        f"low-load bias (HTTP/1.1, {LOW_TOKENS}-token chats, ITL {ITL * 1000:g} ms; medians; goal: TTFT median"
        f" error <= {MEDIAN_GOAL_PERCENT:g} %)",
        [
            "server",
            "load",
            "TTFT cfg ms",
            "measured",
            "TTFT p50 ms",
            "err ms",
            "err %",
            "vs blaster %",
            "ITL p50 ms",
            "err ms",
            "errors",
            "lean TTFT p50",
            "err %",
            "vs blaster %",
        ],
        [
            [
                r["server"],
                r["load"],
                r["ttft_configured"] * 1000,
                r["streams_measured"],
                r["ttft_p50"] * 1000,
                r["ttft_p50_error_ms"],
                r["ttft_p50_error_percent"],
                r["ttft_p50_vs_blaster_percent"],
                r["itl_p50"] * 1000,
                r["itl_p50_error_ms"],
                r["errors"],
                r.get("lean_ttft_p50", math.nan) * 1000,
                r.get("lean_ttft_p50_error_percent", math.nan),
                r.get("lean_ttft_p50_vs_blaster_percent", math.nan),
            ]
            for r in latency["low_load"]
        ],
    )
