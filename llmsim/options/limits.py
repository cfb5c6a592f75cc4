"""Limits that keep one client from hurting the others: floods, resets, slow and silent
peers, connection counts.  Each one is a flag with a default sized for a load-testing
target on a shared machine; docs/configuration.md ("Limits") lists them with what a
client sees when it crosses one."""

from __future__ import annotations

import attrs

from llmsim.options.fields import check_positive, check_positive_or_unset, option

__all__ = ["LimitOptions"]


@attrs.frozen(kw_only=True)
class LimitOptions:
    """What the connection handlers refuse, and when they give up on a peer."""

    # --- HTTP/2 frame and stream limits ---------------------------------------------------
    h2_control_frame_rate: int = option(
        100,
        metavar="N",
        llmd=False,
        validator=check_positive,
        help="HTTP/2 PING, SETTINGS, PRIORITY and empty DATA frames a client may send on one connection: "
        "N a second, in bursts of up to 10 N; beyond that, GOAWAY ENHANCE_YOUR_CALM",
    )
    h2_reset_rate: int = option(
        100,
        metavar="N",
        llmd=False,
        validator=check_positive,
        help="HTTP/2 streams a client may reset (its RST_STREAM, or a malformed request the server resets, "
        "or a stream it refuses beyond the stream limit) on one connection: N a second, in bursts of up to "
        "10 N; beyond that, GOAWAY ENHANCE_YOUR_CALM",
    )
    h2_max_queued_control_frames: int = option(
        1000,
        metavar="N",
        llmd=False,
        validator=check_positive,
        help="HTTP/2 PING and SETTINGS acknowledgements that may wait for a client that does not read them; "
        "one more is GOAWAY ENHANCE_YOUR_CALM",
    )
    write_stall_timeout: float = option(
        30.0,
        duration=True,
        llmd=False,
        validator=check_positive,
        help="time a response may wait for a client that does not read it (an HTTP/2 flow-control window "
        "or a socket that stays full); then the HTTP/2 stream is reset (CANCEL), an HTTP/1.1 connection "
        "closed, and its request's slot freed",
    )

    # --- connection and body limits ---------------------------------------------------------
    body_read_timeout: float = option(
        30.0,
        duration=True,
        llmd=False,
        validator=check_positive,
        help="time a client has to send a whole request body once its headers are in; slower ones get 408 "
        "(HTTP/2: RST_STREAM CANCEL)",
    )
    max_connections: int | None = option(
        None,
        metavar="N",
        llmd=False,
        shown_default="sized from the open-file limit",
        validator=check_positive_or_unset,
        help="open connections at most; at the cap a new one displaces the connection idle (no response "
        "in flight) for longest, or waits in the listen backlog while every connection is busy",
    )
    allow_cleartext: bool = option(
        False,
        llmd=False,
        help="with TLS configured, also serve cleartext HTTP/1.1 and h2c on the same port",
    )
