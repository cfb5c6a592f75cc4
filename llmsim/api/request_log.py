"""``--enable-log-requests``: a few lines per request, in vLLM's words, never one per token.

:func:`request_log` gives the lines of a request whose jobs
:class:`~llmsim.api.generation.SubmittedJobs` brackets (its ``log``).  Once the jobs are
in the engine (:meth:`RequestLog.submitted`) it logs, as vLLM does:

* ``Received request <id>: params: SamplingParams(n=..., max_tokens=...), lora_request: None.``
  once per prompt (``vllm/entrypoints/serve/utils/request_logger.py:66-71``; llmsim
  shows only the parameters its plan knows);
* ``Added request <id>.`` once per choice (``vllm/v1/engine/async_llm.py:561,587``).

When they are left (:meth:`RequestLog.left`, before the unfinished ones are cancelled):

* for each choice that finished, ``Finished request <id>: finish_reason: ...,
  prompt_tokens: ..., completion_tokens: ...``: llmsim's own line, as vLLM logs nothing
  when a request completes (only its ``--enable-log-outputs`` logs the output text);
* when choices were left unfinished (the client went away, the server shut down),
  ``Aborted request(s) <ids>.`` and ``Request <id> aborted.`` per prompt
  (``vllm/v1/engine/async_llm.py:959,811``).

Ids follow vLLM's: a prompt of a multi-prompt request is ``<id>_<p>``
(``chat_completion/serving.py:345-347``), choice ``i`` of ``n > 1`` is ``<i>_<prompt id>``
(``vllm/v1/engine/parallel_sampling.py:94``); vLLM's random 8-character suffix is left out.
A request refused before its jobs are in the engine (a full queue) logs nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from llmsim.api.context import ApiContext
from llmsim.api.plan import GenerationPlan
from llmsim.engine.job import Job, JobState

__all__ = ["RequestLog", "log", "request_log"]

log = logging.getLogger("llmsim.api.request_log")


def request_log(ctx: ApiContext, plan: GenerationPlan, jobs: Sequence[Job]) -> RequestLog | None:
    """The request's log lines around its submitted ``jobs`` (None without
    ``--enable-log-requests``, at the cost of one attribute read)."""
    if not ctx.control.enable_log_requests:
        return None
    return RequestLog(plan, jobs)


class RequestLog:
    """The lines of one request: see the module's docstring."""

    def __init__(self, plan: GenerationPlan, jobs: Sequence[Job]) -> None:
        self._plan = plan
        self._jobs = jobs

    def prompt_id(self, prompt: int) -> str:
        plan = self._plan
        return plan.request_id if len(plan.prompts) == 1 else f"{plan.request_id}_{prompt}"

    def job_id(self, job: Job) -> str:
        per_prompt = self._plan.choices_per_prompt
        prompt_id = self.prompt_id(job.index // per_prompt)
        return prompt_id if per_prompt == 1 else f"{job.index % per_prompt}_{prompt_id}"

    def submitted(self) -> None:
        """The lines once the jobs are in the engine."""
        plan = self._plan
        for index, prompt in enumerate(plan.prompts):
            params = f"SamplingParams(n={plan.choices_per_prompt}, max_tokens={prompt.output_cap})"
            log.info("Received request %s: params: %s, lora_request: None.", self.prompt_id(index), params)
        for job in self._jobs:
            log.info("Added request %s.", self.job_id(job))

    def left(self) -> None:
        """The lines as the request leaves its jobs, however it does (before the unfinished ones are cancelled)."""
        unfinished = []
        for job in self._jobs:
            if job.state is JobState.FINISHED:
                log.info(
                    "Finished request %s: finish_reason: %s, prompt_tokens: %d, completion_tokens: %d.",
                    self.job_id(job),
                    job.finish_reason,
                    job.prompt_tokens,
                    job.completion_tokens,
                )
            else:
                unfinished.append(job)
        if unfinished:
            log.info("Aborted request(s) %s.", ",".join(self.job_id(job) for job in unfinished))
            per_prompt = self._plan.choices_per_prompt
            for prompt in sorted({job.index // per_prompt for job in unfinished}):
                log.info("Request %s aborted.", self.prompt_id(prompt))
