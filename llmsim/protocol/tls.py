"""The server's TLS context: certificate files or a certificate made at start-up.

ALPN offers ``h2`` then ``http/1.1``; TLS 1.2 is the floor and compression is off, as
RFC 9113 section 9.2 requires of HTTP/2 over TLS.
"""

from __future__ import annotations

import ssl

import trustme

from llmsim.options import ConfigError, ServerOptions

__all__ = ["ALPN_PROTOCOLS", "self_signed_context", "server_ssl_context"]

ALPN_PROTOCOLS = ["h2", "http/1.1"]
#: Names the start-up certificate is valid for.
SELF_SIGNED_NAMES = ("localhost", "127.0.0.1", "::1")


def _base_context() -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_COMPRESSION
    # TLS 1.2 suites allowed by RFC 9113 appendix A; TLS 1.3 suites are unaffected.
    context.set_ciphers("ECDHE+AESGCM:ECDHE+CHACHA20")
    context.set_alpn_protocols(ALPN_PROTOCOLS)
    return context


def self_signed_context(names: tuple[str, ...] = SELF_SIGNED_NAMES) -> ssl.SSLContext:
    """A context with a fresh certificate for ``names``, signed by a throw-away CA.

    Clients must skip verification (``curl -k``): the CA exists only in memory.
    """
    context = _base_context()
    trustme.CA().issue_cert(*names).configure_cert(context)
    return context


def server_ssl_context(options: ServerOptions) -> ssl.SSLContext | None:
    """The TLS context ``options`` ask for, or None for plain TCP.

    Raises:
        ConfigError: the certificate or key file cannot be read or do not match.
    """
    if options.self_signed_certs:
        return self_signed_context()
    if options.ssl_certfile is None:
        return None
    context = _base_context()
    try:
        context.load_cert_chain(options.ssl_certfile, options.ssl_keyfile)
    except OSError as exc:  # ssl.SSLError is an OSError too
        raise ConfigError(
            "ssl-certfile",
            f"cannot use certificate {options.ssl_certfile!r} with key {options.ssl_keyfile!r}: {exc}; "
            "give a PEM certificate chain and its matching PEM private key",
        ) from None
    return context
