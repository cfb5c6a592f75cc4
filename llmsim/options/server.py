"""Where and how the server listens: address, TLS, protocol limits, shutdown, workers."""

from __future__ import annotations

import attrs

from llmsim.options.fields import ConfigError, check_non_negative, check_port, check_positive, option

__all__ = ["ServerOptions"]


@attrs.frozen(kw_only=True)
class ServerOptions:
    """Where and how the server listens, its protocol limits and its shutdown."""

    host: str = option("127.0.0.1", metavar="HOST", llmd=False, help="address to listen on")
    port: int = option(8000, metavar="PORT", validator=check_port, help="TCP port; 0 picks a free one")
    backend: str = option(
        "native",
        key="server",
        choices=("native", "hypercorn"),
        llmd=False,
        help="native: llmsim's own HTTP/1.1 and HTTP/2 handlers; hypercorn: the ASGI app under hypercorn",
    )
    ssl_certfile: str | None = option(
        None, metavar="PATH", shown_default="unset", help="TLS certificate chain (PEM), with --ssl-keyfile"
    )
    ssl_keyfile: str | None = option(
        None, metavar="PATH", shown_default="unset", help="TLS private key (PEM), with --ssl-certfile"
    )
    self_signed_certs: bool = option(False, help="serve TLS with a freshly generated self-signed certificate")
    max_request_body_size_mb: float = option(
        4.0, metavar="MiB", validator=check_positive, help="largest request body accepted, in MiB; larger ones get 413"
    )
    max_concurrent_streams: int = option(
        1000,
        metavar="N",
        llmd=False,
        validator=check_positive,
        help="HTTP/2 streams per connection; more are refused with REFUSED_STREAM",
    )
    header_read_timeout: float = option(
        10.0, duration=True, llmd=False, validator=check_positive, help="time a client has to send a request's headers"
    )
    keep_alive_timeout: float = option(
        75.0, duration=True, llmd=False, validator=check_positive, help="idle time after which a connection is closed"
    )
    shutdown_grace_period: float = option(
        5.0, duration=True, llmd=False, help="on SIGINT/SIGTERM, time in-flight streams get to finish"
    )
    startup_duration: float = option(
        0.0, duration=True, help="GET /health/ready answers 503 for this long after start-up"
    )
    workers: int = option(
        1,
        metavar="N",
        llmd=False,
        validator=check_non_negative,
        help="server processes sharing the port with SO_REUSEPORT, each a full simulator with its own "
        "max-num-seqs and queue, supervised by this one (0: one per core; docs/scaling.md)",
    )

    def __attrs_post_init__(self) -> None:
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ConfigError("ssl-certfile", "ssl-certfile and ssl-keyfile must be given together")
        if self.self_signed_certs and self.ssl_certfile is not None:
            raise ConfigError("self-signed-certs", "cannot be combined with ssl-certfile/ssl-keyfile")

    @property
    def tls_enabled(self) -> bool:
        return self.self_signed_certs or self.ssl_certfile is not None

    @property
    def max_request_body_bytes(self) -> int:
        return int(self.max_request_body_size_mb * 1024 * 1024)
