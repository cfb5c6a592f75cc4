"""Token usage of a request, summed over its jobs, in vLLM's key order."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from llmsim.engine.job import Job

__all__ = ["ChunkUsage", "Usage"]


@attrs.frozen
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    @classmethod
    def of(cls, jobs: Sequence[Job], choices_per_prompt: int) -> Usage:
        """Prompt (and cached) tokens count once per prompt, not once per choice:
        the ``n`` choices of one prompt share it.  Choice ``i`` belongs to prompt
        ``i // choices_per_prompt``.  (One pass: this runs at the end of every request.)"""
        prompt_tokens = completion_tokens = cached_tokens = 0
        for job in jobs:
            completion_tokens += job.completion_tokens
            if job.index % choices_per_prompt == 0:
                prompt_tokens += job.prompt_tokens
                cached_tokens += job.cached_tokens
        return cls(prompt_tokens, completion_tokens, cached_tokens)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def as_dict(self) -> dict[str, object]:
        """``prompt_tokens, total_tokens, completion_tokens, prompt_tokens_details``:
        vLLM's UsageInfo field order."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.total_tokens,
            "completion_tokens": self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


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
