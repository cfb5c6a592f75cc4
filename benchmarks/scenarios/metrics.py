"""Metrics: does /metrics agree with the clients, and does scraping it cost the streams?

The fidelity scenario's server (TTFT 100 ms, ITL 20 ms, 100-token streaming chat) serves 200 concurrent
HTTP/2 streams, in interleaved rounds: without a scraper, then with one that GETs
``/metrics`` every second, as AIPerf and Prometheus do.  Per round, ``/metrics`` is
read before and after the load and the difference is compared with what the client
measured:

* the histogram means (``_sum / _count``) of ``vllm:time_to_first_token_seconds`` and
  ``vllm:inter_token_latency_seconds`` against the client's mean TTFT and ITL;
* the histograms' medians, interpolated inside the buckets as Prometheus's
  ``histogram_quantile`` does, against the client's medians.  vLLM's default buckets are
  too coarse for that (ITL's around 20 ms is 10-25 ms), so the server runs with vLLM's
  ``--custom-histogram-buckets`` set to 1 ms (TTFT) and 0.25 ms (ITL) buckets around the
  configured values, as a vLLM user who wants medians would;
* tokens/s, TTFT and ITL with and without the scraper.

The server's histograms count every request of the round, the client only those that
started after its warm-up and ended before its stop: in a steady load both see the
same distribution.
"""

from __future__ import annotations

import json
import statistics
import threading
import urllib.request
from contextlib import ExitStack
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from benchmarks import plots
from benchmarks.loadgen.runner import LoadSpec
from benchmarks.report import environment, percent_error, print_table, ratio, write_json
from benchmarks.scenarios import Options
from benchmarks.scenarios.fidelity import ITL, MAX_TOKENS, SERVER, STREAM_SECONDS, TTFT
from benchmarks.scenarios.measure import measure
from benchmarks.servers import MODEL, RunningServer, ServerSpec, running

__all__ = ["run"]

CONNECTIONS, STREAMS = 10, 20  # 200 concurrent streams
SCRAPE_INTERVAL = 1.0
#: vLLM's --custom-histogram-buckets: 1 ms TTFT buckets and 0.25 ms ITL buckets around the
#: configured values, so that the histograms' medians can be read to about 1 %.
FINE_BUCKETS = {
    "time_to_first_token": [round(0.080 + i * 0.001, 4) for i in range(61)],
    "inter_token_latency": [round(0.015 + i * 0.00025, 5) for i in range(61)],
}
METRICS_SERVER = ServerSpec(
    "llmsim-native-metrics", (*SERVER.argv, "--custom-histogram-buckets", json.dumps(FINE_BUCKETS))
)
HISTOGRAMS = ("time_to_first_token_seconds", "inter_token_latency_seconds")


def _scrape(port: int) -> dict[str, dict[str, float]]:
    """Every histogram's cumulative buckets (by ``le``), ``_sum`` and ``_count``, plus
    the generation-token counter, from one GET /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removeprefix("vllm:")
            for histogram in HISTOGRAMS:
                if name == f"{histogram}_bucket":
                    found.setdefault(histogram, {})[sample.labels["le"]] = sample.value
                elif name in (f"{histogram}_sum", f"{histogram}_count"):
                    found.setdefault(histogram, {})[name.removeprefix(histogram)] = sample.value
            if name == "generation_tokens_total":
                found["generation_tokens"] = {"total": sample.value}
    return found


def _delta(after: dict[str, dict[str, float]], before: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    return {
        name: {key: value - before[name].get(key, 0.0) for key, value in values.items()}
        for name, values in after.items()
    }


def histogram_quantile(quantile: float, buckets: dict[str, float]) -> float:
    """Prometheus's ``histogram_quantile``: linear interpolation inside the bucket that
    holds the quantile's rank (the lowest bucket starts at 0)."""
    bounds = sorted((float(le), count) for le, count in buckets.items() if le != "+Inf")
    total = buckets["+Inf"]
    if total <= 0:
        return float("nan")
    rank = quantile * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in bounds:
        if count >= rank:
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / max(count - lower_count, 1e-12)
        lower_bound, lower_count = bound, count
    return bounds[-1][0]


class _Scraper:
    """GETs /metrics every :data:`SCRAPE_INTERVAL` seconds on a thread until stopped."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.scrapes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(SCRAPE_INTERVAL):
            _scrape(self.port)
            self.scrapes += 1


def _round(server: RunningServer, options: Options, scraping: bool) -> dict[str, Any]:
    duration = 6.0 if options.quick else 12.0
    spec = LoadSpec(
        port=server.port,
        http2=True,
        connections=CONNECTIONS,
        streams=STREAMS,
        duration=duration,
        warmup=round(STREAM_SECONDS, 1) + 1.0,
        ramp=round(STREAM_SECONDS, 1),
        max_tokens=MAX_TOKENS,
        model=MODEL,
        processes=options.processes,
    )
    before = _scrape(server.port)
    with ExitStack() as stack:
        scraper = stack.enter_context(_Scraper(server.port)) if scraping else None
        result = measure(server, spec)
    server_side = _delta(_scrape(server.port), before)
    s = result.summary
    row: dict[str, Any] = {
        "scraping": scraping,
        "scrapes": scraper.scrapes if scraper else 0,
        "tokens_per_second": s.tokens_per_second,
        "errors": s.errors,
        "server_busy": result.server_busy,
    }
    for metric, client, histogram in (("ttft", s.ttft, HISTOGRAMS[0]), ("itl", s.itl, HISTOGRAMS[1])):
        values = server_side[histogram]
        server_mean = values["_sum"] / values["_count"] if values["_count"] else float("nan")
        server_p50 = histogram_quantile(0.5, {k: v for k, v in values.items() if not k.startswith("_")})
        row |= {
            f"{metric}_client_p50": client.p50,
            f"{metric}_client_mean": client.mean,
            f"{metric}_metrics_mean": server_mean,
            f"{metric}_metrics_p50": server_p50,
            f"{metric}_mean_error_percent": percent_error(server_mean, client.mean),
            f"{metric}_p50_error_percent": percent_error(server_p50, client.p50),
            f"{metric}_samples": values["_count"],
        }
    return row


def run(options: Options) -> dict[str, Any]:
    rounds = 2 if options.quick else 4
    rows: list[dict[str, Any]] = []
    with running(METRICS_SERVER, options.log_dir) as server:
        for index in range(rounds):
            for scraping in (False, True) if index % 2 == 0 else (True, False):
                rows.append({"round": index, **_round(server, options, scraping)})
    summary = _summary(rows)
    payload = {
        "scenario": "metrics",
        "environment": environment(),
        "configured": {"ttft_seconds": TTFT, "itl_seconds": ITL, "max_tokens": MAX_TOKENS},
        "concurrency": CONNECTIONS * STREAMS,
        "scrape_interval_seconds": SCRAPE_INTERVAL,
        "summary": summary,
        "rounds": rows,
    }
    print_table(
        f"/metrics against the client ({CONNECTIONS * STREAMS} HTTP/2 streams, TTFT {TTFT * 1000:g} ms, "
        f"ITL {ITL * 1000:g} ms; per round)",
        ("round", "scrape", "tok/s", "TTFT cli mean", "TTFT /metrics mean", "err %", "ITL cli mean",
         "ITL /metrics mean", "err %", "TTFT p50 cli", "hist p50", "ITL p50 cli", "hist p50", "errors"),
        [
            (r["round"], "1/s" if r["scraping"] else "-", r["tokens_per_second"], r["ttft_client_mean"],
             r["ttft_metrics_mean"], r["ttft_mean_error_percent"], r["itl_client_mean"], r["itl_metrics_mean"],
             r["itl_mean_error_percent"], r["ttft_client_p50"], r["ttft_metrics_p50"], r["itl_client_p50"],
             r["itl_metrics_p50"], r["errors"])
            for r in rows
        ],
    )  # fmt: skip
    print_table(
        "scraping /metrics every second: medians over rounds, with / without",
        ("tok/s ratio", "TTFT p50 ratio", "ITL p50 ratio"),
        [(summary["throughput_ratio"], summary["ttft_p50_ratio"], summary["itl_p50_ratio"])],
    )
    write_json(options.results_dir, "metrics", payload)
    plots.metrics(rows, options.results_dir / "metrics.png")
    return payload


def _summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    def median(key: str, scraping: bool) -> float:
        return statistics.median(r[key] for r in rows if r["scraping"] is scraping)

    return {
        "throughput_ratio": ratio(median("tokens_per_second", True), median("tokens_per_second", False)),
        "ttft_p50_ratio": ratio(median("ttft_client_p50", True), median("ttft_client_p50", False)),
        "itl_p50_ratio": ratio(median("itl_client_p50", True), median("itl_client_p50", False)),
        "ttft_mean_error_percent_max": max(abs(r["ttft_mean_error_percent"]) for r in rows),
        "itl_mean_error_percent_max": max(abs(r["itl_mean_error_percent"]) for r in rows),
    }
