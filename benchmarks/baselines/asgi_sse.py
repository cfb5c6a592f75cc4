"""The simplest thing a user could write instead of llmsim: a bare ASGI SSE app.

No framework, no engine: every POST is answered with 200 ``text/event-stream`` and
``max_tokens`` chat.completion.chunk events (plus the role, finish and usage chunks and
``[DONE]``, the same sequence as vLLM), ``json.dumps`` per chunk and one ``send`` per
event, served by hypercorn's trio worker.  It sleeps nowhere: this is the zero-latency
throughput a naive Python server reaches, the yardstick for llmsim's own.

    python -m benchmarks.baselines.asgi_sse --port 8001
"""

from __future__ import annotations

import argparse
import json
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

__all__ = ["app", "main"]

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

WORDS = (" the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog", ".")
HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
    elif scope["type"] == "http":
        await _chat(receive, send)


async def _lifespan(receive: Receive, send: Send) -> None:
    # hypercorn's trio worker needs the lifespan protocol answered (returning crashes it).
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _chat(receive: Receive, send: Send) -> None:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    request = json.loads(body or b"{}")
    tokens = int(request.get("max_tokens") or 16)
    chunk = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": request.get("model", "baseline"),
    }

    async def event(payload: Any) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        await send({"type": "http.response.body", "body": f"data: {data}\n\n".encode(), "more_body": True})

    def choice(delta: dict[str, str], finish: str | None = None) -> dict[str, Any]:
        return {**chunk, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await event(choice({"role": "assistant", "content": ""}))
    for i in range(tokens):
        await event(choice({"content": WORDS[i % len(WORDS)]}))
    await event(choice({}, "length"))
    if (request.get("stream_options") or {}).get("include_usage"):
        usage = {"prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": tokens + 1}
        await event({**chunk, "choices": [], "usage": usage})
    await event("[DONE]")
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _serve(port: int) -> None:
    config = HypercornConfig()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    config.errorlog = None
    config.h2_max_concurrent_streams = 1000
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(serve, app, config)
            print(f"listening on {binds[0]}", flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="port on 127.0.0.1 (0: any free port)")
    trio.run(_serve, parser.parse_args().port)


if __name__ == "__main__":
    main()
