"""PNG plots of the scenario results (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import matplotlib.ticker

__all__ = ["ceiling", "fidelity", "memory", "metrics", "paced_cost", "soak_rss", "throughput"]

_MS_TICKS = (0, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)


def throughput(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Grouped bars per load: tokens/s and CPU per token, each bar labelled with its ratio."""
    loads = list(dict.fromkeys(r["load"] for r in rows))
    servers = list(dict.fromkeys(r["server"] for r in rows))
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(9, 8))
    width = 0.8 / len(servers)
    for index, server in enumerate(servers):
        mine = {r["load"]: r for r in rows if r["server"] == server}
        xs = [i + (index - (len(servers) - 1) / 2) * width for i in range(len(loads))]
        tokens = [mine[load]["tokens_per_second"] if load in mine else 0 for load in loads]
        cpu = [mine[load]["cpu_seconds_per_million_tokens"] if load in mine else 0 for load in loads]
        bars = top.bar(xs, tokens, width, label=server)
        _label(top, bars, [mine.get(load, {}).get("throughput_ratio", math.nan) for load in loads])
        bars = bottom.bar(xs, cpu, width, label=server)
        _label(bottom, bars, [mine.get(load, {}).get("cpu_efficiency_ratio", math.nan) for load in loads])
    for axis, title in (
        (top, "streamed tokens/s (label: x baseline)"),
        (bottom, "server CPU s per million tokens (label: baseline / this)"),
    ):
        axis.set_xticks(range(len(loads)), loads)
        axis.set_title(title)
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def fidelity(rows: Sequence[dict[str, Any]], ttft: float, itl: float, path: Path) -> None:
    """Measured TTFT and ITL p50/p99 per concurrency and server, against the configured value.

    Symmetric-log scale: overload shows as seconds, while 0 (events that arrived in one
    read) stays on the chart.
    """
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    servers = list(dict.fromkeys(r["server"] for r in rows))
    levels = sorted({r["concurrency"] for r in rows})
    for axis, metric, configured in ((axes[0], "ttft", ttft), (axes[1], "itl", itl)):
        for server, color in zip(servers, ("tab:blue", "tab:gray", "tab:orange"), strict=False):
            mine = sorted((r for r in rows if r["server"] == server), key=lambda r: r["concurrency"])
            xs = [levels.index(r["concurrency"]) for r in mine]
            for quantile, style in (("p50", "-o"), ("p99", "--^")):
                values = [_ms(r[f"{metric}_{quantile}"]) for r in mine]
                axis.plot(xs, values, style, color=color, label=f"{server} {quantile}")
        axis.axhline(configured * 1000, color="black", linewidth=1, label="configured")
        axis.axhspan(configured * 1000 * 0.95, configured * 1000 * 1.05, color="green", alpha=0.2, label="±5 %")
        axis.set_yscale("symlog", linthresh=10)
        low, high = axis.get_ylim()
        axis.set_yticks([t for t in _MS_TICKS if low <= t <= high])
        axis.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        axis.set_xticks(range(len(levels)), [f"{level:,}" for level in levels])
        axis.set_xlabel("concurrent HTTP/2 streams")
        axis.set_ylabel("ms (symlog; missing point: no stream finished)")
        axis.set_title(f"{metric.upper()} as the client measured it")
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def memory(rows: Sequence[dict[str, Any]], path: Path) -> None:
    figure, axis = plt.subplots(figsize=(6, 4))
    labels = [f"{r['streams']:,}" for r in rows]
    bars = axis.bar(labels, [r["bytes_per_stream"] / 1024 for r in rows])
    axis.bar_label(bars, [f"{r['bytes_per_stream'] / 1024:.1f} KiB" for r in rows])
    axis.axhline(20_000 / 1024, color="black", linestyle="--", label="target 20 KB (19.5 KiB)")
    axis.set_xlabel("in-flight streams")
    axis.set_ylabel("server RSS per stream (KiB)")
    axis.set_title("memory per in-flight stream (llmsim native)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def ceiling(rows: Sequence[dict[str, Any]], path: Path) -> None:
    figure, axis = plt.subplots(figsize=(7, 4))
    labels = [f"{r['load']}\n{r['processes']} proc" for r in rows]
    bars = axis.bar(labels, [r["events_per_second"] for r in rows])
    axis.bar_label(bars, [f"busy {r['client_busy']:.2f}" for r in rows])
    axis.set_ylabel("SSE events/s consumed")
    axis.set_title("load generator ceiling (against the blaster)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def metrics(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Per round: mean TTFT and ITL as the client measured them and as /metrics reports
    them, and tokens/s, each with and without a scraper (hatched bars: scraping)."""
    figure, axes = plt.subplots(1, 3, figsize=(13, 4.5))
    labels = [f"r{r['round']}{' scrape' if r['scraping'] else ''}" for r in rows]
    xs = range(len(rows))
    for axis, metric, title in ((axes[0], "ttft", "TTFT mean (ms)"), (axes[1], "itl", "ITL mean (ms)")):
        client = [_ms(r[f"{metric}_client_mean"]) for r in rows]
        server = [_ms(r[f"{metric}_metrics_mean"]) for r in rows]
        axis.bar([x - 0.2 for x in xs], client, 0.4, label="client")
        axis.bar([x + 0.2 for x in xs], server, 0.4, label="/metrics histogram")
        axis.set_title(title)
        axis.set_xticks(list(xs), labels, rotation=45, ha="right")
        axis.legend()
    bars = axes[2].bar(list(xs), [r["tokens_per_second"] for r in rows], 0.6)
    for bar, row in zip(bars, rows, strict=True):
        if row["scraping"]:
            bar.set_hatch("//")
    axes[2].set_title("tokens/s (hatched: /metrics scraped 1/s)")
    axes[2].set_xticks(list(xs), labels, rotation=45, ha="right")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _label(axis: Any, bars: Any, ratios: Sequence[float]) -> None:
    axis.bar_label(bars, ["" if math.isnan(r) else f"{r:.1f}x" for r in ratios], fontsize=8)


def _ms(seconds: float | None) -> float:
    return math.nan if seconds is None else seconds * 1000


def soak_rss(curve: list[tuple[float, int]], flat: bool, path: Path) -> None:
    """The soak scenario's RSS curve (seconds, bytes), titled with its verdict."""
    figure, axis = plt.subplots(figsize=(9, 4))
    axis.plot([t for t, _ in curve], [rss / 2**20 for _, rss in curve], marker=".")
    axis.set_xlabel("seconds")
    axis.set_ylabel("server RSS (MiB)")
    axis.set_ylim(bottom=0)
    axis.set_title(f"llmsim native under a steady HTTP/2 load: RSS {'levels off' if flat else 'keeps growing'}")
    axis.grid(True, alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def paced_cost(payload: dict[str, Any], path: Path) -> None:
    """The paced_cost scenario: server µs per token by load (bars per server, goal lines),
    and the latency errors against the configuration (fidelity at 2,000 streams, low load)."""
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    rows = [r for r in payload["cost"] if r["max_tokens"] == min(payload["configured"]["max_tokens"])]
    loads = list(dict.fromkeys(r["load"] for r in rows))
    servers = list(dict.fromkeys(r["server"] for r in rows))
    width = 0.8 / len(servers)
    for index, server in enumerate(servers):
        mine = {r["load"]: r for r in rows if r["server"] == server}
        present = [i for i, load in enumerate(loads) if load in mine]  # (the floor runs at HTTP/1.1 only)
        xs = [i + (index - (len(servers) - 1) / 2) * width for i in present]
        values = [mine[loads[i]]["us_per_token"] for i in present]
        bars = left.bar(xs, values, width, label=server)
        left.bar_label(bars, [f"{value:.1f}" for value in values], fontsize=8)
    for load_index, load in enumerate(loads):
        goal = payload["goals"]["us_per_token_http2" if load.startswith("h2") else "us_per_token_http1"]
        left.hlines(goal, load_index - 0.45, load_index + 0.45, colors="black", linestyles="--")
    left.set_xticks(range(len(loads)), loads)
    left.set_ylabel("server CPU µs per token (user + sys)")
    left.set_title("paced tokens (dashed: goal)")
    left.legend(fontsize=8)
    latency = [*payload.get("fidelity_2000", []), *payload.get("low_load", [])]
    labels = [f"{r['server']}\n{r['load']} {r['ttft_configured'] * 1000:g}ms" for r in latency]
    xs = list(range(len(latency)))
    for offset, key, name in (
        (-0.3, "ttft_p50", "TTFT p50"),
        (-0.1, "ttft_p99", "TTFT p99"),
        (0.1, "itl_p50", "ITL p50"),
        (0.3, "itl_p99", "ITL p99"),
    ):
        values = [r[f"{key}_error_percent"] for r in latency]
        right.bar([x + offset for x in xs], [0 if v is None else v for v in values], 0.2, label=name)
    right.axhline(0, color="black", linewidth=1)
    right.set_yscale("symlog", linthresh=1)
    right.set_xticks(xs, labels, rotation=60, ha="right", fontsize=7)
    right.set_ylabel("error vs configured, % (symlog)")
    right.set_title("latency error: 2,000 HTTP/2 streams, then low load (HTTP/1.1)")
    right.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
