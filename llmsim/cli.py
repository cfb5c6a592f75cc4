"""The ``llmsim`` command: ``llmsim serve [flags]``.

One flag per setting of :class:`~llmsim.config.Config`, named by its kebab-case key and
built from the option groups' field metadata (help, metavar, default), plus ``--config
PATH`` (YAML).  Every problem with the command line, the environment or the YAML file
ends start-up with one line on stderr and exit status 2: the line names the key, so
that a launch script's log says what to fix.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
import textwrap
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from functools import partial
from typing import NoReturn

import trio

from llmsim import __version__
from llmsim.app import Simulator
from llmsim.config import (
    IGNORED_KEYS,
    SETTINGS,
    Config,
    ConfigError,
    Setting,
    format_duration,
    load_config,
    sections,
)
from llmsim.dataset_tool import build_dataset
from llmsim.latency_profiles import PROFILE_NAMES
from llmsim.logs import configure_logging
from llmsim.server import ServerHandle, serve

__all__ = ["build_parser", "config_from_args", "main", "parse_args", "reference_table", "run_server"]


def _fail(message: str) -> NoReturn:
    _say(f"llmsim: {_one_line(message)}")
    raise SystemExit(2)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _note(message: str) -> None:
    _say(f"llmsim: note: {message}")


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


_CONFIG_HELP = "YAML file of kebab-case keys (also LLMSIM_CONFIG)"

_EPILOG = """\
durations: 100ms, 1.5s, 1m30s or a bare number of milliseconds.
precedence: flags > environment > YAML file > --latency-profile > defaults.  Every
flag is also read from LLMSIM_<FLAG> (LLMSIM_TIME_TO_FIRST_TOKEN=100ms) and from the
YAML key <flag> (time-to-first-token: 100ms); SIM_MODEL sets --model too.
"""


def _is_switch(setting: Setting) -> bool:
    return setting.annotation is bool


def _is_list(setting: Setting) -> bool:
    return bool(setting.annotation == tuple[str, ...])


def _default_text(setting: Setting) -> str:
    """The default as ``--help`` and the flag table show it."""
    doc = setting.doc
    if doc.shown_default is not None:
        return doc.shown_default
    value = setting.default
    if doc.duration:
        return format_duration(value)
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "unset"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _flag(key: str) -> str:
    return "--" + key


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Flag help wrapped between words only, so that flag and profile names stay whole."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, like every other start-up error."""

    def error(self, message: str) -> NoReturn:
        _fail(f"error: {message} (see llmsim serve --help)")


def build_parser() -> argparse.ArgumentParser:
    """``llmsim [--version] serve [flags]``."""
    parser = _Parser(
        prog="llmsim",
        description="A vLLM-compatible LLM inference simulator.",
        epilog=textwrap.fill(
            "latency profiles (llmsim serve --latency-profile NAME): " + ", ".join(PROFILE_NAMES),
            88,
            break_on_hyphens=False,
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"llmsim {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    server = commands.add_parser(
        "serve",
        help="serve vLLM's OpenAI-compatible API over HTTP/1.1 and HTTP/2",
        description="Serve vLLM's OpenAI-compatible API over HTTP/1.1 and HTTP/2.",
        epilog=_EPILOG + _ignored_epilog(),
        formatter_class=_HelpFormatter,
        allow_abbrev=False,
        argument_default=argparse.SUPPRESS,
    )
    for title, settings in sections():
        group = server.add_argument_group(title)
        for setting in settings:
            _add_setting_flag(group, setting)
    config = server.add_argument_group("configuration file")
    config.add_argument("--config", dest="config_path", metavar="PATH", help=_help_text(_CONFIG_HELP, "none"))
    _add_ignored_flags(server)
    _add_dataset_command(commands)
    return parser


def _add_dataset_command(commands: argparse._SubParsersAction[_Parser]) -> None:
    """``llmsim dataset build SHAREGPT.json OUT.sqlite [--tokenizer PATH] [--table-name NAME]``."""
    dataset = commands.add_parser("dataset", help="build a SQLite dataset for --dataset-path", allow_abbrev=False)
    actions = dataset.add_subparsers(dest="dataset_action", metavar="ACTION", parser_class=_Parser, required=True)
    build = actions.add_parser(
        "build",
        help="a dataset from a ShareGPT-style JSON file, offline",
        description="Write the answers of a ShareGPT-style JSON file to a new SQLite file in "
        "llm-d-inference-sim's format, tokenized as llmsim serve with the same --tokenizer tokenizes.",
        allow_abbrev=False,
    )
    build.add_argument("source", metavar="SHAREGPT.json", help="[{conversations: [{from: human|gpt, value}]}]")
    build.add_argument("output", metavar="OUT.sqlite", help="the new file (an existing one is not overwritten)")
    build.add_argument("--tokenizer", metavar="PATH", help="a local HF tokenizer.json (default: the simulated one)")
    build.add_argument("--table-name", default="llmd", metavar="NAME", help="the table (default: llmd)")


def _add_setting_flag(group: argparse._ArgumentGroup, setting: Setting) -> None:
    flag, help_text = _flag(setting.key), _help_text(setting.doc.help, _default_text(setting))
    if _is_switch(setting):
        group.add_argument(flag, dest=setting.name, action=argparse.BooleanOptionalAction, help=help_text)
    elif _is_list(setting):
        group.add_argument(
            flag, dest=setting.name, metavar=setting.doc.metavar, nargs="+", action="extend", help=help_text
        )
    else:
        group.add_argument(flag, dest=setting.name, metavar=setting.doc.metavar or "VALUE", help=help_text)


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


#: Flags that take exactly one value (the ones whose value may start with '-').
_ONE_VALUE_FLAGS = frozenset(
    [_flag(setting.key) for setting in SETTINGS.values() if not (_is_switch(setting) or _is_list(setting))]
    + [_flag(key) for key, ignored in IGNORED_KEYS.items() if ignored.arity == "value"]
    + ["--config"]
)


def _attach_dash_values(argv: Sequence[str]) -> list[str]:
    """``--flag -5ms`` -> ``--flag=-5ms`` for flags that take one value.

    argparse takes any word that starts with a single '-' for an unknown option and
    reports "expected one argument"; attached, the value reaches the configuration,
    which says what is wrong with it.
    """
    attached: list[str] = []
    words = iter(argv)
    for word in words:
        if word in _ONE_VALUE_FLAGS:
            value = next(words, None)
            if value is not None and value.startswith("-") and not value.startswith("--") and value != "-h":
                attached.append(f"{word}={value}")
                continue
            attached.append(word)
            if value is not None:
                attached.append(value)
        else:
            attached.append(word)
    return attached


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The parsed command line ``argv`` (without the program name); usage errors exit 2."""
    return build_parser().parse_args(_attach_dash_values(argv))


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
    flags = {dest: value for dest, value in given.items() if dest in SETTINGS}
    return load_config(flags, environ=environ, config_path=given.get("config_path"), note=note)


def main(argv: Sequence[str] | None = None, *, environ: Mapping[str, str] | None = None) -> int:
    """Entry point of the ``llmsim`` command; returns the exit status."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        _fail("error: a command is required: llmsim serve [flags]")
    if args.command == "dataset":
        return _build_dataset(args)
    notes: list[str] = []
    try:
        config = config_from_args(args, environ, note=notes.append)
    except ConfigError as exc:
        _fail(str(exc))
    for note in notes:  # only once the configuration holds: an error stays one line
        _note(note)
    if config.server.workers != 1:
        from llmsim.workers.supervisor import run_workers  # it imports this module

        return run_workers(config)
    return run_server(config)


def _build_dataset(args: argparse.Namespace) -> int:
    try:
        rows = build_dataset(args.source, args.output, tokenizer=args.tokenizer, table=args.table_name)
    except ValueError as exc:
        _fail(f"dataset build: {exc}")
    _say(f"llmsim: wrote {rows} rows to {args.output} (table {args.table_name})")
    return 0


#: gc.set_threshold for `llmsim serve` (embedded servers leave the host process's GC alone).
SERVER_GC_THRESHOLDS = (50_000, 20, 100)


def _announce(config: Config, handle: ServerHandle) -> None:
    _say(f"llmsim serving {config.model.display_model} on {handle.url} (HTTP/1.1 + HTTP/2)")


def run_server(
    config: Config,
    *,
    setup: Callable[[Simulator], None] | None = None,
    announce: Callable[[Config, ServerHandle], None] = _announce,
) -> int:
    """Serve; the exit status: 0 after a graceful shutdown, 1 if serving failed, 2 for a
    configuration problem found only at start-up (an unreadable certificate or
    tokenizer), 128 + the signal number if a second signal cut the shutdown short.
    ``setup`` and ``announce`` are what a ``--workers`` worker adds (:mod:`llmsim.workers`)."""
    failure: BaseException | None = None
    status = 0
    # The server process is ours: with thousands of streams the default thresholds run a
    # full collection every few seconds (180-200 ms pauses that show up as ITL p99 and
    # 15-18 % of CPU at 2,000 streams, docs/performance.md); collect far less often.
    gc.set_threshold(*SERVER_GC_THRESHOLDS)
    configure_logging(config.control.log_level)  # the process is ours: embedded servers only emit records
    try:
        trio.run(_serve_until_signalled, config, setup, announce)
    except* ConfigError as group:
        failure, status = _first(group), 2
    except* OSError as group:
        failure, status = _first(group), 1
    except* KeyboardInterrupt:  # a Ctrl-C before the signal receiver was open
        status = 128 + signal.SIGINT
    if isinstance(failure, ConfigError):
        _say(f"llmsim: {_one_line(str(failure))}")
    elif failure is not None:
        _say(f"llmsim: cannot serve: {_one_line(str(failure))}")
    return status


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    leaf = group.exceptions[0]
    return _first(leaf) if isinstance(leaf, BaseExceptionGroup) else leaf


async def _serve_until_signalled(
    config: Config, setup: Callable[[Simulator], None] | None, announce: Callable[[Config, ServerHandle], None]
) -> None:
    """Serve until SIGINT or SIGTERM, then shut down gracefully; a second signal of
    either kind ends the process at once.

    The receiver is open before the server starts, so a signal during start-up is not
    lost, and it stays open until the server has stopped.
    """
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            server_scope = trio.CancelScope()
            nursery.start_soon(_watch_signals, signals, server_scope, config.server.shutdown_grace_period)
            with server_scope:
                async with trio.open_nursery() as server:
                    handle = await server.start(partial(serve, setup=setup), config)
                    announce(config, handle)
            nursery.cancel_scope.cancel()


async def _watch_signals(signals: AsyncIterator[int], server_scope: trio.CancelScope, grace: float) -> None:
    """The first signal starts the graceful shutdown (cancelling ``server_scope``); the
    next one exits the process with status 128 + its number.

    ``serve`` shields its graceful shutdown from cancellation, so nothing short of
    leaving the process cuts it short.
    """
    async for signum in signals:
        if not server_scope.cancel_called:
            _say(
                f"llmsim: shutting down; in-flight streams get up to {format_duration(grace)} "
                "(SIGINT or SIGTERM again to stop at once)"
            )
            server_scope.cancel()
        else:
            _say("llmsim: stopped at once by a second signal")
            sys.stdout.flush()
            os._exit(128 + signum)


def reference_table() -> str:
    """The Markdown flag table of README.md and docs/configuration.md (tests keep them equal)."""
    rows = ["| flag | default | meaning |", "|---|---|---|"]
    for _, settings in sections():
        rows += [_table_row(setting) for setting in settings]
    rows.append(f"| `--config PATH` | none | {_CONFIG_HELP} |")
    return "\n".join(rows) + "\n"


def _table_row(setting: Setting) -> str:
    metavar = setting.doc.metavar or "VALUE"
    if _is_switch(setting):
        flag = f"--[no-]{setting.key}"
    elif _is_list(setting):
        flag = f"--{setting.key} {metavar} [{metavar} ...]"
    else:
        flag = f"--{setting.key} {metavar}"
    shown = _default_text(setting)
    default = shown if setting.doc.shown_default is not None else f"`{shown}`"
    return f"| `{flag}` | {default} | {setting.doc.help} |"
