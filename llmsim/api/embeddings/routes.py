"""POST /v1/embeddings: vLLM 0.33's OpenAI embeddings endpoint
(vllm/entrypoints/pooling/embed/api_router.py:28-43, serving.py:65-153).

The simulated model serves embeddings beside generation, as llm-d-inference-sim's does
(a generative vLLM model answers 501 "The model does not support Embeddings API",
api_router.py:21-25).  Its embedding size is ``--default-embedding-dimensions``, and it
is Matryoshka: ``dimensions`` may ask for any length from 1 to that size.

The answer is computed at once: no engine job, no queueing, no simulated latency, and
no metrics, as llm-d-inference-sim does (vLLM runs pooling requests through its engine,
so its queue and prompt-token metrics would count them).  The checks come in vLLM's
order: the body (pydantic), ``truncate_prompt_tokens`` (base/serving.py:241-252), an
empty prompt list (:87-88), each prompt's length as it is rendered, ``dimensions`` as
the pooling parameters are verified (:159, pooling_params.py:229-258), then each
prompt as the engine takes it: empty, or a token id out of vocabulary
(vllm/v1/engine/input_processor.py:557-566, 645-647).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import orjson

from llmsim.api.context import ApiContext, Call
from llmsim.api.embeddings.request import EmbeddingInput, EmbeddingRequest, parse_embedding_request, unsupported_dtype
from llmsim.api.errors import JSON_HEADERS, ApiError, validation_error
from llmsim.api.generation import RequestIdentity
from llmsim.api.prompts import check_prompt_length
from llmsim.api.router import Router
from llmsim.model.embeddings import EMBED_DTYPES, embedding, encode_base64, pack
from llmsim.options import ModelOptions

__all__ = ["embeddings", "register"]

_OCTET_STREAM = ((b"content-type", b"application/octet-stream"),)


async def embeddings(call: Call) -> None:
    ctx = call.ctx
    request = parse_embedding_request(call.json())
    max_model_len = ctx.model.max_model_len
    truncate = request.truncate_prompt_tokens
    if truncate is not None and truncate > max_model_len:
        message = (
            "truncate_prompt_tokens value is greater than max_model_len. Please request a smaller truncation size."
        )
        raise ApiError(400, message)
    if not request.prompts:
        raise ApiError(400, "You must pass at least one prompt")
    prompts = [_prompt_ids(ctx, prompt, request) for prompt in request.prompts]
    dimensions = checked_dimensions(ctx.model, request.dimensions)
    for token_ids in prompts:
        _check_engine_input(token_ids, ctx.tokenizer.vocab_size)
    if request.encoding_format != "float" and request.embed_dtype not in EMBED_DTYPES:
        raise unsupported_dtype(request.embed_dtype)
    vectors = [embedding(token_ids, dimensions, normalize=request.normalize) for token_ids in prompts]
    identity = RequestIdentity.of(call, "embd-", request.request_id)
    prompt_tokens = sum(len(token_ids) for token_ids in prompts)
    head = {
        "id": identity.response_id,
        "object": "list",
        "created": int(ctx.wall_clock()),
        "model": ctx.model.display_model,
    }
    if request.encoding_format in ("bytes", "bytes_only"):
        body, metadata = _bytes_body(request, vectors, head, prompt_tokens)
        headers = _OCTET_STREAM if metadata is None else (*_OCTET_STREAM, (b"metadata", metadata))
        call.respond(200, body, (*headers, *identity.headers))
        return
    call.respond(200, _json_body(request, vectors, head, prompt_tokens), (*JSON_HEADERS, *identity.headers))


def _prompt_ids(ctx: ApiContext, prompt: EmbeddingInput, request: EmbeddingRequest) -> list[int]:
    """One prompt's token ids, truncated as asked, then checked against the context
    window (``TokenizeParams``, vllm/renderers/params.py:497-551)."""
    is_text = isinstance(prompt, str)
    token_ids = (
        ctx.tokenizer.encode(prompt, add_special_tokens=request.add_special_tokens)
        if isinstance(prompt, str)
        else list(prompt)
    )
    token_ids = truncated(token_ids, request.truncate_prompt_tokens, request.truncation_side, ctx.model.max_model_len)
    check_prompt_length(ctx.model.max_model_len, len(token_ids), prompt_is_text=is_text)
    return token_ids


def truncated(token_ids: list[int], truncate: int | None, side: str | None, max_model_len: int) -> list[int]:
    """``truncate_prompt_tokens``: keep at most that many tokens (-1: the context
    window, as pooling keeps the full window, params.py:238-257), the first ones unless
    ``truncation_side`` is ``left`` (a tokenizer's default side is ``right``)."""
    if truncate is None:
        return token_ids
    keep = max_model_len if truncate < 0 else truncate
    if keep >= len(token_ids):
        return token_ids
    if keep == 0:
        return []
    return token_ids[-keep:] if side == "left" else token_ids[:keep]


def checked_dimensions(model: ModelOptions, requested: int | None) -> int:
    """The vector length: the model's size, or ``dimensions`` within [1, size]
    (vllm/pooling_params.py:233-251; the simulated model is Matryoshka, with no list
    of preferred sizes)."""
    size = model.default_embedding_dimensions
    if requested is None:
        return size
    if not 1 <= requested <= size:
        message = f"Model {model.display_model!r} only supports dimensions in range [1, {size}], got {requested}."
        raise validation_error(message)
    return requested


def _check_engine_input(token_ids: Sequence[int], vocab_size: int) -> None:
    """What vLLM's engine refuses as it takes a prompt: no tokens at all, then the
    smallest and the largest id out of vocabulary (vllm/renderers/base.py:453-490)."""
    if not token_ids:
        raise validation_error("The decoder prompt cannot be empty")
    lowest, highest = min(token_ids), max(token_ids)
    if lowest < 0:
        raise validation_error(f"Token id {lowest} is out of vocabulary")
    if highest >= vocab_size:
        raise validation_error(f"Token id {highest} is out of vocabulary")


def _usage(prompt_tokens: int) -> dict[str, object]:
    """vLLM's ``UsageInfo`` dumped whole (pooling/utils.py:147-157; protocol.py:135-140)."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def _json_body(
    request: EmbeddingRequest, vectors: list[list[float]], head: dict[str, object], prompt_tokens: int
) -> bytes:
    """``EmbeddingResponse`` in its field order (embed/protocol.py:174-186), dumped by
    orjson as vLLM's ``create_json_response`` does (serve/utils/api_utils.py:26-50)."""
    data: list[dict[str, object]]
    if request.encoding_format == "base64":
        dtype, little = request.embed_dtype, request.little_endian
        data = [
            {"index": index, "object": "embedding", "embedding": encode_base64(vector, dtype, little_endian=little)}
            for index, vector in enumerate(vectors)
        ]
    else:
        data = [{"index": index, "object": "embedding", "embedding": vector} for index, vector in enumerate(vectors)]
    return orjson.dumps({**head, "data": data, "usage": _usage(prompt_tokens)})


def _bytes_body(
    request: EmbeddingRequest, vectors: list[list[float]], head: dict[str, object], prompt_tokens: int
) -> tuple[bytes, bytes | None]:
    """``encoding_format`` ``bytes``: the packed vectors back to back, and a ``metadata``
    header (Python's ``json.dumps``) saying where each one is; ``bytes_only``: no header
    (vllm/entrypoints/pooling/utils.py:95-125, 170-205)."""
    dtype = request.embed_dtype
    pieces = [pack(vector, dtype, little_endian=request.little_endian) for vector in vectors]
    if request.encoding_format == "bytes_only":
        return b"".join(pieces), None
    items, offset = [], 0
    for index, (vector, piece) in enumerate(zip(vectors, pieces, strict=True)):
        end = offset + len(piece)
        shape = [len(vector)]
        items.append(
            {
                "index": index,
                "embed_dtype": dtype,
                "endianness": request.endianness,
                "start": offset,
                "end": end,
                "shape": shape,
            }
        )
        offset = end
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    metadata = {"id": head["id"], "created": head["created"], "model": head["model"], "data": items, "usage": usage}
    return b"".join(pieces), json.dumps(metadata).encode()


def register(router: Router) -> None:
    router.add("POST", "/v1/embeddings", embeddings)
