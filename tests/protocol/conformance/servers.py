"""The servers under test, one per backend, shared by every case: they run in a thread of
their own (a trio loop of their own), since a trio test's fixtures cannot outlive it.

Sharing them is what h2spec does too (one server, a fresh connection per case); it also
keeps the run short: hypercorn may hold a response's last send for up to 5 s after its
client left (``AsgiApp.final_send_timeout``), which a server per case would wait out.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import trio

from llmsim.config import Config
from llmsim.server import ServerHandle, serve

START_TIMEOUT = 30.0


@contextmanager
def background_servers(configs: Mapping[str, Config]) -> Iterator[dict[str, ServerHandle]]:
    """One running simulator per entry of ``configs``, by the same name, for the ``with`` block."""
    handles: dict[str, ServerHandle] = {}
    stop: list[tuple[trio.lowlevel.TrioToken, trio.CancelScope]] = []
    failures: list[BaseException] = []
    ready = threading.Event()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for name, config in configs.items():
                handles[name] = await nursery.start(serve, config)
            stop.append((trio.lowlevel.current_trio_token(), nursery.cancel_scope))
            ready.set()

    def run() -> None:
        try:
            trio.run(main)
        except BaseException as error:  # reported to the test thread below
            failures.append(error)
        finally:
            ready.set()

    thread = threading.Thread(target=run, name="conformance-servers", daemon=True)
    thread.start()
    if not ready.wait(START_TIMEOUT) or not stop:
        raise RuntimeError("the servers under test did not start") from (failures[0] if failures else None)
    try:
        yield handles
    finally:
        token, scope = stop[0]
        trio.from_thread.run_sync(scope.cancel, trio_token=token)
        thread.join(START_TIMEOUT)
