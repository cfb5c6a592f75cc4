"""What real clients do with each ``x-llmsim-fault`` (docs/faults.md, "What clients do"):
httpx over HTTP/1.1 and HTTP/2, curl, and the openai SDK, against ``llmsim.serve``.
The headers are built with :func:`llmsim.testing.fault_header`, as a client author's
suite would."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import openai
import pytest
import trio

from llmsim.server import ServerHandle
from llmsim.testing import FAULT_HEADER, fault_header, fault_headers, open_simulator
from tests.conftest import require_tool

MODEL = "llmsim/sim-model"
BODY = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 5, "stream": True, "ignore_eos": True})

#: Faults a correct client reads through: the same body, events whole.
READ_IN_FULL = [
    fault_header(delay_first_token_ms=50),
    fault_header(split_at=[3, 10]),
    fault_header(coalesce=2),
    fault_header(empty_data=2),
    fault_header(padding=7),
    fault_header(continuation=5),
    fault_header(ping_after=1),
    fault_header(settings_after=1),
    fault_header(window_update_storm=(1, 20)),
    fault_header(trailers={"x-note": "injected"}),
]
#: Faults that cut the response: the client must report a failure.
CUT = [
    fault_header(rst_after=2),
    fault_header(close_after=1),
    fault_header(goaway_after=1, goaway_code="PROTOCOL_ERROR"),
]


@pytest.fixture
async def server() -> AsyncIterator[ServerHandle]:
    async with open_simulator(time_to_first_token=0.005, inter_token_latency=0.01) as handle:
        yield handle


async def httpx_lines(server: ServerHandle, fault: str, http2: bool) -> tuple[list[str], Exception | None]:
    lines: list[str] = []
    # verify=False: plain HTTP, and a client that verifies loads the CA bundle first (0.1 s)
    async with httpx.AsyncClient(http1=not http2, http2=http2, base_url=server.url, verify=False) as client:
        headers = {FAULT_HEADER: fault, "content-type": "application/json"}
        try:
            async with client.stream("POST", "/v1/completions", content=BODY, headers=headers) as response:
                lines += [line async for line in response.aiter_lines() if line]
        except httpx.HTTPError as exc:
            return lines, exc
    return lines, None


@pytest.mark.parametrize("http2", [False, True], ids=["http1", "http2"])
@pytest.mark.parametrize("fault", READ_IN_FULL)
async def test_httpx_reads_shaped_responses_in_full(server: ServerHandle, fault: str, http2: bool) -> None:
    lines, error = await httpx_lines(server, fault, http2)
    assert error is None and len(lines) == 6 and lines[-1] == "data: [DONE]"
    assert all(json.loads(line.removeprefix("data: "))["object"] == "text_completion" for line in lines[:-1])


@pytest.mark.parametrize("http2", [False, True], ids=["http1", "http2"])
@pytest.mark.parametrize("fault", CUT)
async def test_httpx_raises_on_a_cut_response(server: ServerHandle, fault: str, http2: bool) -> None:
    lines, error = await httpx_lines(server, fault, http2)
    assert isinstance(error, httpx.RemoteProtocolError) and "data: [DONE]" not in lines


@pytest.mark.parametrize("http2", [False, True], ids=["http1", "http2"])
async def test_httpx_passes_malformed_events_and_the_error_event_through(server: ServerHandle, http2: bool) -> None:
    """httpx does not parse SSE: the bad line and vLLM's error event reach the caller."""
    lines, error = await httpx_lines(server, fault_header(bad_event=(1, "bare-data"), error_after=3), http2)
    assert error is None and "data:" in lines and lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2].removeprefix("data: "))["error"]["code"] == 500


# --- curl ------------------------------------------------------------------------------------


async def curl(server: ServerHandle, fault: str, http2: bool) -> tuple[int, str, bytes]:
    args = [require_tool("curl"), "-sS", "-N", "--max-time", "10", "-H", f"{FAULT_HEADER}: {fault}"]
    args += ["-H", "content-type: application/json", "-d", BODY, f"{server.url}/v1/completions"]
    if http2:
        args.insert(1, "--http2-prior-knowledge")
    done = await trio.run_process(args, capture_stdout=True, capture_stderr=True, check=False)
    return done.returncode, done.stderr.decode(), done.stdout


@pytest.mark.parametrize(
    ("fault", "http2", "code", "says"),
    [
        (fault_header(rst_after=2), True, 92, "HTTP/2 stream 1 was not closed cleanly: CANCEL (err 8)"),
        (fault_header(rst_after=2), False, 18, "transfer closed with outstanding read data remaining"),
        (fault_header(close_after=1), True, 18, "was not closed cleanly before end of the underlying stream"),
        (fault_header(goaway_after=1, goaway_code="ENHANCE_YOUR_CALM"), True, 18, "not closed cleanly"),
        (fault_header(goaway_after=1), True, 0, ""),  # curl completes the stream a graceful GOAWAY names
        (fault_header(padding=9, continuation=16, empty_data=1), True, 0, ""),
        # nghttp2 (1.52, curl's HTTP/2) refuses more than 8 CONTINUATION frames (a CVE-2024-28182 guard)
        (fault_header(continuation=4), True, 56, "Too many CONTINUATION frames following a HEADER frame"),
    ],
)
async def test_curl(server: ServerHandle, fault: str, http2: bool, code: int, says: str) -> None:
    returncode, stderr, stdout = await curl(server, fault, http2)
    assert (returncode, says in stderr) == (code, True), stderr
    assert stdout.endswith(b"data: [DONE]\n\n") == (code == 0)


# --- the openai SDK ----------------------------------------------------------------------------


def sdk_stream(server: ServerHandle, headers: dict[str, str] | None) -> tuple[int, BaseException | None]:
    """How many chunks ``openai`` yielded, and what it raised."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    chunks = 0
    try:
        stream = client.completions.create(
            model=MODEL,
            prompt="hi",
            max_tokens=5,
            stream=True,
            extra_headers=headers,
            extra_body={"ignore_eos": True},
        )
        for _chunk in stream:
            chunks += 1
    except Exception as exc:
        return chunks, exc
    finally:
        client.close()
    return chunks, None


async def test_openai_sdk_raises_api_connection_error_on_a_reset(server: ServerHandle) -> None:
    chunks, error = await trio.to_thread.run_sync(sdk_stream, server, fault_headers(rst_after=2))
    assert isinstance(error, openai.APIConnectionError) and chunks < 5


async def test_openai_sdk_lets_a_json_error_escape_on_a_bad_event(server: ServerHandle) -> None:
    """A ``data:`` line that is not JSON: the SDK raises ``json.JSONDecodeError`` itself,
    not one of its ``openai.APIError`` classes."""
    _, error = await trio.to_thread.run_sync(sdk_stream, server, fault_headers(bad_event=(1, "bad-json")))
    assert isinstance(error, json.JSONDecodeError) and not isinstance(error, openai.OpenAIError)


async def test_openai_sdk_raises_api_error_on_vllms_error_event(server: ServerHandle) -> None:
    def run() -> tuple[int, BaseException | None]:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        with client:
            chunks = 0
            try:
                for _chunk in client.completions.create(
                    model=MODEL,
                    prompt="hi",
                    max_tokens=50,
                    stream=True,
                    extra_headers=fault_headers(error_after=1),
                    extra_body={"ignore_eos": True},
                ):
                    chunks += 1
            except openai.APIError as exc:
                return chunks, exc
        return chunks, None

    chunks, error = await trio.to_thread.run_sync(run)
    assert isinstance(error, openai.APIError) and error.message == "Internal server error"
    assert 1 <= chunks < 50


async def test_a_global_fault_reaches_the_sdk_without_a_header() -> None:
    """``open_simulator(fault=..., fault_rate=1)``: every /v1/ request of a client that
    cannot send headers gets the fault."""
    async with open_simulator(fault=fault_header(close_after=1), fault_rate=1.0, inter_token_latency=0.01) as server:
        _, error = await trio.to_thread.run_sync(sdk_stream, server, None)
    assert isinstance(error, openai.APIConnectionError)
