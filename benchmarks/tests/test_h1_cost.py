"""The HTTP/1.1 cost driver serves what it claims to (its counts are only worth that)."""

from __future__ import annotations

from benchmarks import h1_cost
from llmsim.protocol.native.http1_fastpath import chunked_head


async def test_the_driver_sends_every_head_chunk_and_end() -> None:
    head = chunked_head(200, h1_cost.SSE_HEADERS)
    assert head is not None and len(h1_cost.BODY) == 154 and len(h1_cost.CHUNK) == 230
    per_request = len(head) + 3 * len(b"e6\r\n" + h1_cost.CHUNK + b"\r\n") + len(b"0\r\n\r\n")
    assert h1_cost.serve(2, 3) == 2 * per_request
