"""A Job: one choice of one request, as the engine sees it.

The API layer builds a Job with everything decided up front (prompt token ids, the
planned output pieces, the finish reason when the plan runs out) and a sink.  The
engine only decides *when*: it admits the job, prefills it, and hands out its planned
tokens step by step through ``sink.on_output``.  A Job never does I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol

import attrs

from llmsim.engine.kv_cache import PromptBlocks
from llmsim.engine.kv_hashing import MultimodalItem

__all__ = ["ENDED", "Job", "JobSink", "JobState", "RequestGroup"]


class JobState(enum.Enum):
    NEW = "new"  # built, not yet submitted
    WAITING = "waiting"  # in the FIFO waiting queue
    PREFILL = "prefill"  # holds a running slot, first token not yet produced
    DECODING = "decoding"  # first token produced, more to come
    FINISHED = "finished"  # every planned token handed to the sink
    CANCELLED = "cancelled"  # removed by engine.cancel (client gone)
    REJECTED = "rejected"  # refused at submit (waiting queue full)


class JobSink(Protocol):
    """Receives a job's output.  Implemented by the API layer (it renders bytes)."""

    def on_output(self, job: Job, start: int, stop: int, now: float) -> bool:
        """``job.output[start:stop]`` were produced at time ``now`` (engine clock).

        ``job.state`` and ``job.emitted == stop`` are already updated.  When
        ``job.state is JobState.FINISHED`` this is the last call; ``stop`` then equals
        ``len(job.output)`` and ``job.finish_reason`` is final.  The first call
        (``start == 0``) marks the first token (TTFT); a job with an empty plan gets
        exactly one call, ``start == stop == 0``, already FINISHED.  One engine step may
        hand out several tokens at once (catch-up), so ``stop - start`` can exceed 1.

        Return False when the client's buffer is full: the engine pauses the job until
        ``engine.resume(job, now)``.  A resume made during this call (for example from
        an ``on_drained`` callback that fired at once) counts: the job is not paused.
        The return value of the last call is ignored.
        """


#: The states of a job the engine is done with (module constants: an enum member looked
#: up on its class costs ten times a global).
ENDED = (JobState.FINISHED, JobState.CANCELLED, JobState.REJECTED)


@attrs.define(eq=False)
class RequestGroup:
    """The jobs of one request's prompt (its ``n`` choices), for the metrics vLLM records
    once per request: ``n`` and the most tokens any choice generated
    (``vllm/v1/engine/parallel_sampling.py:137-152``).  The engine counts it down as
    its jobs finish; a cancelled job keeps it from ever completing, as vLLM drops an
    aborted parent request's stats."""

    n: int
    unfinished: int = attrs.field()
    max_generated: int = 0

    @unfinished.default
    def _all_unfinished(self) -> int:
        return self.n


@attrs.define(eq=False, repr=False)
class Job:
    """One sequence to simulate.  Fields after ``sink`` are owned by the engine."""

    prompt_token_ids: Sequence[int]
    output: Sequence[str]  # planned output pieces; their concatenation is the text
    finish_reason: str  # reported when the whole plan has been produced
    sink: JobSink
    output_token_ids: Sequence[int] = ()
    index: int = 0  # choice index within its request
    request_id: str = ""
    max_tokens: int | None = None  # the request's cap (for metrics); the plan already honours it
    cached_tokens: int = 0  # prompt tokens served from the prefix cache (not prefilled again)
    remote_prefill: bool = False  # P/D decode side: TTFT is the KV transfer time
    # Admission gate: a prefix hit rate below it ends the job unadmitted, "cache_threshold"
    # (llm-d-inference-sim request.go:266-291); None: no gate.
    cache_hit_threshold: float | None = None
    group: RequestGroup | None = None  # the request's other choices; None: a request of its own
    lora: str | None = None  # the LoRA adapter it runs with (a slot of --max-loras); None: the base model
    # The prompt's multimodal items (mm hash, placeholder range): extra keys of the KV
    # blocks they overlap, so the same tokens with other media get other keys.
    kv_multimodal: tuple[MultimodalItem, ...] = ()

    # --- engine-owned state (engine clock, seconds) -------------------------------------
    state: JobState = JobState.NEW
    emitted: int = 0  # output pieces handed to the sink so far
    paused: bool = False  # sink said its buffer is full; waits for engine.resume
    arrival_time: float = 0.0  # submit
    admitted_time: float | None = None  # got a running slot (queue time = admitted - arrival)
    first_token_time: float | None = None  # first sink call (TTFT = first_token - arrival)
    last_token_time: float = 0.0  # latest sink call (the next inter-token latency starts here)
    finish_time: float | None = None  # last sink call, or cancel / reject
    prefilled_tokens: int = 0  # prompt tokens with KV ready; cached ones count from admission
    deadline: float = 0.0  # absolute due time of the next token (first token while PREFILL)
    slot: float | None = None  # step time of the job's live entry in the engine's schedule; None = none
    kv_prompt: PromptBlocks | None = None  # the prompt's KV block keys, hashed at submit (with --enable-kvcache)

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def completion_tokens(self) -> int:
        return self.emitted

    @property
    def done(self) -> bool:
        return self.state in ENDED

    def __repr__(self) -> str:
        return (
            f"<Job {self.request_id or hex(id(self))}[{self.index}] {self.state.value} "
            f"{self.emitted}/{len(self.output)} prompt={self.prompt_tokens}>"
        )
