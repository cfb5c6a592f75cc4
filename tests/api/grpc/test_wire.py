"""gRPC's wire pieces: message framing, status codes and trailers, ``grpc-timeout``
(grpc/grpc doc/PROTOCOL-HTTP2.md, doc/statuscodes.md)."""

from __future__ import annotations

import pytest

from llmsim.api.grpc.wire import GrpcError, StatusCode, frame, parse_timeout, status_for_http, status_trailers, unframe


def test_a_message_is_a_flag_a_big_endian_length_and_the_bytes() -> None:
    assert frame(b"abc") == b"\x00\x00\x00\x00\x03abc"
    assert frame(b"") == b"\x00\x00\x00\x00\x00"
    assert list(unframe(frame(b"abc") + frame(b"") + frame(b"x" * 70000))) == [b"abc", b"", b"x" * 70000]
    assert list(unframe(b"")) == []


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"\x00\x00\x00", StatusCode.INTERNAL),  # a prefix cut short
        (b"\x00\x00\x00\x00\x05abc", StatusCode.INTERNAL),  # a message cut short
        (b"\x01\x00\x00\x00\x01x", StatusCode.UNIMPLEMENTED),  # compressed: not supported
    ],
)
def test_a_broken_or_compressed_message_is_an_error(body: bytes, code: StatusCode) -> None:
    with pytest.raises(GrpcError) as caught:
        list(unframe(body))
    assert caught.value.code is code


@pytest.mark.parametrize(
    ("http", "code"),
    [
        (400, StatusCode.INVALID_ARGUMENT),
        (401, StatusCode.UNAUTHENTICATED),
        (403, StatusCode.PERMISSION_DENIED),
        (404, StatusCode.NOT_FOUND),
        (409, StatusCode.ABORTED),
        (429, StatusCode.RESOURCE_EXHAUSTED),
        (500, StatusCode.INTERNAL),
        (501, StatusCode.UNIMPLEMENTED),
        (503, StatusCode.UNAVAILABLE),
        (504, StatusCode.DEADLINE_EXCEEDED),
        (408, StatusCode.UNKNOWN),
        (422, StatusCode.UNKNOWN),
        (502, StatusCode.UNKNOWN),
    ],
)
def test_http_errors_map_as_llm_d_inference_sim_maps_them(http: int, code: StatusCode) -> None:
    """pkg/communication/grpc.go:168-193 (extractGRPCCode): anything else is UNKNOWN."""
    assert status_for_http(http) is code


def test_status_trailers_percent_encode_the_message() -> None:
    assert status_trailers(StatusCode.OK) == ((b"grpc-status", b"0"),)
    assert status_trailers(StatusCode.NOT_FOUND, "100% sure: caf\u00e9\n") == (
        (b"grpc-status", b"5"),
        (b"grpc-message", b"100%25 sure: caf%C3%A9%0A"),
    )


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("1H", 3600.0),
        ("2M", 120.0),
        ("3S", 3.0),
        ("250m", 0.25),
        ("1500u", 0.0015),
        ("7n", 7e-9),
        ("99999999S", 1e8 - 1),
    ],
)
def test_grpc_timeout_units(value: str, seconds: float) -> None:
    assert parse_timeout(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["", "S", "10", "10s", "1.5S", "-1S", "123456789S", " 1S", "\u0661S"])
def test_a_malformed_grpc_timeout_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="grpc-timeout"):
        parse_timeout(value)
