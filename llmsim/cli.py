"""The ``llmsim`` command: ``llmsim serve [flags]``.

One flag per :class:`~llmsim.config.Config` field, named by its kebab-case key, plus
``--config PATH`` (YAML).  Every problem with the command line, the environment or
the YAML file ends start-up with one line on stderr and exit status 2: the line
names the key, so that a launch script's log says what to fix.
"""

from __future__ import annotations

import argparse
import gc
import signal
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import attrs
import trio

from llmsim import __version__
from llmsim.config import (
    DURATION_FIELDS,
    IGNORED_KEYS,
    Config,
    ConfigError,
    format_duration,
    load_config,
)
from llmsim.server import serve

__all__ = ["build_parser", "config_from_args", "main", "reference_table"]


def _fail(message: str) -> NoReturn:
    _say(f"llmsim: {_one_line(message)}")
    raise SystemExit(2)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _note(message: str) -> None:
    _say(f"llmsim: note: {message}")


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@attrs.frozen
class FlagDoc:
    """How one Config field reads in ``--help`` and in the docs' flag table."""

    metavar: str
    help: str
    default: str | None = None  # shown instead of the field's default, when that needs words


_GROUPS: tuple[tuple[str, dict[str, FlagDoc]], ...] = (
    (
        "model and API",
        {
            "model": FlagDoc("NAME", "base model name (the `root` of /v1/models); also read from SIM_MODEL"),
            "served_model_name": FlagDoc(
                "NAME", "names requests may use; the first is the one reported in responses", "the --model name"
            ),
            "max_model_len": FlagDoc("TOKENS", "context window: prompt plus max tokens must fit"),
            "mode": FlagDoc("{random,echo}", "random: text from a built-in corpus; echo: the last user message back"),
            "seed": FlagDoc("INT", "makes every output reproducible", "unset (different text each run)"),
            "tokenizer": FlagDoc(
                "PATH",
                "a local HF tokenizer.json (never fetched from the network)",
                "unset (the built-in simulated tokenizer)",
            ),
        },
    ),
    (
        "engine",
        {
            "max_num_seqs": FlagDoc("N", "running slots: requests decoded together, one token per step"),
            "max_waiting_queue_length": FlagDoc("N", "requests that may wait for a slot; beyond that, 429"),
            "max_num_batched_tokens": FlagDoc(
                "TOKENS",
                "token budget of one engine step (long prompts prefill in chunks); unset: max(8192, max-num-seqs)",
            ),
        },
    ),
    (
        "tool calls",
        {
            "min_tool_call_integer_param": FlagDoc("N", "smallest generated integer argument (unless the schema says)"),
            "max_tool_call_integer_param": FlagDoc("N", "largest generated integer argument (unless the schema says)"),
            "min_tool_call_number_param": FlagDoc("X", "smallest generated number argument (unless the schema says)"),
            "max_tool_call_number_param": FlagDoc("X", "largest generated number argument (unless the schema says)"),
            "min_tool_call_array_param_length": FlagDoc(
                "N", "shortest generated array argument (unless the schema says)"
            ),
            "max_tool_call_array_param_length": FlagDoc(
                "N", "longest generated array argument (unless the schema says)"
            ),
            "tool_call_not_required_param_probability": FlagDoc(
                "PERCENT", "chance that an optional top-level argument is generated"
            ),
            "object_tool_call_not_required_field_probability": FlagDoc(
                "PERCENT", "chance that an optional field of a nested object is generated"
            ),
            "tool_call_extra_call_probability": FlagDoc(
                "PERCENT", "chance of one more tool call after each one (tool_choice auto/required)"
            ),
        },
    ),
    (
        "latency model",
        {
            "latency_calculator": FlagDoc(
                "{constant,per-token}",
                "how TTFT is computed; empty: per-token when --time-to-first-token and its std-dev are 0, "
                "else constant",
                '"" (automatic)',
            ),
            "time_to_first_token": FlagDoc("DURATION", "mean time to the first token (constant calculator)"),
            "time_to_first_token_std_dev": FlagDoc("DURATION", "Gaussian jitter of the TTFT, at most 30% of it"),
            "inter_token_latency": FlagDoc("DURATION", "mean time between two tokens of a stream (one engine step)"),
            "inter_token_latency_std_dev": FlagDoc(
                "DURATION", "Gaussian jitter of the inter-token latency, at most 30% of it"
            ),
            "prefill_overhead": FlagDoc("DURATION", "fixed part of the prefill time (per-token calculator)"),
            "prefill_time_per_token": FlagDoc(
                "DURATION", "prefill time per uncached prompt token (per-token calculator)"
            ),
            "prefill_time_std_dev": FlagDoc("DURATION", "Gaussian jitter of the whole prefill time"),
            "kv_cache_transfer_latency": FlagDoc(
                "DURATION", "TTFT of a request with do_remote_prefill (constant calculator)"
            ),
            "kv_cache_transfer_latency_std_dev": FlagDoc(
                "DURATION", "Gaussian jitter of the KV-cache transfer latency, at most 30% of it"
            ),
            "kv_cache_transfer_time_per_token": FlagDoc(
                "DURATION", "KV-cache transfer time per prompt token with do_remote_prefill (per-token calculator)"
            ),
            "kv_cache_transfer_time_std_dev": FlagDoc(
                "DURATION", "Gaussian jitter of the per-token KV-cache transfer time"
            ),
            "time_factor_under_load": FlagDoc(
                "FACTOR", "latency multiplier at max-num-seqs running requests, rising linearly from 1 at one (>= 1)"
            ),
        },
    ),
    (
        "server",
        {
            "host": FlagDoc("HOST", "address to listen on"),
            "port": FlagDoc("PORT", "TCP port; 0 picks a free one"),
            "server": FlagDoc(
                "{native,hypercorn}",
                "native: llmsim's own HTTP/1.1 and HTTP/2 handlers; hypercorn: the ASGI app under hypercorn",
            ),
            "ssl_certfile": FlagDoc("PATH", "TLS certificate chain (PEM), with --ssl-keyfile", "unset"),
            "ssl_keyfile": FlagDoc("PATH", "TLS private key (PEM), with --ssl-certfile", "unset"),
            "self_signed_certs": FlagDoc("", "serve TLS with a freshly generated self-signed certificate"),
            "max_request_body_size_mb": FlagDoc("MiB", "largest request body accepted, in MiB; larger ones get 413"),
            "max_concurrent_streams": FlagDoc(
                "N", "HTTP/2 streams per connection; more are refused with REFUSED_STREAM"
            ),
            "header_read_timeout": FlagDoc("DURATION", "time a client has to send a request's headers"),
            "keep_alive_timeout": FlagDoc("DURATION", "idle time after which a connection is closed"),
            "shutdown_grace_period": FlagDoc("DURATION", "on SIGINT/SIGTERM, time in-flight streams get to finish"),
            "startup_duration": FlagDoc("DURATION", "GET /health/ready answers 503 for this long after start-up"),
        },
    ),
)

_DEFAULTS = Config()
_CONFIG_HELP = "YAML file of kebab-case keys (also LLMSIM_CONFIG)"

_EPILOG = """\
durations: 100ms, 1.5s, 1m30s or a bare number of milliseconds.
precedence: flags > environment > YAML file > defaults.  Every flag is also read
from LLMSIM_<FLAG> (LLMSIM_TIME_TO_FIRST_TOKEN=100ms) and from the YAML key <flag>
(time-to-first-token: 100ms); SIM_MODEL sets --model too.
"""


def _field_docs() -> dict[str, FlagDoc]:
    """Every Config field's doc; a field added to Config without one still gets a flag."""
    docs = {name: doc for _, group in _GROUPS for name, doc in group.items()}
    return {field.name: docs.get(field.name, FlagDoc("VALUE", "")) for field in attrs.fields(Config)}


def _default_text(field: attrs.Attribute[Any], doc: FlagDoc) -> str:
    if doc.default is not None:
        return doc.default
    value = getattr(_DEFAULTS, field.name)
    if field.name in DURATION_FIELDS:
        return format_duration(value)
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, like every other start-up error."""

    def error(self, message: str) -> NoReturn:
        _fail(f"error: {message} (see llmsim serve --help)")


def build_parser() -> argparse.ArgumentParser:
    """``llmsim [--version] serve [flags]``."""
    parser = _Parser(prog="llmsim", description="A vLLM-compatible LLM inference simulator.", allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"llmsim {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    server = commands.add_parser(
        "serve",
        help="serve vLLM's OpenAI-compatible API over HTTP/1.1 and HTTP/2",
        description="Serve vLLM's OpenAI-compatible API over HTTP/1.1 and HTTP/2.",
        epilog=_EPILOG + _ignored_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
        argument_default=argparse.SUPPRESS,
    )
    _add_field_flags(server)
    _add_ignored_flags(server)
    return parser


def _grouped_fields() -> list[tuple[str, list[attrs.Attribute[Any]]]]:
    """The sections of ``--help`` and of the flag table; "other" holds undocumented fields."""
    fields = attrs.fields_dict(Config)
    grouped = [(title, [fields[name] for name in group]) for title, group in _GROUPS]
    documented = {name for _, group in _GROUPS for name in group}
    other = [field for name, field in fields.items() if name not in documented]
    return [*grouped, ("other", other)] if other else grouped


def _add_field_flags(parser: argparse.ArgumentParser) -> None:
    docs = _field_docs()
    for title, fields in _grouped_fields():
        group = parser.add_argument_group(title)
        for field in fields:
            _add_field_flag(group, field, docs[field.name])
    config = parser.add_argument_group("configuration file")
    config.add_argument("--config", dest="config_path", metavar="PATH", help=_help_text(_CONFIG_HELP, "none"))


def _add_field_flag(group: argparse._ArgumentGroup, field: attrs.Attribute[Any], doc: FlagDoc) -> None:
    help_text = _help_text(doc.help, _default_text(field, doc))
    if field.type in ("bool", bool):
        group.add_argument(_flag(field.name), dest=field.name, action=argparse.BooleanOptionalAction, help=help_text)
    elif field.name == "served_model_name":
        group.add_argument(
            _flag(field.name), dest=field.name, metavar=doc.metavar, nargs="+", action="extend", help=help_text
        )
    else:
        group.add_argument(_flag(field.name), dest=field.name, metavar=doc.metavar, help=help_text)


def _help_text(text: str, default: str) -> str:
    """argparse help strings are %-formatted."""
    return f"{text} (default: {default})".replace("%", "%%")


_IGNORED_DEST = "ignored:"


def _add_ignored_flags(parser: argparse.ArgumentParser) -> None:
    """Hidden from the flag list (the epilog names them all), but accepted."""
    for key, ignored in IGNORED_KEYS.items():
        dest = _IGNORED_DEST + key
        if ignored.arity == "switch":
            parser.add_argument(_flag(key), dest=dest, action=argparse.BooleanOptionalAction, help=argparse.SUPPRESS)
        else:
            nargs = "+" if ignored.arity == "values" else None
            parser.add_argument(_flag(key), dest=dest, nargs=nargs, help=argparse.SUPPRESS)


def _ignored_epilog() -> str:
    flags = ", ".join(_flag(key) for key in IGNORED_KEYS)
    return (
        "\n"
        + textwrap.fill(
            f"accepted for vLLM / llm-d-inference-sim compatibility and ignored: {flags}.",
            88,
            break_on_hyphens=False,
            break_long_words=False,
        )
        + "\n"
    )


def config_from_args(
    args: argparse.Namespace,
    environ: Mapping[str, str] | None = None,
    *,
    note: Callable[[str], None] = _note,
) -> Config:
    """The Config of a parsed ``serve`` command line; raises ConfigError.

    ``note`` receives one line for every ignored flag, YAML key or environment variable.
    """
    given = vars(args)
    for dest in given:
        if dest.startswith(_IGNORED_DEST):
            key = dest.removeprefix(_IGNORED_DEST)
            note(f"ignoring {_flag(key)}: {IGNORED_KEYS[key].reason}")
    flags = {dest: value for dest, value in given.items() if dest in attrs.fields_dict(Config)}
    return load_config(flags, environ=environ, config_path=given.get("config_path"), note=note)


def main(argv: Sequence[str] | None = None, *, environ: Mapping[str, str] | None = None) -> int:
    """Entry point of the ``llmsim`` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.command is None:
        _fail("error: a command is required: llmsim serve [flags]")
    notes: list[str] = []
    try:
        config = config_from_args(args, environ, note=notes.append)
    except ConfigError as exc:
        _fail(str(exc))
    for note in notes:  # only once the configuration holds: an error stays one line
        _note(note)
    return _run(config)


#: gc.set_threshold for `llmsim serve` (embedded servers leave the host process's GC alone).
SERVER_GC_THRESHOLDS = (50_000, 20, 100)


def _run(config: Config) -> int:
    """Serve; the exit status: 0 after a graceful shutdown, 1 if serving failed, 2 for a
    configuration problem found only at start-up (an unreadable certificate), 130 if a
    second signal cut the shutdown short."""
    failure: BaseException | None = None
    status = 0
    # The server process is ours: with thousands of streams the default thresholds run a
    # full collection every few seconds (180-200 ms pauses that show up as ITL p99 and
    # 15-18 % of CPU at 2,000 streams, docs/performance.md); collect far less often.
    gc.set_threshold(*SERVER_GC_THRESHOLDS)
    try:
        trio.run(_serve_until_signalled, config)
    except* ConfigError as group:
        failure, status = _first(group), 2
    except* OSError as group:
        failure, status = _first(group), 1
    except* KeyboardInterrupt:
        status = 130
    if isinstance(failure, ConfigError):
        _say(f"llmsim: {_one_line(str(failure))}")
    elif failure is not None:
        _say(f"llmsim: cannot serve: {_one_line(str(failure))}")
    return status


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    leaf = group.exceptions[0]
    return _first(leaf) if isinstance(leaf, BaseExceptionGroup) else leaf


async def _serve_until_signalled(config: Config) -> None:
    """Serve until SIGINT or SIGTERM, then shut down gracefully.

    The receiver is open before the server starts, so a signal during start-up is not
    lost; it is closed once the first signal arrives, so a second Ctrl-C interrupts a
    graceful shutdown that takes too long.
    """
    async with trio.open_nursery() as nursery:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            handle = await nursery.start(serve, config)
            _say(f"llmsim serving {config.display_model} on {handle.url} (HTTP/1.1 + HTTP/2)")
            async for _ in signals:
                break
        nursery.cancel_scope.cancel()


def reference_table() -> str:
    """The Markdown flag table of README.md and docs/configuration.md (tests keep them equal)."""
    docs = _field_docs()
    rows = ["| flag | default | meaning |", "|---|---|---|"]
    for _, fields in _grouped_fields():
        rows += [_table_row(field, docs[field.name]) for field in fields]
    rows.append(f"| `--config PATH` | none | {_CONFIG_HELP} |")
    return "\n".join(rows) + "\n"


def _table_row(field: attrs.Attribute[Any], doc: FlagDoc) -> str:
    key = field.name.replace("_", "-")
    if field.type in ("bool", bool):
        flag = f"--[no-]{key}"
    elif field.name == "served_model_name":
        flag = f"--{key} {doc.metavar} [{doc.metavar} ...]"
    else:
        flag = f"--{key} {doc.metavar}"
    default = _default_text(field, doc) if doc.default is not None else f"`{_default_text(field, doc)}`"
    return f"| `{flag}` | {default} | {doc.help} |"
