"""Token usage of a request, summed over its jobs, in vLLM's key order."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import attrs

from llmsim.engine.job import Job

__all__ = ["CACHE_BLOCK_TOKENS", "ChunkUsage", "Usage", "UsageStyle", "usage_style"]


#: Tokens per KV-cache block: vLLM's default block size on GPUs (and ``--block-size``'s
#: default).  A prompt's full blocks are what its prefill writes to the prefix cache.
CACHE_BLOCK_TOKENS = 16


@attrs.frozen
class UsageStyle:
    """How a family renders ``prompt_tokens_details``.

    ``prompt_details`` is ``--enable-prompt-tokens-details``: without it vLLM leaves
    the details ``None`` (chat_completion/serving.py:95-114, completion/serving.py:
    508-511, 668-675).  Chat fills ``created_cache_tokens`` too (serving.py:110-114);
    completions passes ``cached_tokens`` alone.
    """

    prompt_details: bool
    created_cache_tokens: bool  # chat: True; completions: False
    block_size: int = CACHE_BLOCK_TOKENS  # --block-size: the blocks cache writes are counted in


@functools.lru_cache(maxsize=16)
def usage_style(prompt_details: bool, created_cache_tokens: bool, block_size: int = CACHE_BLOCK_TOKENS) -> UsageStyle:
    """``UsageStyle(prompt_details, created_cache_tokens, block_size)``, made once per
    distinct value (a server has one per family; the class is frozen, so shared): the
    routes ask for it on every request, and a frozen attrs class costs several µs to make."""
    return UsageStyle(prompt_details, created_cache_tokens, block_size)


@attrs.frozen
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    prompts: tuple[tuple[int, int], ...] = ()  # per prompt: its tokens and how many were cached

    @classmethod
    def of(cls, jobs: Sequence[Job], choices_per_prompt: int) -> Usage:
        """Prompt (and cached) tokens count once per prompt, not once per choice:
        the ``n`` choices of one prompt share it.  Choice ``i`` belongs to prompt
        ``i // choices_per_prompt``.  (One pass: this runs at the end of every request.)

        """
        prompt_tokens = completion_tokens = cached_tokens = 0
        prompts = []
        for job in jobs:
            completion_tokens += job.completion_tokens
            if job.index % choices_per_prompt == 0:
                prompt_tokens += job.prompt_tokens
                cached_tokens += job.cached_tokens
                prompts.append((job.prompt_tokens, job.cached_tokens))
        return cls(prompt_tokens, completion_tokens, cached_tokens, tuple(prompts))

    def created_cache_tokens(self, block_size: int) -> int:
        """The cache writes, vLLM's ``num_cache_creation_tokens``: each prompt's full
        blocks of ``block_size`` tokens less what was already cached
        (vllm/v1/metrics/stats.py:342-346, fed ``estimate_cached_tokens``,
        vllm/v1/core/kv_cache_manager.py:760)."""
        return sum(max(0, prompt - prompt % block_size - cached) for prompt, cached in self.prompts)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def body_dict(self, style: UsageStyle) -> dict[str, object]:
        """A response body's usage: vLLM's ``UsageInfo`` dumped whole
        (vllm/entrypoints/serve/engine/protocol.py:121-140), every key in field order."""
        details: dict[str, object] | None = None
        if style.prompt_details:
            details = {
                "cached_tokens": self.cached_tokens,
                "created_cache_tokens": self.created_cache_tokens(style.block_size)
                if style.created_cache_tokens
                else None,
                "multimodal_tokens": None,
            }
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.total_tokens,
            "completion_tokens": self.completion_tokens,
            "prompt_tokens_details": details,
            "completion_tokens_details": None,
        }

    def chunk_dict(self, style: UsageStyle) -> dict[str, object]:
        """A stream's final usage chunk's usage: dumped with ``exclude_none``
        (chat_completion/serving.py:499-501, completion/serving.py:544-546), so the
        null keys are left out."""
        usage: dict[str, object] = {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.total_tokens,
            "completion_tokens": self.completion_tokens,
        }
        if style.prompt_details:
            details: dict[str, object] = {"cached_tokens": self.cached_tokens}
            if style.created_cache_tokens:
                details["created_cache_tokens"] = self.created_cache_tokens(style.block_size)
            usage["prompt_tokens_details"] = details
        return usage


@attrs.frozen
class ChunkUsage:
    """The cumulative ``usage`` every chunk carries with ``stream_options``
    ``{"include_usage": true, "continuous_usage_stats": true}``: one choice's tokens so
    far against its prompt (vllm/entrypoints/openai/chat_completion/serving.py:624-634,
    838-851; completion/serving.py:477-484).

    vLLM sets it after building the chunk and dumps with ``exclude_unset``, so the
    fields it passed explicitly are the keys: chat passes ``completion_tokens_details``
    (null without a reasoning parser), completions does not.
    """

    prompt_tokens: int
    with_details: bool  # chat: a ``"completion_tokens_details":null`` key

    def render(self, completion_tokens: int) -> bytes:
        """``,"usage":{…}``: the key and the object, to follow a chunk's ``choices``."""
        return b',"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d%s}' % (
            self.prompt_tokens,
            self.prompt_tokens + completion_tokens,
            completion_tokens,
            b',"completion_tokens_details":null' if self.with_details else b"",
        )
