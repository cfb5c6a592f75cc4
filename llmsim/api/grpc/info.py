"""The unary ``VllmEngine`` methods besides Generate: HealthCheck, GetModelInfo,
GetServerInfo, GetLoads and Embed, each answered at once from the simulator's state.

They follow vLLM's servicer (smg-grpc-servicer 0.14.1, ``smg_grpc_servicer/vllm/
servicer.py``): HealthCheck :740-765 ("Health" while the engine runs), GetModelInfo
:817-835 (``model_info.py:95-112``), GetServerInfo :837-902 (``server_type
"vllm-grpc"``), GetLoads :904-947 (one ``SchedulerLoad`` for rank 0), Embed :677-738
(tokenized input only).  The embedding is llmsim's own (:mod:`llmsim.model.embeddings`),
as ``/v1/embeddings`` answers it, outside the engine.
"""

from __future__ import annotations

import datetime
from typing import Any

from smg_grpc_proto.generated import vllm_engine_pb2 as pb

from llmsim.api.context import ApiContext
from llmsim.api.grpc.wire import GrpcError, StatusCode
from llmsim.model.embeddings import embedding

__all__ = ["embed", "get_loads", "get_model_info", "get_server_info", "health_check"]


def health_check(ctx: ApiContext, request: Any) -> Any:
    return pb.HealthCheckResponse(healthy=True, message="Health")


def get_model_info(ctx: ApiContext, request: Any) -> Any:
    model = ctx.model
    return pb.GetModelInfoResponse(
        model_path=model.name,
        is_generation=True,
        max_context_length=model.max_model_len,
        vocab_size=ctx.tokenizer.vocab_size,
        supports_vision=False,
        served_model_name=model.display_model,
        tokenizer_path=model.tokenizer or model.name,
        model_type="llmsim",
        architectures=["LlmsimForCausalLM"],
        eos_token_ids=[ctx.text.eos.token_id],
        max_req_input_len=model.max_model_len,
        default_sampling_params_json="{}",
    )


def get_server_info(ctx: ApiContext, request: Any) -> Any:
    stats = ctx.engine.statistics()
    options = ctx.engine.options
    return pb.GetServerInfoResponse(
        active_requests=stats.running + stats.waiting,
        is_paused=ctx.sleep.is_sleeping,
        uptime_seconds=max(0.0, ctx.clock() - ctx.started_at),
        server_type="vllm-grpc",
        data_parallel_size=1,
        kv_cache_dtype="auto",
        block_size=options.block_size,
        max_num_seqs=options.max_num_seqs,
    )


def get_loads(ctx: ApiContext, request: Any) -> Any:
    engine = ctx.engine
    stats = engine.statistics()
    options = engine.options
    load = pb.SchedulerLoad(
        dp_rank=0,
        num_running_reqs=stats.running,
        num_waiting_reqs=stats.waiting,
        num_total_reqs=stats.running + stats.waiting,
        max_total_num_tokens=options.kv_cache_size * options.block_size if options.enable_kvcache else 0,
        token_usage=engine.kv_cache_usage,
        max_running_requests=options.max_num_seqs,
    )
    return pb.GetLoadsResponse(
        timestamp=datetime.datetime.fromtimestamp(ctx.wall_clock(), datetime.UTC).isoformat(),
        version=ctx.model.vllm_version,
        dp_rank_count=1,
        loads=[load],
    )


def embed(ctx: ApiContext, request: Any) -> Any:
    if not request.HasField("tokenized"):
        raise GrpcError(StatusCode.INVALID_ARGUMENT, "EmbedRequest requires tokenized input")
    ids = list(request.tokenized.input_ids)
    if not ids:
        raise GrpcError(StatusCode.INVALID_ARGUMENT, "The decoder prompt cannot be empty")
    if max(ids) >= ctx.tokenizer.vocab_size:
        raise GrpcError(StatusCode.INVALID_ARGUMENT, f"Token id {max(ids)} is out of vocabulary")
    if len(ids) > ctx.model.max_model_len:
        raise GrpcError(
            StatusCode.INVALID_ARGUMENT,
            f"This model's maximum context length is {ctx.model.max_model_len} tokens. "
            f"However, your request has {len(ids)} input tokens.",
        )
    vector = embedding(ids, ctx.model.default_embedding_dimensions)
    return pb.EmbedResponse(embedding=vector, prompt_tokens=len(ids), embedding_dim=len(vector))
