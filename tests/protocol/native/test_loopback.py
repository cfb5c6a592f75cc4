"""The native server on a real loopback socket, against real clients: httpx, curl, raw resets.

(h2load runs against the real simulator in tests/e2e/test_native_server.py.)"""

from __future__ import annotations

import socket
import ssl
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import httpx
import pytest
import trio
import trio.testing
import trustme

from llmsim.config import Config, ConfigError
from llmsim.protocol.native.server import serve_app
from llmsim.protocol.settings import ServerHandle
from tests.conftest import require_tool
from tests.protocol.helpers import H2Client, TestApp

STREAM_LINES = ["data: 0", "", "data: 1", "", "data: 2", "", "data: [DONE]", ""]


@attrs.frozen
class Running:
    handle: ServerHandle
    app: TestApp


async def start(nursery: trio.Nursery, **config: object) -> Running:
    app = TestApp()
    handle = await nursery.start(serve_app, app, Config(port=0, **config).server)
    return Running(handle, app)


@pytest.fixture
async def server(nursery: trio.Nursery) -> AsyncIterator[Running]:
    yield await start(nursery)


async def run(*args: str) -> str:
    result = await trio.run_process(list(args), capture_stdout=True, capture_stderr=True, check=False)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


async def curl(*args: str) -> tuple[str, str]:
    """(body, HTTP version) of one curl request."""
    out = await run(require_tool("curl"), "-sS", "--max-time", "20", "-w", "\n%{http_version}", *args)
    body, _, version = out.rpartition("\n")
    return body, version


async def test_handle_reports_the_bound_port(server: Running) -> None:
    assert server.handle.port != 0 and server.handle.url == f"http://127.0.0.1:{server.handle.port}"


@pytest.mark.parametrize(("http1", "http2", "version"), [(True, False, "HTTP/1.1"), (False, True, "HTTP/2")])
async def test_httpx_streams_lines(server: Running, http1: bool, http2: bool, version: str) -> None:
    async with httpx.AsyncClient(http1=http1, http2=http2) as client:
        async with client.stream("GET", server.handle.url + "/stream?n=3") as response:
            lines = [line async for line in response.aiter_lines()]
            assert response.http_version == version and response.status_code == 200
        posted = await client.post(server.handle.url + "/echo", content=b"body")
    assert lines == STREAM_LINES
    assert posted.json()["body"] == "body"


async def test_httpx_http2_multiplexes_concurrent_requests_on_one_connection(server: Running) -> None:
    bodies: list[str] = []
    async with httpx.AsyncClient(http1=False, http2=True) as client:

        async def get(i: int) -> None:
            response = await client.get(server.handle.url + f"/stream?n={i}")
            bodies.append(response.text)

        async with trio.open_nursery() as nursery:
            for i in range(1, 21):
                nursery.start_soon(get, i)
        assert server.handle.statistics().open_connections == 1
    assert sorted(bodies) == sorted(_stream_text(i) for i in range(1, 21))


def _stream_text(n: int) -> str:
    return "".join(f"data: {i}\n\n" for i in range(n)) + "data: [DONE]\n\n"


@pytest.mark.parametrize(
    ("flag", "version"), [("--http1.1", "1.1"), ("--http2", "2"), ("--http2-prior-knowledge", "2")]
)
async def test_curl(server: Running, flag: str, version: str) -> None:
    body, used = await curl(flag, server.handle.url + "/stream?n=3")
    assert (body, used) == (_stream_text(3), version)


async def test_tls_with_a_self_signed_certificate_negotiates_by_alpn(nursery: trio.Nursery) -> None:
    running = await start(nursery, self_signed_certs=True)
    url = running.handle.url
    assert url.startswith("https://")
    assert await curl("-k", "--http2", url + "/stream?n=3") == (_stream_text(3), "2")
    assert await curl("-k", "--http1.1", url + "/stream?n=3") == (_stream_text(3), "1.1")
    # (Cleartext on the TLS port: tests/protocol/native/test_connection_abuse.py.)


async def test_tls_with_certificate_files_verifies_and_serves_h2(nursery: trio.Nursery, tmp_path: Path) -> None:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    issued = ca.issue_cert("localhost", "127.0.0.1")
    issued.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    issued.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    running = await start(nursery, ssl_certfile=str(tmp_path / "cert.pem"), ssl_keyfile=str(tmp_path / "key.pem"))
    url = running.handle.url
    assert await curl("--cacert", str(tmp_path / "ca.pem"), "--http2", url + "/stream?n=3") == (_stream_text(3), "2")
    context = ssl.create_default_context()
    ca.configure_trust(context)
    async with httpx.AsyncClient(http2=True, verify=context) as client:
        response = await client.get(url + "/stream?n=3")
    assert response.http_version == "HTTP/2" and response.text == _stream_text(3)


def test_unusable_certificate_files_are_a_config_error(tmp_path: Path) -> None:
    from llmsim.protocol.tls import server_ssl_context

    (tmp_path / "cert.pem").write_text("not a certificate")
    config = Config(ssl_certfile=str(tmp_path / "cert.pem"), ssl_keyfile=str(tmp_path / "cert.pem"))
    with pytest.raises(ConfigError, match=r"ssl-certfile.*PEM"):
        server_ssl_context(config.server)


def _reset(sock: trio.socket.SocketType) -> None:
    """Close with SO_LINGER 0: the peer gets a TCP RST, not a FIN."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


async def test_tcp_reset_mid_response_frees_everything_on_http1(server: Running) -> None:
    stream = await trio.open_tcp_stream(server.handle.host, server.handle.port)
    await stream.send_all(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
    await server.app.holding.wait()
    _reset(stream.socket)
    await server.app.gone.wait()
    await trio.testing.wait_all_tasks_blocked()
    stats = server.handle.statistics()
    assert (stats.open_connections, stats.active_streams) == (0, 0)
    assert "cancelled /hold" in server.app.log


async def test_tcp_reset_mid_response_frees_everything_on_http2(server: Running) -> None:
    stream = await trio.open_tcp_stream(server.handle.host, server.handle.port)
    client = H2Client(stream)
    await client.start()
    for _ in range(3):
        await client.request("/hold")
    await client.wait_until(lambda: all(record.chunks for record in client.records.values()))
    assert server.handle.statistics().active_streams == 3
    _reset(stream.socket)
    await server.app.gone.wait()
    await trio.testing.wait_all_tasks_blocked()
    stats = server.handle.statistics()
    assert (stats.open_connections, stats.active_streams) == (0, 0)
    assert server.app.log.count("cancelled /hold") == 3
