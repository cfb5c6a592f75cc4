"""``GET/POST /admin/config`` (llm-d-inference-sim's) and vLLM's ``POST /sleep``,
``POST /wake_up``, ``GET /is_sleeping``.

**Admin config** (``pkg/communication/http.go:1033-1068`` of llm-d-inference-sim): GET
answers the live configuration; POST takes a partial JSON object of admin-configurable
keys, applies it all or nothing and answers the new configuration, or 400 with llm-d's
text and nothing changed.  The body is read as JSON whatever its content type, as
llm-d's handler does.

**Sleep mode** (``vllm/entrypoints/serve/dev/sleep/api_router.py:26-61``).  vLLM serves
these routes only with ``VLLM_SERVER_DEV_MODE=1``
(``vllm/entrypoints/launchers/api_server/routers.py:46-49``); llmsim serves them with
``--enable-sleep-mode`` and answers 404 otherwise, as vLLM does outside dev mode.  The
query parameters are validated as FastAPI does (``level``: an integer 0..2, default 1;
``mode``: abort, wait or keep, default abort), in vLLM's 400 envelope.

What happens to requests: new ones wait until the engine is fully awake (see
:mod:`llmsim.api.admin.sleep`).  Requests already in flight follow ``mode``, as vLLM's
``pause_scheduler`` (``vllm/v1/engine/core.py:2181-2223``, :mod:`llmsim.engine.pause`):
``abort`` (the default) ends every one at once with ``finish_reason: "abort"`` (a stream
gets its finishing chunk and ends normally); ``wait`` lets the running ones finish, and
``POST /sleep`` answers once they have (jobs still queued in the engine stay queued);
``keep`` freezes them until the engine is fully awake, their remaining tokens then come
on the same schedule, shifted by the time asleep.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

import orjson
import trio

from llmsim.api.admin.sleep import SleepState
from llmsim.api.context import Call
from llmsim.api.errors import ApiError
from llmsim.api.router import Router
from llmsim.api.structure import FieldTypeError, converter, error_input, request_validation_error
from llmsim.engine.pause import PauseState
from llmsim.engine.scheduler import Engine

__all__ = ["DRAIN_POLL_INTERVAL", "register"]

#: How often ``POST /sleep?mode=wait`` looks whether the engine has drained.  The engine
#: is sans-I/O and has no "idle" event; a sleep is rare, so a poll costs nothing.
DRAIN_POLL_INTERVAL = 0.01

_PAUSE_MODES = ("abort", "wait", "keep")  # vLLM's PauseMode (vllm/v1/engine/__init__.py:33)
_MODES_TEXT = "'abort', 'wait' or 'keep'"
_NOT_AN_INTEGER = "a valid integer, unable to parse string as an integer"


# --- /admin/config -------------------------------------------------------------------------


async def get_config(call: Call) -> None:
    call.respond_json(call.ctx.admin.snapshot())


async def post_config(call: Call) -> None:
    """llm-d's ``HandlePostAdminConfig``: every failure is a 400 with the config unchanged."""
    try:
        values = orjson.loads(call.request.body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"failed to unmarshal payload: {exc}") from None
    if not isinstance(values, dict):
        raise ApiError(400, "failed to unmarshal payload: expected a JSON object")
    try:
        snapshot = call.ctx.admin.update(values)
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None
    call.respond_json(snapshot)


# --- sleep mode ----------------------------------------------------------------------------


def _sleep_state(call: Call) -> SleepState:
    """The sleep state, or the router's 404 when sleep mode is off."""
    if not call.ctx.control.enable_sleep_mode:
        raise ApiError(404, f"Not Found: no route for {call.request.path}")
    return call.ctx.sleep


async def sleep(call: Call) -> None:
    state = _sleep_state(call)
    level, mode = _sleep_query(call.request.query)
    state.sleep(level)
    engine, now = call.ctx.engine, call.ctx.clock()
    if mode == "abort":
        engine.abort_all(now)
    engine.set_pause_state(PauseState.PAUSED_ALL if mode == "keep" else PauseState.PAUSED_NEW, now)
    if mode == "wait":
        await _drained(engine)
    if level >= 1:  # vLLM's clear_prefix_cache (vllm/v1/engine/core.py:1007-1008)
        engine.clear_kv_cache()
    call.respond_json({"status": "sleeping", "level": level})


async def wake_up(call: Call) -> None:
    state = _sleep_state(call)
    tags = [value for key, value in parse_qsl(call.request.query, keep_blank_values=True) if key == "tags"]
    fully_awake = state.wake_up(tags or None)
    if fully_awake:
        call.ctx.engine.set_pause_state(PauseState.UNPAUSED, call.ctx.clock())
    call.respond_json({"status": "awake" if fully_awake else "sleeping", "tags": tags or None})


async def is_sleeping(call: Call) -> None:
    call.respond_json({"is_sleeping": _sleep_state(call).is_sleeping})


def _sleep_query(query: str) -> tuple[int, str]:
    """``level`` and ``mode`` as FastAPI reads ``Query(ge=0, le=2)`` and a ``Literal``: the
    last value of each wins, and every invalid one is reported, level first."""
    params = dict(parse_qsl(query, keep_blank_values=True))
    errors: list[dict[str, object]] = []
    level = 1
    if "level" in params:
        text = params["level"]
        try:
            level = converter.structure(text, int)
        except FieldTypeError:
            errors.append(_query_error("int_parsing", "level", _NOT_AN_INTEGER, text))
        else:
            if level < 0:
                errors.append(_query_error("greater_than_equal", "level", "greater than or equal to 0", text, ge=0))
            elif level > 2:
                errors.append(_query_error("less_than_equal", "level", "less than or equal to 2", text, le=2))
    mode = params.get("mode", "abort")
    if mode not in _PAUSE_MODES:
        errors.append(_query_error("literal_error", "mode", _MODES_TEXT, mode, expected=_MODES_TEXT))
    if errors:
        raise request_validation_error([*errors], str(errors[0]["loc"]))
    return level, mode


def _query_error(kind: str, name: str, should_be: str, text: str, **ctx: object) -> dict[str, object]:
    """One pydantic error of a query parameter, as FastAPI reports it and vLLM prints it."""
    error: dict[str, object] = {
        "type": kind,
        "loc": f"query.{name}",
        "msg": f"Input should be {should_be}",
        "input": error_input(text),
    }
    if ctx:
        error["ctx"] = ctx
    return error


async def _drained(engine: Engine) -> None:
    """Return once no job runs (vLLM's ``mode=wait``: ``pause_scheduler`` completes when
    the engine has no work left, ``core.py:2196-2223``; under PAUSED_NEW queued requests
    are not work, ``vllm/v1/core/sched/scheduler.py:3147-3155``)."""
    while engine.statistics().running:
        await trio.sleep(DRAIN_POLL_INTERVAL)


def register(router: Router) -> None:
    router.add("GET", "/admin/config", get_config)
    router.add("POST", "/admin/config", post_config)
    router.add("POST", "/sleep", sleep, cancel_on_close=True)  # mode=wait polls until drained
    router.add("POST", "/wake_up", wake_up)
    router.add("GET", "/is_sleeping", is_sleeping)
