"""Fixtures the end-to-end tests share: the HTTP version, and the simulator's config.

The simulator itself is llmsim's own pytest plugin fixture, ``llmsim_server``.  The SDK
test modules each name the model they ask for and the seed their simulator runs with
as the module constants ``MODEL`` and ``SEED``; :func:`llmsim_config` reads them from
the requesting module, so the values stay with the tests that depend on them.
"""

from __future__ import annotations

import ssl
from typing import Any

import pytest

from llmsim.config import Config


@pytest.fixture(params=["http1", "http2"])
def http_version(request: pytest.FixtureRequest) -> str:
    """HTTP/1.1, or HTTP/2 with prior knowledge (no upgrade dance)."""
    return request.param


@pytest.fixture(scope="session")
def tls_context() -> ssl.SSLContext:
    """One client TLS context for the whole run: httpx builds a new one for every client,
    and loading its CA bundle takes ~40 ms, seconds over all the SDK tests."""
    return ssl.create_default_context()


@pytest.fixture
def http_kwargs(http_version: str, tls_context: ssl.SSLContext) -> dict[str, Any]:
    """The keyword arguments of an httpx (or httpx2) client speaking ``http_version``."""
    return {"http1": http_version == "http1", "http2": http_version == "http2", "verify": tls_context}


@pytest.fixture
def llmsim_config(backend: str, request: pytest.FixtureRequest) -> Config:
    """The config of the llmsim pytest plugin's ``llmsim_server``: the requesting module's
    MODEL and SEED, with tiny but real latencies (sockets and the SDKs' own timeouts do
    not mix with a mock clock)."""
    return Config(
        port=0,
        server=backend,
        served_model_name=(request.module.MODEL,),
        seed=request.module.SEED,
        time_to_first_token=0.002,
        inter_token_latency=0.0005,
    )
