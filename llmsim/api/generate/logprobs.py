"""Logprobs of a generate choice, as vLLM's token-in/token-out server writes them.

``output_mode: "tokens"`` (``_create_tokens_logprobs``, vllm/entrypoints/scale_out/
token_in_token_out/serving.py:876-922): integer token ids, no strings::

    {"content": [{"token_id", "logprob", "rank", "top_logprobs": [{"token_id", "logprob", "rank"}, ...]}]}

``top_logprobs`` is every candidate the engine returned, the sampled token first, not
cut to the request's count: with ``logprobs: k`` the engine returns the top ``k`` plus the
sampled token when it is not among them.  The simulated model samples greedily, so its
token is always rank 1 and the list is ``max(k, 1)`` long.

``output_mode: "text"`` (``_create_text_logprobs``, :832-874): chat's shape, each token
decoded from its id (``tokenizer.decode([id])``) with its UTF-8 ``bytes``, the same
``max(k, 1)`` candidates.

The numbers are :func:`~llmsim.model.logprobs.synthesize_logprobs`' (a pure function of
token, position and the choice's seed), so a stream and the complete response agree.
Alternatives are named by strings; their ids are those strings' first token ids.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from llmsim.api.logprobs_format import choice_seed
from llmsim.engine.job import Job
from llmsim.model.logprobs import synthesize_logprobs, token_bytes
from llmsim.model.tokenizer import Tokenizer

__all__ = ["GenerateLogprobs"]


class GenerateLogprobs:
    """Each choice's ``logprobs`` object, for a span of its tokens."""

    def __init__(self, tokenizer: Tokenizer, count: int, *, seed: int | None, request_id: str, text_mode: bool) -> None:
        self._tokenizer = tokenizer
        self._top_n = max(count, 1)
        self._seed = seed
        self._request_id = request_id
        self._text_mode = text_mode
        self._id_of: Callable[[str], int] = functools.lru_cache(maxsize=4096)(self._first_id)

    def _first_id(self, text: str) -> int:
        ids = self._tokenizer.encode(text)
        return ids[0] if ids else 0

    def of(self, job: Job, start: int, stop: int) -> dict[str, object]:
        ids: Sequence[int] = job.output_token_ids[start:stop]
        tokens = [self._tokenizer.decode((token_id,)) for token_id in ids]
        seed = choice_seed(self._seed, self._request_id, job.index)
        entries = synthesize_logprobs(tokens, top_n=self._top_n, position_offset=start, seed=seed)
        content: list[dict[str, object]] = []
        for token_id, entry in zip(ids, entries, strict=True):
            if self._text_mode:
                top = [{"token": name, "logprob": value, "bytes": list(token_bytes(name))} for name, value in entry.top]
                content.append(
                    {"token": entry.token, "logprob": entry.logprob, "bytes": list(entry.bytes), "top_logprobs": top}
                )
                continue
            ranked = [
                {"token_id": token_id if rank == 1 else self._id_of(name), "logprob": value, "rank": rank}
                for rank, (name, value) in enumerate(entry.top, start=1)
            ]
            content.append({"token_id": token_id, "logprob": entry.logprob, "rank": 1, "top_logprobs": ranked})
        return {"content": content}
