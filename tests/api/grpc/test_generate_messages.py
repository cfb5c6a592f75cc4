"""The per-token chunk, encoded by hand, is byte for byte what protobuf encodes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from smg_grpc_proto.generated import vllm_engine_pb2 as pb

from llmsim.api.grpc.generate import _chunk
from llmsim.api.grpc.wire import frame
from tests.api.fakes import make_job

UINT32 = st.integers(0, 2**32 - 1)


@given(
    token_ids=st.lists(UINT32, max_size=20),
    prompt_tokens=st.integers(1, 300),
    cached_tokens=st.integers(0, 2**20),
    index=st.integers(0, 300),
)
def test_the_hand_encoded_chunk_is_protobuf_s(
    token_ids: list[int], prompt_tokens: int, cached_tokens: int, index: int
) -> None:
    job = make_job(None, ("x",), index=index, prompt_tokens=prompt_tokens)  # type: ignore[arg-type]
    job.cached_tokens = cached_tokens
    chunk = pb.GenerateStreamChunk(
        token_ids=token_ids,
        prompt_tokens=prompt_tokens,
        completion_tokens=len(token_ids),
        cached_tokens=cached_tokens,
        index=index,
    )
    assert _chunk(job, token_ids) == frame(pb.GenerateResponse(chunk=chunk).SerializeToString())
