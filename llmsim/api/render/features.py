"""Synthetic multimodal ``features`` for a rendered prompt.

vLLM's render runs the model's processor and reports, per modality, each item's hash,
where its placeholder tokens sit in the prompt, and its processed tensors
(``MultiModalFeatures``, vllm/entrypoints/scale_out/token_in_token_out/protocol.py:125-208).
llmsim has no processor.  It names each item as llm-d-inference-sim's simulated
tokenizer does (``stubMMFeaturesForMessages``, pkg/tokenizer/tokenizer.go:127-199):
``sim_<img|audio|video>_<index in its modality>_<FNV-1a 32 of the URL or data, hex>``,
with ``kwargs_data`` the hash in base64.  The placeholders are better than llm-d's
(which spreads them evenly over the prompt): each is the span of tokens that the
item's stand-in text (``<image>``, ``<audio>``, ``<video>``; :data:`llmsim.api.prompts.MEDIA`)
really takes in the prompt, so ``offset + length`` stays within ``token_ids`` and the
ranges are sorted and disjoint, as vLLM's validator demands.

The generating endpoints key their prompt's KV blocks by the same items
(:func:`kv_multimodal`): a router that renders the request sees the same hashes and
placeholders, so it computes the same block keys (docs/kv-cache.md).

A ``data:`` URL (or ``input_audio`` data) must hold valid base64: vLLM decodes it to
load the media, and malformed data is a 400 here too (:func:`check_media_data`).
"""

from __future__ import annotations

import base64
import binascii
import itertools
from collections.abc import Sequence

import attrs

from llmsim.api.errors import ApiError
from llmsim.api.prompts import MEDIA
from llmsim.engine.kv_hashing import MultimodalItem
from llmsim.model.tokenizer import ChatTurn, Tokenizer

__all__ = ["MediaItem", "check_media_data", "kv_multimodal", "media_hashes", "mm_features"]

#: The hash prefix llm-d-inference-sim gives each modality (tokenizer.go:140-157).
_HASH_PREFIX = {"image": "img", "audio": "audio", "video": "video"}

_FNV_OFFSET, _FNV_PRIME = 0x811C9DC5, 0x01000193


@attrs.frozen
class MediaItem:
    """One multimodal input of a request, in prompt order."""

    modality: str  # "image", "audio" or "video"
    source: str  # its URL, or its base64 data (input_audio)
    where: str  # the request field it came from, for errors


def fnv1a_32(text: str) -> int:
    """Go's ``hash/fnv`` New32a over the UTF-8 bytes of ``text``."""
    value = _FNV_OFFSET
    for byte in text.encode("utf-8"):
        value = ((value ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return value


def check_media_data(item: MediaItem, *, raw_base64: bool = False) -> None:
    """400 when the item's inline data is not base64: a ``data:...;base64,`` URL, or
    (``raw_base64``) the bare data of an ``input_audio`` block.  Other URLs are not
    fetched, so they are taken as they are."""
    payload: str | None = item.source if raw_base64 else None
    if not raw_base64 and item.source.startswith("data:"):
        header, _, payload = item.source.partition(",")
        if not header.endswith(";base64"):
            payload = None  # a plain (percent-encoded) data URL: nothing to decode
    if payload is None:
        return
    try:
        base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, f"Invalid base64 {item.modality} data in {item.where}", param=item.where) from None


def mm_features(tokenizer: Tokenizer, prompt_text: str, items: Sequence[MediaItem]) -> dict[str, object] | None:
    """The ``features`` of a prompt rendered from ``prompt_text`` (None without media):
    ``mm_hashes``, ``mm_placeholders``, ``kwargs_data`` and ``mm_metadata`` (null: no
    metadata-only items) in vLLM's field order, modalities in order of first appearance."""
    if not items:
        return None
    hashes: dict[str, list[str]] = {}
    placeholders: dict[str, list[dict[str, int]]] = {}
    kwargs: dict[str, list[str]] = {}
    for modality, digest, span in _described(tokenizer, prompt_text, items):
        hashes.setdefault(modality, []).append(digest)
        kwargs.setdefault(modality, []).append(base64.b64encode(digest.encode()).decode())
        placeholders.setdefault(modality, []).append(span)
    return {"mm_hashes": hashes, "mm_placeholders": placeholders, "kwargs_data": kwargs, "mm_metadata": None}


def kv_multimodal(
    tokenizer: Tokenizer, turns: Sequence[ChatTurn], items: Sequence[MediaItem]
) -> tuple[MultimodalItem, ...]:
    """The items of the prompt rendered from ``turns`` as its KV block keys take them:
    each item's mm hash over its placeholder, as llm-d-inference-sim feeds a request's
    ``MMFeatures`` to ``ComputeBlockExtraFeatures`` (pkg/kv-cache/kv_cache.go:111-121).
    Empty, with no template work, without media."""
    if not items:
        return ()
    described = _described(tokenizer, tokenizer.apply_chat_template(turns), items)
    return tuple(MultimodalItem(digest, span["offset"], span["length"]) for _, digest, span in described)


def _described(
    tokenizer: Tokenizer, prompt_text: str, items: Sequence[MediaItem]
) -> list[tuple[str, str, dict[str, int]]]:
    """Per item, in order: its modality, its hash and its placeholder span."""
    ends = list(itertools.accumulate(map(len, tokenizer.tokenize(prompt_text))))
    described = []
    cursor = 0
    for item, digest in zip(items, media_hashes(items), strict=True):
        span, cursor = _token_span(ends, prompt_text, MEDIA[item.modality], cursor)
        described.append((item.modality, digest, span))
    return described


def media_hashes(items: Sequence[MediaItem]) -> list[str]:
    """The items' hashes as the render endpoints name them
    (``sim_<img|audio|video>_<index in its modality>_<FNV-1a 32 hex>``)."""
    seen: dict[str, int] = {}
    hashes = []
    for item in items:
        index = seen[item.modality] = seen.get(item.modality, -1) + 1
        hashes.append(f"sim_{_HASH_PREFIX[item.modality]}_{index}_{fnv1a_32(item.source):x}")
    return hashes


def _token_span(ends: list[int], text: str, marker: str, cursor: int) -> tuple[dict[str, int], int]:
    """The tokens covering the next ``marker`` in ``text`` from character ``cursor``,
    and the character after it.  ``ends[i]`` is where token ``i`` ends."""
    start = text.find(marker, cursor)
    if start < 0:  # a template that dropped the stand-in: the last token stands for it
        return {"offset": max(len(ends) - 1, 0), "length": 1}, cursor
    stop = start + len(marker)
    first = next(i for i, end in enumerate(ends) if end > start)
    last = next(i for i, end in enumerate(ends) if end >= stop)
    return {"offset": first, "length": last - first + 1}, stop
