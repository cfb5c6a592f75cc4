"""``/metrics`` of a server of several workers (``llmsim serve --workers N``): the sum.

Each worker is a whole simulator in its own process, and the kernel hands a scrape to
any one of them.  So that ``/metrics`` describes the server rather than whichever worker
answered, the wiring (:mod:`llmsim.workers`) gives the answering worker's context a
source of the other workers' latest :class:`WorkerReading` (:func:`share_with_peers`),
and :func:`combine` adds them to its own live reading:

* counters and histograms are summed over every worker, including workers that have
  died (their last reading is kept, so that a restart does not make a total go back);
* ``num_requests_running`` / ``waiting`` are summed over the live workers only;
* ``kv_cache_usage_perc`` is the mean over the live workers (each has a pool of the
  same size, so the mean is the used share of all blocks);
* ``max_lateness`` is the largest.

What stays the answering worker's own: the sleep state, the LoRA series and the fake
metrics (every worker has the same ``--fake-metrics``; they are added once).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from llmsim.api.context import ApiContext
from llmsim.api.metrics.collector import EngineReading
from llmsim.engine.metrics import HistogramSnapshot, MetricsSnapshot
from llmsim.engine.statistics import EngineStatistics

__all__ = ["PeerSource", "WorkerReading", "combine", "peers_of", "share_with_peers"]


@attrs.frozen
class WorkerReading:
    """One worker's numbers, as it last published them; ``live`` is False once it died."""

    statistics: EngineStatistics
    metrics: MetricsSnapshot
    kv_cache_usage: float
    live: bool = True


PeerSource = Callable[[], Sequence[WorkerReading]]

_peers: weakref.WeakKeyDictionary[ApiContext, PeerSource] = weakref.WeakKeyDictionary()

#: Statistics that describe the present (summed over live workers) or a worst case.
_GAUGES = frozenset({"running", "waiting"})
_MAXIMA = frozenset({"max_lateness"})


def share_with_peers(ctx: ApiContext, peers: PeerSource) -> None:
    """From now on ``/metrics`` of ``ctx`` adds what ``peers()`` returns to its own numbers."""
    _peers[ctx] = peers


def peers_of(ctx: ApiContext) -> PeerSource | None:
    return _peers.get(ctx)


def combine(own: EngineReading, peers: Sequence[WorkerReading]) -> EngineReading:
    """``own`` (the answering worker's live reading) plus the other workers'."""
    if not peers:
        return own
    live = [peer for peer in peers if peer.live]
    usages = [own.kv_cache_usage, *(peer.kv_cache_usage for peer in live)]
    return attrs.evolve(
        own,
        statistics=_add_statistics(own.statistics, peers),
        metrics=_add_metrics(own.metrics, [peer.metrics for peer in peers]),
        kv_cache_usage=sum(usages) / len(usages),
    )


def _add_statistics(own: EngineStatistics, peers: Sequence[WorkerReading]) -> EngineStatistics:
    values: dict[str, Any] = {}
    for field in attrs.fields(EngineStatistics):
        name = field.name
        mine = getattr(own, name)
        if name in _MAXIMA:
            values[name] = max([mine, *(getattr(peer.statistics, name) for peer in peers)])
        else:
            counted = [peer for peer in peers if peer.live] if name in _GAUGES else peers
            values[name] = mine + sum(getattr(peer.statistics, name) for peer in counted)
    return EngineStatistics(**values)


def _add_metrics(own: MetricsSnapshot, others: Sequence[MetricsSnapshot]) -> MetricsSnapshot:
    everyone = [own, *others]
    return MetricsSnapshot(
        request_success=_add_counts([m.request_success for m in everyone]),
        admission_rejections=_add_counts([m.admission_rejections for m in everyone]),
        prefix_cache_queries=sum(m.prefix_cache_queries for m in everyone),
        prefix_cache_hits=sum(m.prefix_cache_hits for m in everyone),
        prompt_tokens_cached=sum(m.prompt_tokens_cached for m in everyone),
        prompt_tokens_computed=sum(m.prompt_tokens_computed for m in everyone),
        histograms={name: _add_histograms(own.histograms[name], others, name) for name in own.histograms},
    )


def _add_counts(counts: Sequence[Mapping[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for one in counts:
        for key, value in one.items():
            total[key] = total.get(key, 0) + value
    return total


def _add_histograms(own: HistogramSnapshot, others: Sequence[MetricsSnapshot], name: str) -> HistogramSnapshot:
    """Bucket by bucket; a peer whose buckets differ (it cannot, with one configuration)
    is left out rather than mis-added."""
    counts, total = list(own.counts), own.sum
    for other in others:
        theirs = other.histograms.get(name)
        if theirs is None or theirs.bounds != own.bounds:
            continue
        counts = [a + b for a, b in zip(counts, theirs.counts, strict=True)]
        total += theirs.sum
    return HistogramSnapshot(own.bounds, tuple(counts), total)
