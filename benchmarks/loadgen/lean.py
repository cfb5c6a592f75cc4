"""The leanest client there is, for the low-load bias: blocking sockets, no event loop.

The load generator (:mod:`benchmarks.loadgen.runner`) is a trio program that parses
every SSE event; at one stream it adds about 2.5 ms to each TTFT it measures (its own
scheduling and parsing on a shared machine), five times the 1 % the low-load goal
allows at TTFT 50 ms.  A user's lean client (``curl``, a few lines of ``socket``) adds
almost nothing, and the issue's low-load figure is what such a client measures.  Here
each stream is a process of its own (threads of one process wait for each other's GIL
when their reads return together, and in the benchmark's own process for its sampler
thread too: about 1.8 ms at the median, measured) with one keep-alive HTTP/1.1
connection that sends a streaming chat, stamps the time of ``sendall`` and of the first
``recv`` that completes an event with non-empty ``content``, reads the rest of the
response, and repeats: nothing but the kernel and one regular-expression search per
read between the two stamps.

    python benchmarks/loadgen/lean.py PORT MODEL WARMUP DURATION MAX_TOKENS   # one stream: its TTFTs as JSON
"""

from __future__ import annotations

import json
import re
import socket
import statistics
import subprocess
import sys
import time

import attrs

__all__ = ["LeanResult", "lean_ttfts", "stream_ttfts"]

#: An SSE event whose ``content`` is not empty: a token (the role chunk's is "").
_CONTENT = re.compile(rb'"content": ?"[^"]')
#: The end of a chunked response without trailers.
_LAST_CHUNK = b"\r\n0\r\n\r\n"


@attrs.frozen
class LeanResult:
    """Every TTFT (seconds) measured after the warm-up, over all streams."""

    ttfts: tuple[float, ...]

    @property
    def p50(self) -> float:
        return statistics.median(self.ttfts) if self.ttfts else float("nan")


def lean_ttfts(
    port: int, *, model: str, streams: int, duration: float, max_tokens: int, warmup: float = 1.0
) -> LeanResult:
    """Run ``streams`` lean streams, one process each, against ``127.0.0.1:port`` for
    ``warmup + duration`` seconds; the TTFTs of the requests sent after the warm-up."""
    argv = [sys.executable, "-P", __file__, str(port), model, repr(warmup), repr(duration), str(max_tokens)]
    workers = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(streams)
    ]
    ttfts: list[float] = []
    failures = []
    for worker in workers:
        out, err = worker.communicate(timeout=warmup + duration + 60)
        if worker.returncode:
            failures.append(err.strip().splitlines()[-1] if err.strip() else f"exit status {worker.returncode}")
        else:
            ttfts += json.loads(out)
    if failures:
        raise RuntimeError(f"lean client on port {port}: {failures[0]}")
    return LeanResult(tuple(ttfts))


def stream_ttfts(port: int, *, model: str, warmup: float, duration: float, max_tokens: int) -> list[float]:
    """One lean stream (this process): the TTFTs of the requests sent after ``warmup``."""
    request = _request(model, max_tokens)
    start = time.perf_counter()
    measured_from, end = start + warmup, start + warmup + duration
    ttfts = []
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while (sent := time.perf_counter()) < end:
            first = _one_response(sock, request)
            if sent >= measured_from:
                ttfts.append(first - sent)
    return ttfts


def _request(model: str, max_tokens: int) -> bytes:
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens,
            "stream": True,
            "ignore_eos": True,
        }
    ).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _one_response(sock: socket.socket, request: bytes) -> float:
    """Send ``request``, read its whole response; when its first token arrived."""
    sock.sendall(request)
    received = b""
    first = 0.0
    while not received.endswith(_LAST_CHUNK):
        data = sock.recv(1 << 16)
        if not data:
            raise ConnectionError("the server closed the connection mid-response")
        received += data
        if not first and _CONTENT.search(received):
            first = time.perf_counter()
    if not first:
        raise ValueError(f"a response without a token: {received[-200:]!r}")
    return first


if __name__ == "__main__":
    port, model, warmup, duration, max_tokens = sys.argv[1:6]
    ttfts = stream_ttfts(
        int(port), model=model, warmup=float(warmup), duration=float(duration), max_tokens=int(max_tokens)
    )
    print(json.dumps(ttfts))
