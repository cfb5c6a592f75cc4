"""How many logprobs per token a request may ask for: ``--max-logprobs``, as vLLM 0.33.

Completions' ``logprobs``, chat's ``top_logprobs`` (with ``logprobs: true``) and
responses' ``top_logprobs`` (with ``include: ["message.output_text.logprobs"]``) all
become vLLM's ``SamplingParams.logprobs`` and meet one rule
(``SamplingParams._validate_logprobs``, ``vllm/sampling_params.py:922-937``): more than
``max_logprobs`` (default 20; -1 lifts the cap to the vocabulary size) is a 400 whose
``param`` is ``logprobs`` whatever the field was called, and a request for -1 asks for
the whole vocabulary.  vLLM checks it as the engine takes the request, after the
response of a stream began, so streaming chat and completions requests get it in-band
(:func:`llmsim.api.generation.stream` with ``refusal``).
"""

from __future__ import annotations

from llmsim.api.context import ApiContext
from llmsim.api.errors import ApiError, validation_error
from llmsim.model.logprobs import MAX_SIMULATED_LOGPROBS

__all__ = ["checked_logprobs"]


def checked_logprobs(ctx: ApiContext, requested: int) -> tuple[int, ApiError | None]:
    """``(count, None)``: the request gets ``count`` logprobs per token for asking
    ``requested``; or ``(0, error)``: it is refused.

    Besides vLLM's limit, a count llmsim cannot list (more than
    :data:`~llmsim.model.logprobs.MAX_SIMULATED_LOGPROBS`, possible only with a raised
    or lifted ``--max-logprobs``) is a 400 of llmsim's own, with the same param.
    """
    vocab_size = ctx.tokenizer.vocab_size
    max_logprobs = ctx.model.max_logprobs
    limit = vocab_size if max_logprobs == -1 else max_logprobs
    count = vocab_size if requested == -1 else requested
    if count > limit:
        message = f"Requested sample logprobs of {count}, which is greater than max allowed: {limit}"
        return 0, validation_error(message, parameter="logprobs", value=count)
    if count > MAX_SIMULATED_LOGPROBS:
        message = f"llmsim lists at most {MAX_SIMULATED_LOGPROBS} logprobs per token; {count} were requested."
        return 0, ApiError(400, message, param="logprobs")
    return count, None
