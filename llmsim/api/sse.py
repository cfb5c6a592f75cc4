"""Server-sent events, in the two framings the endpoints use.

* Chat and completions (vLLM's framing): every event is ``data: <json>\\n\\n`` (LF LF:
  ``vllm bench`` splits only on ``"\\n\\n"``), never an ``event:`` line, and the
  stream ends with ``data: [DONE]``; an error after the stream began is
  :func:`error_events`.
* Responses and messages: ``event: <type>\\ndata: <json>\\n\\n``
  (:func:`event_bytes`), no ``[DONE]``.

Streams are rendered from pre-built byte templates: per token only the JSON-escaped
text is inserted, and escaping is cached per distinct piece, so no token costs a
``json.dumps``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import orjson

from llmsim.api.errors import ApiError
from llmsim.api.http import VERSION_HEADER

__all__ = [
    "DONE_EVENT",
    "SSE_HEADERS",
    "PlainTokens",
    "chunk_head",
    "error_events",
    "escape",
    "escape_all",
    "escape_cache",
    "escape_uncached",
    "escaped_piece",
    "event_bytes",
    "fingerprint_field",
    "json_bytes",
    "usage_events",
]

SSE_HEADERS: tuple[tuple[bytes, bytes], ...] = ((b"content-type", b"text/event-stream; charset=utf-8"), VERSION_HEADER)
DONE_EVENT = b"data: [DONE]\n\n"


class PlainTokens(NamedTuple):
    """How a stream renders a token in the middle of a choice when every such token is one
    event around its escaped text: ``opens[choice index] + escape(piece) + close``.  A
    renderer that says so lets the sink build those events itself, the per-token path
    (``StreamingSink.on_output``).  (A named tuple: made once per streaming request,
    for a fraction of a frozen attrs class's cost.)"""

    opens: Sequence[bytes]
    close: bytes


_CACHE_LIMIT = 8192  # distinct pieces kept; the cache is dropped whole when full
_CACHED_LENGTH = 64  # longer texts (echoed prompts) are escaped each time, never cached
_escaped: dict[str, bytes] = {}
#: ``escaped_piece(text)``: :func:`escape`'s cached result for ``text``, or None (then
#: call :func:`escape`): one C call on the per-token path instead of a Python one.
escaped_piece = _escaped.get
#: The cache itself, for the sink's C twin (native/sink.c), which looks pieces up in it directly.
escape_cache = _escaped


def escape(text: str) -> bytes:
    """``text`` as it sits between the quotes of a JSON string (UTF-8, escaped like
    pydantic/orjson: ``\\"``, ``\\\\``, ``\\n``, ``\\u001f``...).  Cached per piece."""
    cached = _escaped.get(text)
    if cached is not None:
        return cached
    escaped = orjson.dumps(text)[1:-1]
    if len(text) <= _CACHED_LENGTH:
        if len(_escaped) >= _CACHE_LIMIT:
            _escaped.clear()
        _escaped[text] = escaped
    return escaped


def escape_all(pieces: Iterable[str]) -> list[bytes]:
    """``[escape(piece) for piece in pieces]``, a cached piece without a Python call (a
    chunk of several tokens: the renderers' path when a step hands out more than one)."""
    cached = _escaped.get
    return [cached(piece) or escape(piece) for piece in pieces]  # b"" (an EOS) is cached too: escape() again


def escape_uncached(text: str) -> bytes:
    """Like :func:`escape`, for one-off texts that must not crowd the piece cache."""
    return orjson.dumps(text)[1:-1]


def json_bytes(value: object) -> bytes:
    """Compact JSON, as pydantic's ``model_dump_json`` writes it."""
    return orjson.dumps(value)


def chunk_head(response_id: str, kind: bytes, created: int, model: str) -> bytes:
    """``data: {"id":…,"object":<kind>,"created":…,"model":…,``: the prefix every chunk
    of one OpenAI stream shares (``kind`` is the JSON-quoted object name)."""
    return b'data: {"id":' + orjson.dumps(response_id) + _head_rest(kind, created, model)


@functools.lru_cache(maxsize=64)  # the requests of one second share it (one entry per kind and model)
def _head_rest(kind: bytes, created: int, model: str) -> bytes:
    """The part of :func:`chunk_head` after the id, made once per second and model."""
    return b',"object":%b,"created":%d,"model":%b,' % (kind, created, orjson.dumps(model))


@functools.lru_cache(maxsize=16)  # one fingerprint per server
def fingerprint_field(fingerprint: str | None) -> bytes:
    """``,"system_fingerprint":…``: the key a chat or completions stream puts on its
    usage chunk, or else on each choice's finishing chunk (empty without one)."""
    return b"" if fingerprint is None else b',"system_fingerprint":' + json_bytes(fingerprint)


def usage_events(head: bytes, usage: dict[str, object], fingerprint: bytes) -> bytes:
    """The end of a chat or completions stream with ``stream_options.include_usage``:
    the ``"choices":[]`` chunk with ``usage``, ``head`` (:func:`chunk_head`) first and
    ``fingerprint`` (:func:`fingerprint_field`) last, then ``[DONE]``."""
    return head + b'"choices":[],"usage":' + json_bytes(usage) + fingerprint + b"}\n\n" + DONE_EVENT


def error_events(error: ApiError, *, compact: bool = False) -> bytes:
    """The end of a stream that failed after it began: vLLM's in-band error event and
    ``[DONE]``.  Completions writes it with ``json.dumps`` (``", "`` and ``": "``
    separators, ``\\u`` escapes; vllm/entrypoints/openai/completion/serving.py:554-558),
    unlike the chunks; chat (``compact``) yields the ``ErrorResponse`` itself, dumped with
    ``model_dump_json`` like its chunks (chat_completion/serving.py:496-497,951-953)."""
    body = orjson.dumps({"error": error.as_dict()}) if compact else json.dumps({"error": error.as_dict()}).encode()
    return b"data: " + body + b"\n\n" + DONE_EVENT


def event_bytes(event_type: str, data: bytes) -> bytes:
    """One ``event: <type>\\ndata: <json>\\n\\n`` frame (LF LF, as vLLM frames them)."""
    return b"event: " + event_type.encode() + b"\ndata: " + data + b"\n\n"
