"""Connection-level attacks for the abuse scenario (benchmarks/abuse.py): slow request
bodies, more slow clients than the server has file descriptors, cleartext on the TLS port.

Each attack is a function ``(target, stop) -> Outcome`` that runs, in a thread of the
benchmark process, until ``stop`` is set, and then says what the server did to it and
whether that is what the server should do.  Plain blocking sockets with ``selectors``:
hundreds of idle connections cost the attacker almost nothing.
"""

from __future__ import annotations

import selectors
import socket
import ssl
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs
from hyperframe.frame import Frame, GoAwayFrame

__all__ = [
    "Attack",
    "AttackFn",
    "Outcome",
    "Target",
    "cleartext_on_tls",
    "slow_bodies",
    "slow_clients",
    "tls_client_context",
]

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


@attrs.frozen
class Target:
    """Where the server under attack listens."""

    host: str
    port: int
    tls: bool = False


@attrs.frozen
class Outcome:
    """What the server did to the attack: ``held`` says whether the server behaved as
    it should (the row's verdict also looks at the other clients), ``summary`` says it
    in one line, ``details`` in numbers."""

    held: bool
    summary: str
    details: dict[str, Any] = attrs.field(factory=dict)


AttackFn = Callable[[Target, threading.Event], Outcome]


@attrs.frozen
class Attack:
    """One row of the abuse table: the attack, and the server it runs against."""

    name: str
    run: AttackFn
    server_flags: tuple[str, ...] = ()
    #: RLIMIT_NOFILE of the server process (None: inherited).
    fd_limit: int | None = None
    tls: bool = False
    duration: float = 20.0


# --- slow request bodies ---------------------------------------------------------------


def slow_bodies(connections: int, interval: float, body_timeout: float) -> AttackFn:
    """``connections`` POSTs announcing a 100 kB body, then one byte per ``interval``
    seconds on each: held if the server answered every one 408 and closed it within
    ``body_timeout`` (plus a little) of its head."""

    def attack(target: Target, stop: threading.Event) -> Outcome:
        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        head += b"Content-Length: 100000\r\n\r\n"
        pool = _Pool(target)
        for _ in range(connections):
            pool.open(head)
        next_byte = time.monotonic() + interval
        while not stop.is_set():
            pool.poll(0.2)
            if time.monotonic() >= next_byte:
                pool.send_all_open(b"x")
                next_byte += interval
        pool.close_all()
        closed = [c for c in pool.conns if c.closed_at is not None]
        held_for = [c.closed_at - c.opened_at for c in closed if c.closed_at is not None]
        answered_408 = sum(1 for c in closed if c.received.startswith(b"HTTP/1.1 408"))
        longest = max(held_for, default=float("nan"))
        ok = answered_408 == connections and longest <= body_timeout + 2 * interval
        summary = (
            f"{answered_408}/{connections} answered 408 and closed, held {statistics.median(held_for):.1f} s median, "
            f"{longest:.1f} s at most"
            if held_for
            else f"0/{connections} closed by the server: all held to the end"
        )
        return Outcome(ok, summary, {"answered_408": answered_408, "closed": len(closed), "longest_hold": longest})

    return attack


# --- more slow clients than file descriptors -------------------------------------------


def slow_clients(clients: int) -> AttackFn:
    """``clients`` connections, each sending half a request head and then nothing;
    every one the server closes is opened again at once.  Held if the server never
    stopped serving others (the health probes of the abuse table tell) and its log has
    no traceback (checked by the caller): here it only counts."""

    def attack(target: Target, stop: threading.Event) -> Outcome:
        head = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
        pool = _Pool(target)
        for _ in range(clients):
            pool.open(head)
        reopened = 0
        while not stop.is_set():
            gone = pool.poll(0.2)
            for _ in range(gone):
                if pool.open(head):
                    reopened += 1
        open_at_end = pool.open_count()
        pool.close_all()
        made = len(pool.conns)
        summary = (
            f"{made:,} connections made, {reopened:,} after the server closed one; {open_at_end:,} open at the end"
        )
        return Outcome(True, summary, {"connections": made, "reopened": reopened, "open": open_at_end})

    return attack


# --- cleartext on the TLS port ----------------------------------------------------------


def cleartext_on_tls(target: Target, stop: threading.Event) -> Outcome:
    """Cleartext HTTP/1.1 and h2c (prior knowledge) requests to the TLS port, in turns:
    held if every one was refused (400 / GOAWAY) and none was served."""
    served = refused = failed = 0
    while not stop.is_set():
        for h2c in (False, True):
            verdict = _try_cleartext(target, h2c)
            served += verdict == "served"
            refused += verdict == "refused"
            failed += verdict == "failed"
    summary = f"{refused:,} cleartext requests refused, {served:,} served, {failed:,} other"
    return Outcome(served == 0 and refused > 0, summary, {"refused": refused, "served": served, "other": failed})


def _try_cleartext(target: Target, h2c: bool) -> str:
    request = H2_PREFACE + EMPTY_SETTINGS if h2c else b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    try:
        with socket.create_connection((target.host, target.port), timeout=5) as sock:
            sock.sendall(request)
            data = _read_to_eof(sock)
    except OSError:
        return "failed"
    if h2c:
        return "refused" if _has_goaway(data) else ("served" if data else "failed")
    if data.startswith(b"HTTP/1.1 400"):
        return "refused"
    return "served" if data.startswith(b"HTTP/1.1 2") else "failed"


def _read_to_eof(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _has_goaway(data: bytes) -> bool:
    while len(data) >= 9:
        frame, length = Frame.parse_frame_header(memoryview(data[:9]))
        if isinstance(frame, GoAwayFrame):
            return True
        data = data[9 + length :]
    return False


def tls_client_context() -> ssl.SSLContext:
    """The victims' context for a server with a throw-away certificate."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


# --- a pool of idle attacking connections -----------------------------------------------


@attrs.define(eq=False)
class _Conn:
    sock: socket.socket
    opened_at: float
    closed_at: float | None = None
    received: bytes = b""


@attrs.define(eq=False)
class _Pool:
    """Many connections that mostly wait; :meth:`poll` notices the ones the server closes."""

    target: Target
    conns: list[_Conn] = attrs.field(factory=list)
    selector: selectors.DefaultSelector = attrs.field(factory=selectors.DefaultSelector)

    def open(self, first_bytes: bytes) -> bool:
        try:
            sock = socket.create_connection((self.target.host, self.target.port), timeout=5)
            sock.sendall(first_bytes)
        except OSError:
            return False
        sock.setblocking(False)
        conn = _Conn(sock, time.monotonic())
        self.conns.append(conn)
        self.selector.register(sock, selectors.EVENT_READ, conn)
        return True

    def poll(self, timeout: float) -> int:
        """Read what the server sent; return how many connections it closed."""
        gone = 0
        for key, _ in self.selector.select(timeout):
            conn: _Conn = key.data
            try:
                data = conn.sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            conn.received += data[: max(0, 256 - len(conn.received))]
            if not data:
                self._closed(conn)
                gone += 1
        return gone

    def send_all_open(self, data: bytes) -> None:
        for conn in self.conns:
            if conn.closed_at is None:
                try:
                    conn.sock.send(data)
                except OSError:
                    self._closed(conn)

    def open_count(self) -> int:
        return sum(1 for conn in self.conns if conn.closed_at is None)

    def close_all(self) -> None:
        for conn in self.conns:
            if conn.closed_at is None:
                self.selector.unregister(conn.sock)
                conn.sock.close()
        self.selector.close()

    def _closed(self, conn: _Conn) -> None:
        conn.closed_at = time.monotonic()
        self.selector.unregister(conn.sock)
        conn.sock.close()
