"""What every endpoint handler gets: the shared simulator state and its own call."""

from __future__ import annotations

import _random
import importlib
import json
import random
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from hashlib import sha512
from typing import TYPE_CHECKING, Any, TypeVar, cast

import attrs
import orjson

from llmsim.api.errors import JSON_HEADERS, ApiError
from llmsim.api.http import HttpRequest, InjectedFaults, ResponseStream
from llmsim.api.lora.registry import LoraRegistry
from llmsim.api.structure import error_input, request_validation_error
from llmsim.engine.scheduler import Engine
from llmsim.model.text import TextGenerator
from llmsim.model.tokenizer import Tokenizer
from llmsim.options import ControlOptions, ModelOptions, ToolCallOptions

if TYPE_CHECKING:  # a family's state, reached through the context; the family imports this module
    from llmsim.api.admin import AdminControl, SleepState
    from llmsim.api.responses.store import ResponseStore

__all__ = ["ApiContext", "BodyCache", "Call", "clear_request_adapter", "request_adapter", "seeded_random"]

T = TypeVar("T")

#: Every digit to ``0``, every other byte to a space: a body holds a run of 19 digits
#: (where orjson may turn an integer into a float) iff its translation holds 19 zeros.
#: (``bytes.translate`` and ``in`` run in C, several times faster than a regex search.)
_DIGITS_TO_ZERO = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x20 for byte in range(256))
_NINETEEN_DIGITS = b"0" * 19
#: FastAPI's answer to a body its JSON decoder fails on other than with a syntax error
#: (nesting too deep, an integer beyond Python's digit limit): fastapi/routing.py, rendered
#: by vLLM's HTTPException handler (vllm/entrypoints/serve/exception_handling/handlers/http.py).
_UNPARSABLE_BODY = "There was an error parsing the body"

#: The LoRA adapter the request being handled addresses (None: the base model), set by
#: :meth:`ApiContext.resolve_model`; the generation flow reads it as it builds the
#: request's jobs.  ``Api.start`` runs in the task that read the request (the native
#: server's connection reader, whose context every task it spawns copies), so each
#: request begins by clearing it (:func:`clear_request_adapter`): no request sees the
#: adapter of one before it on the same connection.
_REQUEST_ADAPTER: ContextVar[str | None] = ContextVar("llmsim_request_adapter", default=None)


@attrs.define(eq=False)
class ApiContext:
    """Shared by all handlers; built once per server by :class:`llmsim.app.Simulator`."""

    model: ModelOptions
    tool_calls: ToolCallOptions
    startup_duration: float  # seconds during which /health/ready answers 503
    engine: Engine
    tokenizer: Tokenizer
    text: TextGenerator
    clock: Callable[[], float]  # the engine's clock (trio.current_time in the server)
    wall_clock: Callable[[], float]  # unix seconds, for "created" fields
    started_at: float  # engine clock at start-up (for /health/ready)
    response_store: ResponseStore  # stored /v1/responses responses (``store``, ``previous_response_id``)
    # Failure injection, fake metrics, sleep, API key, logs.  Replaced whole (never
    # mutated) by ``POST /admin/config``: read it once per request.
    control: ControlOptions
    admin: AdminControl  # reads and changes the live configuration (/admin/config)
    sleep: SleepState  # vLLM's sleep mode; generation waits while it is paused
    _id_rng: random.Random = attrs.field(init=False)
    # Rolls failure injection (llmsim/api/failures.py); its own stream, so that a rate
    # change leaves request ids as they were.  Reproducible under --seed.
    failure_rng: random.Random = attrs.field(init=False)
    loras: LoraRegistry = attrs.field(init=False)  # the served LoRA adapters (llmsim/api/lora/)
    # Protocol faults injected (x-llmsim-fault, --fault): the native server counts, /metrics reads.
    injected_faults: InjectedFaults = attrs.field(factory=InjectedFaults, init=False)
    #: ``model.system_fingerprint``, hashed once (the model options never change).
    system_fingerprint: str = attrs.field(init=False)
    #: ``model.model_names`` and ``model.display_model`` (properties), read once for
    #: :meth:`resolve_model`, which every generating request calls.
    _model_names: tuple[str, ...] = attrs.field(init=False)
    _display_model: str = attrs.field(init=False)
    #: Request bodies parsed lately (:meth:`Call.parsed`), per server: what a route
    #: derives from a body may depend on the server's tokenizer.
    bodies: BodyCache = attrs.field(init=False, factory=lambda: BodyCache())

    def __attrs_post_init__(self) -> None:
        self.system_fingerprint = self.model.system_fingerprint
        self._model_names = self.model.model_names
        self._display_model = self.model.display_model
        self._id_rng = random.Random(self.model.seed)
        self.loras = LoraRegistry(self.model.model_names, self.model.lora_adapters, enabled=self.model.lora_enabled)
        self.failure_rng = random.Random(None if self.model.seed is None else f"failures:{self.model.seed}")

    def new_request_id(self) -> str:
        """16 hex characters, like vLLM's random_uuid(); reproducible under --seed."""
        return "%016x" % self._id_rng.getrandbits(64)  # noqa: UP031 (the same text as f"{…:016x}", for less)

    def rng_for(self, request_id: str, index: int = 0) -> random.Random:
        """The text RNG of one choice: reproducible for the same seed and request id.

        Exactly ``random.Random(f"{seed}:{request_id}:{index}")`` (:func:`seeded_random`),
        made without that constructor's Python-level detour."""
        return seeded_random(f"{self.model.seed}:{request_id}:{index}")

    def resolve_model(self, name: object) -> str:
        """The reported model name for a request's ``model`` field (None: the default):
        a LoRA adapter's name is reported as is, and the request's jobs run with it
        (vLLM's ``model_name(lora_request)``, ``vllm/entrypoints/openai/models/serving.py:
        143-146``; the 404 lists the base names only, as vLLM's)."""
        clear_request_adapter()
        if name is None:
            return self._display_model
        if not isinstance(name, str):
            raise ApiError(400, "model must be a string", param="model")
        if name in self._model_names:
            return self._display_model
        if name in self.loras.adapters:
            _REQUEST_ADAPTER.set(name)
            return name
        # vllm/entrypoints/serve/engine/serving.py:75-84
        aliases = ", ".join(self._model_names)
        raise ApiError(404, f"The model `{name}` does not exist. Valid aliases: {aliases}.", param="model")


_new_random = random.Random.__new__
_seed_state = _random.Random.seed  # the C seeding, which random.Random.seed ends with


def _seed_digest() -> Callable[[bytes], Any]:
    """The SHA-512 ``random.Random.seed`` hashes a string seed with: CPython's built-in
    ``_sha512`` when the build has it (``random.py`` tries it first), else hashlib's.  The
    digest is the same; for a seed's few bytes the built-in one costs ~1,700 instructions
    less per call (OpenSSL 3 sets up a digest context for each)."""
    try:
        return cast(Callable[[bytes], Any], importlib.import_module("_sha512").sha512)
    except ImportError:  # pragma: no cover (a build without it)
        return sha512


_sha512 = _seed_digest()


def seeded_random(text: str) -> random.Random:
    """``random.Random(text)``, in the same state, for less: the constructor runs
    ``Random.seed`` in Python (a version-2 string seed becomes the integer of its UTF-8
    bytes followed by their SHA-512, ``random.py``), then the C seeding, then clears
    ``gauss_next``.  This does the same three steps directly (one per choice of every
    generating request)."""
    data = text.encode()
    rng = _new_random(random.Random)
    _seed_state(rng, int.from_bytes(data + _sha512(data).digest(), "big"))
    rng.gauss_next = None  # type: ignore[attr-defined]  # set by Random.__init__, not in typeshed
    return rng


def clear_request_adapter() -> None:
    """No adapter for the request being handled (until ``resolve_model`` names one)."""
    if _REQUEST_ADAPTER.get() is not None:  # (set only to change it: a set costs more than a get)
        _REQUEST_ADAPTER.set(None)


def request_adapter() -> str | None:
    """The LoRA adapter of the request being handled (see :meth:`ApiContext.resolve_model`)."""
    return _REQUEST_ADAPTER.get()


@attrs.frozen
class Call:
    """One request being answered: what a handler receives."""

    ctx: ApiContext
    request: HttpRequest
    response: ResponseStream
    params: Mapping[str, str] = attrs.field(factory=dict)

    def parsed(self, parse: Callable[[dict[str, Any]], T]) -> T:
        """``parse(self.json())``, remembered per distinct body (:class:`BodyCache`):
        ``parse`` must be a function of the decoded body alone, which either raises
        (nothing is kept) or returns a value no one changes.  The content type is
        checked on every call, as :meth:`json` checks it first."""
        self._check_content_type()
        return self.ctx.bodies.parsed(self.request.body, parse, self._decoded)

    def json(self) -> dict[str, Any]:
        """The body as a JSON object, or a 400 that says what is wrong with it."""
        self._check_content_type()
        return self._decoded()

    def _decoded(self) -> dict[str, Any]:
        """:meth:`json` once the content type passed."""
        if not self.request.body:  # FastAPI reads no body at all (fastapi/routing.py)
            raise request_validation_error(
                [{"type": "missing", "loc": "body", "msg": "Field required", "input": "None"}], "body"
            )
        try:
            value = orjson.loads(self.request.body)
        except orjson.JSONDecodeError:
            raise _json_invalid(self.request.body) from None
        if _NINETEEN_DIGITS in self.request.body.translate(_DIGITS_TO_ZERO):
            # orjson reads an integer outside [-2**63, 2**64) as a float; Python's json
            # (as FastAPI's) keeps it exact, so that range checks see the number sent.
            try:
                value = json.loads(self.request.body)
            except (RecursionError, ValueError):
                raise ApiError(400, _UNPARSABLE_BODY, error_type="Bad Request") from None
        if not isinstance(value, dict):
            error = {
                "type": "model_attributes_type",
                "loc": "body",
                "msg": "Input should be a valid dictionary or object to extract fields from",
                "input": error_input(value),
            }
            raise request_validation_error([error], "body")
        return value

    def _check_content_type(self) -> None:
        content_type = self.request.header("content-type") or ""
        # vllm/entrypoints/serve/utils/api_utils.py:309-315: an absent header is refused too
        if (
            content_type != "application/json"  # the usual one needs no parsing
            and content_type.split(";", 1)[0].strip().lower() != "application/json"
        ):
            raise request_validation_error(["Unsupported Media Type: Only 'application/json' is allowed"])

    def respond(self, status: int, body: bytes, headers: tuple[tuple[bytes, bytes], ...] = JSON_HEADERS) -> None:
        """A complete response with a Content-Length."""
        self.response.start(status, (*headers, (b"content-length", str(len(body)).encode())))
        self.response.end(body)

    def respond_json(self, value: object, status: int = 200) -> None:
        self.respond(status, orjson.dumps(value))


class BodyCache:
    """Request bodies parsed lately, by parse function and exact body bytes.

    A load test sends one body (or a few) over and over; decoding, structuring and
    validating it (and what a route derives from the parsed body alone, such as its
    prompt's token ids, which a route may memoize on the value it returns) gives the
    same result every time.  Only a body that parsed is kept (an error is raised again
    each time, and in order, by parsing again); bodies above ``LARGEST`` bytes are not
    kept, and beyond ``KEPT`` entries the oldest is forgotten: a few MB at most.  A
    miss costs a dict lookup (the body's hash) on top of the parsing.
    """

    __slots__ = ("_entries",)

    KEPT = 128
    LARGEST = 8192

    def __init__(self) -> None:
        self._entries: dict[tuple[Callable[[dict[str, Any]], object], bytes], object] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def parsed(self, body: bytes, parse: Callable[[dict[str, Any]], T], decode: Callable[[], dict[str, Any]]) -> T:
        """``parse(decode())`` for ``body``, remembered (``decode`` reads ``body``)."""
        key = (parse, body)
        found = self._entries.get(key)
        if found is not None:
            return cast(T, found)
        value = parse(decode())
        if len(body) <= self.LARGEST:
            if len(self._entries) >= self.KEPT:
                del self._entries[next(iter(self._entries))]
            self._entries[key] = value
        return value


def _json_invalid(body: bytes) -> ApiError:
    """FastAPI's ``json_invalid`` error as vLLM renders it: the position and text of
    Python's JSON decoder (fastapi/routing.py; vllm/entrypoints/serve/exception_handling/
    handlers/validation.py:149-196).  Only on the error path, so the stdlib's speed is moot."""
    try:
        json.loads(body)
    except json.JSONDecodeError as exc:
        position, reason = exc.pos, exc.msg
    except UnicodeDecodeError:
        position, reason = 0, "Invalid UTF-8"
    except (RecursionError, ValueError):
        return ApiError(400, _UNPARSABLE_BODY, error_type="Bad Request")
    else:  # orjson is stricter than json (e.g. NaN): report it the same way
        position, reason = 0, "JSON decode error"
    error = {
        "type": "json_invalid",
        "loc": f"body.{position}",
        "msg": "JSON decode error",
        "input": "<dict of 0 items>",
        "ctx": {"error": reason},
    }
    return request_validation_error([error], f"body.{position}")
