"""``llmsim:injected_faults_total{fault=...}``: the protocol faults the native server
injected (``x-llmsim-fault``, ``--fault``; docs/faults.md), one child per fault, each
counted when the fault first acts on a response.  llmsim's own family, not vLLM's."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from llmsim.api.http import InjectedFaults

__all__ = ["InjectedFaultsCollector"]


class InjectedFaultsCollector:
    """Reads an :class:`~llmsim.api.http.InjectedFaults` at every scrape."""

    def __init__(self, counts: InjectedFaults, created: float) -> None:
        self._counts = counts
        self._created = created

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "llmsim:injected_faults",
            "Number of responses each protocol fault was injected into (x-llmsim-fault, --fault).",
            labels=("fault",),
        )
        for fault, count in self._counts.snapshot().items():
            family.add_metric((fault,), count, created=self._created)
        yield family
