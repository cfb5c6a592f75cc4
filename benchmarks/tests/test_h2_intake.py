"""The HTTP/2 intake driver runs, serves every request, and repeats itself exactly."""

from __future__ import annotations

from benchmarks.h2_intake import BODY, client_reads, run_once


def test_the_client_bytes_are_h2loads_requests_in_batches() -> None:
    reads = client_reads(250)
    assert [len(read) for read in reads[1:]] == [100 * (9 + 27 + 9 + len(BODY)), 50 * (9 + 27 + 9 + len(BODY))]


def test_every_request_is_served_and_the_output_repeats() -> None:
    first, second = run_once(150), run_once(150)
    assert first.digest == second.digest
    assert 0 < first.receive < first.total and 0 < first.output < first.total
