"""The simulated model's embedding vectors (llmsim/model/embeddings.py): llm-d-inference-sim's
stub, vLLM's normalisation and Matryoshka truncation, the binary packings, and the same
vector in every process."""

from __future__ import annotations

import base64
import math
import os
import struct
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmsim.model.embeddings import embedding, encode_base64, pack, stub_embedding
from llmsim.model.tokenizer import SimTokenizer

token_ids = st.lists(st.integers(min_value=0, max_value=2**31 - 1), max_size=40)
dimensions = st.integers(min_value=1, max_value=64)


def llmd_stub(tokens: list[int], dim: int) -> list[float]:
    """``BuildStubEmbedding`` (llm-d-inference-sim pkg/common/utils.go:229-243) transcribed,
    in float32 as Go computes it."""

    def f32(value: float) -> float:
        return float(struct.unpack("f", struct.pack("f", value))[0])

    out = []
    for i in range(dim):
        value = 0.0
        if i < len(tokens):
            value = f32(2 * f32(tokens[i] % 1024) / 1024 - 1)
        elif tokens:
            value = f32(2 * f32(tokens[i % len(tokens)] % 256) / 256 - 1)
        out.append(value)
    return out


@given(token_ids, dimensions)
def test_the_raw_vector_is_llm_d_inference_sims_stub(tokens: list[int], dim: int) -> None:
    assert stub_embedding(tokens, dim) == llmd_stub(tokens, dim)
    assert embedding(tokens, dim, normalize=False) == llmd_stub(tokens, dim)


@given(token_ids, dimensions, dimensions)
def test_a_shorter_vector_is_a_prefix_of_a_longer_one(tokens: list[int], short: int, extra: int) -> None:
    """Matryoshka: vLLM truncates to ``dimensions`` before it normalises
    (vllm/model_executor/layers/pooler/seqwise/heads.py:85-112)."""
    assert stub_embedding(tokens, short + extra)[:short] == stub_embedding(tokens, short)


@given(token_ids, dimensions)
def test_normalised_vectors_have_unit_length_and_the_stubs_direction(tokens: list[int], dim: int) -> None:
    raw = stub_embedding(tokens, dim)
    vector = embedding(tokens, dim)
    assert len(vector) == dim
    raw_norm = math.sqrt(sum(v * v for v in raw))
    if raw_norm == 0:  # F.normalize keeps a zero vector zero
        assert vector == [0.0] * dim
        return
    assert math.sqrt(sum(v * v for v in vector)) == pytest.approx(1.0, abs=1e-5)
    cosine = sum(a * b for a, b in zip(raw, vector, strict=True)) / raw_norm
    assert cosine == pytest.approx(1.0, abs=1e-5)
    # at most 9 decimals: short JSON numbers
    assert all(len(repr(v).split(".")[1]) <= 9 for v in vector if "e" not in repr(v))


def test_a_zero_vector_stays_zero() -> None:
    assert embedding([512, 1536, 2560], 3) == [0.0, 0.0, 0.0]  # every t % 1024 == 512
    assert embedding([], 4) == [0.0] * 4


@given(st.lists(st.floats(min_value=-1, max_value=1, width=32), max_size=16))
def test_float32_packing_in_either_byte_order(values: list[float]) -> None:
    """``tensor2binary`` (vllm/utils/serial_utils.py:74-99): float32, little- or big-endian."""
    assert pack(values) == struct.pack(f"<{len(values)}f", *values)
    assert pack(values, little_endian=False) == struct.pack(f">{len(values)}f", *values)
    assert base64.b64decode(encode_base64(values)) == struct.pack(f"<{len(values)}f", *values)


def test_float16_and_bfloat16_packing() -> None:
    values = [1.0, -0.5, 0.1, 0.0]
    assert pack(values, "float16") == struct.pack("<4e", *values)
    assert pack(values, "float16", little_endian=False) == struct.pack(">4e", *values)
    # bfloat16 is float32's upper half, rounded to nearest even: 0.1 is 0x3DCCCCCD -> 0x3DCD
    assert pack(values, "bfloat16") == struct.pack("<4H", 0x3F80, 0xBF00, 0x3DCD, 0x0000)
    assert pack(values, "bfloat16", little_endian=False) == struct.pack(">4H", 0x3F80, 0xBF00, 0x3DCD, 0x0000)
    with pytest.raises(ValueError, match="fp8_e4m3"):
        pack(values, "fp8_e4m3")


def test_the_same_text_gives_the_same_vector_in_another_process() -> None:
    """Nothing random: another interpreter, with another hash seed, computes the same
    vector for the same text through the simulated tokenizer."""
    text = "Embeddings are deterministic across processes."
    script = (
        "from llmsim.model.embeddings import embedding; from llmsim.model.tokenizer import SimTokenizer; "
        f"print(repr(embedding(SimTokenizer().encode({text!r}), 32)))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    output = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True, env=env)
    assert output.stdout.strip() == repr(embedding(SimTokenizer().encode(text), 32))
