"""Logprobs as vLLM writes them, for chat and for completions.

Chat (``_create_chat_logprobs``): ``{"content": [{"token", "logprob", "bytes",
"top_logprobs": [{"token", "logprob", "bytes"}, ...]}]}``, one entry per token, the
``top_logprobs`` list exactly ``top_logprobs`` long.  Completions
(``_create_completion_logprobs``): ``{"text_offset", "token_logprobs", "tokens",
"top_logprobs"}``, parallel lists; each top dict holds the ``logprobs`` most likely
tokens, the sampled one among them (the synthetic model samples greedily), so at least
that one; with ``echo`` the prompt's tokens come first, the very first without a
logprob (``null``, as vLLM's prompt logprobs).  ``text_offset`` runs over the choice's
whole text, across the chunks of a stream.

Values come from :func:`~llmsim.model.logprobs.synthesize_logprobs`, a pure function
of (token, position, seed): a stream asks for each token as it goes out, the complete
response for all of them, and both get the same numbers.  Each choice has its own seed.

A plan's EOS token has an empty piece (the text leaves it out) but a logprob entry
like any sampled token, named by the string of its id as vLLM decodes it
(``<|im_end|>``; vllm/v1/engine/logprobs.py, ``convert_ids_list_to_tokens``).  Every
entry names its whole token even where a stream's text lags it (held back for a stop
string) or a stop cut it (``texts``: the plans' :attr:`~llmsim.api.turns.TurnPlan.token_texts`;
vLLM decodes the token id, vllm/entrypoints/generate/base/serving.py:302-319), and
completions' ``text_offset`` advances by those tokens, not by the text sent
(vllm/entrypoints/openai/completion/serving.py:413-418).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import attrs
import orjson

from llmsim.engine.job import Job, JobState
from llmsim.model.logprobs import TokenLogprob, synthesize_logprobs, token_bytes
from llmsim.model.text import EosToken

__all__ = ["ChatLogprobs", "CompletionLogprobs", "EchoedPrompt", "choice_seed"]


def choice_seed(seed: int | None, request_id: str, index: int) -> int:
    """The logprob seed of one choice: reproducible for the same ``--seed`` and request id."""
    return zlib.crc32(f"{seed}:{request_id}:{index}".encode())


def _tokens(job: Job, start: int, stop: int, eos: EosToken | None, texts: Sequence[Sequence[str]] | None) -> list[str]:
    """The token strings of ``job.output[start:stop]``: each token's own text (its piece
    unless ``texts`` says otherwise for its choice), the EOS by its name."""
    tokens = list((job.output if texts is None else texts[job.index])[start:stop])
    if eos is not None:
        ids = job.output_token_ids
        for k in range(len(tokens)):
            position = start + k
            if position < len(ids) and ids[position] == eos.token_id:
                tokens[k] = eos.text
    return tokens


class ChatLogprobs:
    """Chat's ``logprobs`` objects for the choices of one request (``eos``: the token
    the choices' plans end with; ``texts``: per choice, its tokens' own texts)."""

    def __init__(
        self,
        top_logprobs: int,
        seeds: Sequence[int],
        eos: EosToken | None = None,
        texts: Sequence[Sequence[str]] | None = None,
    ) -> None:
        self._top = top_logprobs
        self._seeds = seeds
        self._eos = eos
        self._texts = texts

    def token_bytes(self, job: Job, position: int) -> bytes:
        """``{"content":[<entry>]}`` for output token ``position`` of ``job`` (a stream chunk)."""
        (value,) = synthesize_logprobs(
            _tokens(job, position, position + 1, self._eos, self._texts),
            top_n=self._top,
            position_offset=position,
            seed=self._seeds[job.index],
        )
        return b'{"content":[' + orjson.dumps(_chat_entry(value)) + b"]}"

    def of(self, job: Job) -> dict[str, object]:
        """The whole choice's ``logprobs`` object (the complete response)."""
        tokens = _tokens(job, 0, _output_length(job), self._eos, self._texts)
        values = synthesize_logprobs(tokens, top_n=self._top, seed=self._seeds[job.index])
        return {"content": [_chat_entry(value) for value in values]}


def _output_length(job: Job) -> int:
    """The tokens a complete response shows: a finished job's emitted ones (fewer than
    planned when an abort ended it), else the whole plan."""
    return job.emitted if job.state is JobState.FINISHED else len(job.output)


def _chat_entry(value: TokenLogprob) -> dict[str, object]:
    return {
        "token": value.token,
        "logprob": value.logprob,
        "bytes": value.bytes,
        "top_logprobs": [
            {"token": token, "logprob": logprob, "bytes": token_bytes(token)} for token, logprob in value.top
        ],
    }


@attrs.frozen
class EchoedPrompt:
    """A prompt whose tokens ``echo`` prepends, and the seed of their logprobs."""

    tokens: tuple[str, ...]
    seed: int


class CompletionLogprobs:
    """Completions' ``logprobs`` objects for the choices of one request.

    ``prompts`` (with ``echo``) are the request's prompts; choice ``i`` answers prompt
    ``i // choices_per_prompt``, and its choices share the prompt's logprobs.  ``eos``
    is the token the choices' plans end with; ``texts`` per choice its tokens' own texts.
    """

    def __init__(
        self,
        logprobs: int,
        seeds: Sequence[int],
        *,
        choices_per_prompt: int,
        prompts: Sequence[EchoedPrompt] | None = None,
        eos: EosToken | None = None,
        texts: Sequence[Sequence[str]] | None = None,
    ) -> None:
        self._top = max(logprobs, 1)  # the sampled token is always listed
        self._seeds = seeds
        self._eos = eos
        self._texts = texts
        self._choices_per_prompt = choices_per_prompt
        self._prompts = None if prompts is None else [self._prompt_values(prompt) for prompt in prompts]
        self._offsets = [0] * len(seeds)  # per choice: the text length streamed so far

    def _prompt_values(self, prompt: EchoedPrompt) -> tuple[list[str], list[TokenLogprob | None]]:
        rest = synthesize_logprobs(prompt.tokens[1:], top_n=self._top, position_offset=1, seed=prompt.seed)
        return list(prompt.tokens), [None, *rest]

    def chunk_bytes(self, job: Job, start: int, stop: int) -> bytes:
        """The object for the chunk carrying ``job.output[start:stop]`` (and the prompt,
        echoed, when ``start`` is 0), its offsets continuing from the chunks before."""
        tokens, values = self._tokens(job, start, stop)
        value = self._object(tokens, values, self._offsets[job.index])
        self._offsets[job.index] += sum(map(len, tokens))
        return orjson.dumps(value)

    def of(self, job: Job, *, with_output: bool = True) -> dict[str, object]:
        """The whole choice's ``logprobs`` object (the complete response); without its
        output, the echoed prompt's alone (``echo`` with ``max_tokens: 0``)."""
        return self._object(*self._tokens(job, 0, _output_length(job) if with_output else 0), 0)

    def _tokens(self, job: Job, start: int, stop: int) -> tuple[list[str], list[TokenLogprob | None]]:
        tokens = _tokens(job, start, stop, self._eos, self._texts)
        values: list[TokenLogprob | None] = list(
            synthesize_logprobs(tokens, top_n=self._top, position_offset=start, seed=self._seeds[job.index])
        )
        if start == 0 and self._prompts is not None:
            prompt_tokens, prompt_values = self._prompts[job.index // self._choices_per_prompt]
            tokens[:0], values[:0] = prompt_tokens, prompt_values
        return tokens, values

    @staticmethod
    def _object(tokens: list[str], values: list[TokenLogprob | None], offset: int) -> dict[str, object]:
        offsets = []
        for token in tokens:
            offsets.append(offset)
            offset += len(token)
        return {
            "text_offset": offsets,
            "token_logprobs": [None if value is None else value.logprob for value in values],
            "tokens": tokens,
            "top_logprobs": [None if value is None else dict(value.top) for value in values],
        }
