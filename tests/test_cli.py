"""The ``llmsim`` command line: flags, errors (one line, exit 2), help, and a real run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from llmsim import __version__
from llmsim.app import Simulator
from llmsim.cli import config_from_args, main, parse_args, reference_table
from llmsim.config import IGNORED_KEYS, SETTINGS, Config, ConfigError, format_duration
from tests.test_config import LLMD_KEYS, LLMD_RETIRED_KEYS

ROOT = Path(__file__).resolve().parents[1]


def _parse(argv: list[str], environ: dict[str, str] | None = None) -> tuple[Config, list[str]]:
    """The Config of ``llmsim serve <argv>``, and the notes it printed."""
    notes: list[str] = []
    args = parse_args(["serve", *argv])
    return config_from_args(args, environ or {}, note=notes.append), notes


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str], environ: dict[str, str] | None = None) -> str:
    """Run ``main``, expect exit status 2, and return its single stderr line."""
    with pytest.raises(SystemExit) as caught:
        main(argv, environ=environ or {})
    assert caught.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("llmsim: ")
    return lines[0]


# --- flags -------------------------------------------------------------------------------


def test_no_flags_means_defaults() -> None:
    config, notes = _parse([])
    assert config == Config()
    assert notes == []


def test_every_setting_has_a_flag() -> None:
    """Each flag given its default value, as a user would spell it, gives the default Config."""
    argv = []
    for setting in SETTINGS.values():
        flag, value = "--" + setting.key, setting.default
        if isinstance(value, bool):
            argv.append(flag if value else flag.replace("--", "--no-", 1))
        elif setting.doc.duration:
            argv += [flag, format_duration(value)]
        elif value not in (None, ()):  # unset optional fields and the alias list: no value to spell
            argv += [flag, str(value)]
    assert _parse(argv)[0] == Config()


def test_durations_and_numbers() -> None:
    config, _ = _parse(
        ["--time-to-first-token", "100ms", "--inter-token-latency=1.5s", "--prefill-time-per-token", "2"]
    )
    assert config.latency.time_to_first_token == pytest.approx(0.1)
    assert config.latency.inter_token_latency == pytest.approx(1.5)
    assert config.latency.prefill_time_per_token == pytest.approx(0.002)


def test_served_model_name_aliases() -> None:
    config, _ = _parse(["--model", "base", "--served-model-name", "a", "b", "c"])
    assert config.model.served_model_name == ("a", "b", "c")
    assert config.model.display_model == "a"
    config, _ = _parse(["--served-model-name", "a", "--served-model-name", "b"])
    assert config.model.model_names == ("a", "b")


def test_boolean_flags_and_their_no_forms() -> None:
    assert _parse(["--self-signed-certs"])[0].server.self_signed_certs is True
    assert _parse(["--no-self-signed-certs"], {"LLMSIM_SELF_SIGNED_CERTS": "true"})[0].server.self_signed_certs is False
    assert _parse([], {"LLMSIM_SELF_SIGNED_CERTS": "true"})[0].server.self_signed_certs is True


def test_precedence_flags_over_environment_over_yaml(tmp_path: Path) -> None:
    path = tmp_path / "llmsim.yaml"
    path.write_text("port: 1001\nmode: echo\nmodel: from-yaml\n", encoding="utf-8")
    environ = {"LLMSIM_PORT": "2002", "SIM_MODEL": "from-env"}
    config, _ = _parse(["--config", str(path), "--port", "3003"], environ)
    assert (config.server.port, config.model.name, config.model.mode) == (3003, "from-env", "echo")


def test_ignored_flags_are_accepted_with_a_note() -> None:
    argv = ["--tensor-parallel-size", "2", "--enable-prefix-caching", "--no-enforce-eager", "--dtype", "half"]
    config, notes = _parse(argv)
    assert config == Config()
    assert [note.split(":")[0] for note in notes] == [
        "ignoring --tensor-parallel-size",
        "ignoring --enable-prefix-caching",
        "ignoring --enforce-eager",
        "ignoring --dtype",
    ]


# --- errors: one line naming the key, exit status 2 --------------------------------------


@pytest.mark.parametrize(
    ("argv", "key"),
    [
        (["--port", "http"], "port"),
        (["--port", "-1"], "port"),
        (["--time-to-first-token", "soon"], "time-to-first-token"),
        (["--time-to-first-token=-5ms"], "time-to-first-token"),
        (["--time-to-first-token-std-dev", "50ms"], "time-to-first-token-std-dev"),
        (["--mode", "chaos"], "mode"),
        (["--server", "uvicorn"], "server"),
        (["--max-num-seqs", "0"], "max-num-seqs"),
        (["--seed", "1.5"], "seed"),
        (["--time-factor-under-load", "0.5"], "time-factor-under-load"),
        (["--ssl-certfile", "/nonexistent/cert.pem", "--ssl-keyfile", "/nonexistent/key.pem"], "ssl-certfile"),
        (["--ssl-certfile", "/nonexistent/cert.pem"], "ssl-certfile"),
        (["--inter-token-latency", "-5ms"], "inter-token-latency"),
        (["--max-num-seqs", "-3"], "max-num-seqs"),
        (["--config", "-x.yaml"], "config"),
    ],
)
def test_invalid_flag_values(argv: list[str], key: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = _fails(["serve", *argv], capsys)
    assert line.startswith(f"llmsim: invalid configuration: {key}: ")


def test_a_negative_duration_is_one_line_about_the_value(capsys: pytest.CaptureFixture[str]) -> None:
    line = _fails(["serve", "--inter-token-latency", "-5ms"], capsys)
    assert line == (
        "llmsim: invalid configuration: inter-token-latency: duration must be finite and non-negative, got '-5ms'"
    )


def test_invalid_environment_value(capsys: pytest.CaptureFixture[str]) -> None:
    line = _fails(["serve"], capsys, {"LLMSIM_INTER_TOKEN_LATENCY": "quick", "LLMSIM_UNKNOWN": "x"})
    assert line.startswith("llmsim: invalid configuration: inter-token-latency: ")
    assert line.endswith("(from LLMSIM_INTER_TOKEN_LATENCY)")


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("time-to-first-tokn: 1s\n", "time-to-first-tokn"),
        ("port: eighty\n", "port"),
        ("[port, 8000]\n", "config"),
        ("port: [1\n", "config"),
    ],
)
def test_invalid_yaml(text: str, key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "llmsim.yaml"
    path.write_text(text, encoding="utf-8")
    line = _fails(["serve", "--config", str(path)], capsys)
    assert line.startswith(f"llmsim: invalid configuration: {key}: ")


def test_missing_yaml_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _fails(["serve", "--config", str(tmp_path / "absent.yaml")], capsys)
    assert line.startswith("llmsim: invalid configuration: config: cannot read ")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["serve", "--tensor-parallel"], "--tensor-parallel"),  # no abbreviations
        (["serve", "--time-to-first-tokn", "1s"], "--time-to-first-tokn"),
        (["serve", "--port"], "--port"),
        (["serve", "--self-signed-certs=yes"], "--self-signed-certs"),
        (["serve", "extra"], "extra"),
        (["frobnicate"], "frobnicate"),
        ([], "command"),
    ],
)
def test_usage_errors(argv: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = _fails(argv, capsys)
    assert line.startswith("llmsim: error: ")
    assert words in line


# --- version, help and the docs ---------------------------------------------------------


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--version"])
    assert caught.value.code == 0
    assert capsys.readouterr().out == f"llmsim {__version__}\n"


def _serve_help(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as caught:
        main(["serve", "--help"])
    assert caught.value.code == 0
    return capsys.readouterr().out


def test_help_lists_every_flag_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    text = " ".join(_serve_help(capsys).split())
    for setting in SETTINGS.values():
        assert f"--{setting.key}" in text
    assert text.count("(default: ") == len(SETTINGS) + 1  # and --config
    assert "--no-self-signed-certs" in text
    assert "--time-to-first-token DURATION" in text
    assert "--mode {random,echo}" in text
    assert "(default: 10s)" in text  # durations carry their unit
    for key in IGNORED_KEYS:
        assert f"--{key}," in text or f"--{key}." in text


def test_help_defaults_read_as_words(capsys: pytest.CaptureFixture[str]) -> None:
    """No "(default: None)", and no parentheses inside a default's own."""
    defaults = re.findall(r"\(default: ([^)]*)\)", " ".join(_serve_help(capsys).split()))
    assert len(defaults) == len(SETTINGS) + 1
    assert "None" not in defaults
    assert not [default for default in defaults if "(" in default]
    assert "8192 or max-num-seqs if larger" in defaults


def test_reference_table_covers_every_setting() -> None:
    table = reference_table()
    for setting in SETTINGS.values():
        assert f"`--{setting.key} " in table or f"`--[no-]{setting.key}`" in table
    assert "None" not in table
    assert len(table.splitlines()) == len(SETTINGS) + 3  # header, rule, --config


@pytest.mark.parametrize("document", ["README.md", "docs/configuration.md"])
def test_documents_carry_the_current_reference_table(document: str) -> None:
    """Regenerate with: python -c 'from llmsim.cli import reference_table; print(reference_table())'."""
    assert reference_table() in (ROOT / document).read_text(encoding="utf-8")


def test_configuration_doc_lists_exactly_the_ignored_keys() -> None:
    text = (ROOT / "docs/configuration.md").read_text(encoding="utf-8")
    section = text.split("## Accepted for compatibility, and ignored")[1].split("\n## ")[0]
    assert set(re.findall(r"`--([a-z0-9-]+)`", section)) == set(IGNORED_KEYS)


def _llmd_argv() -> list[str]:
    """Every flag of llm-d-inference-sim (tests/test_config.py: LLMD_KEYS), each with a value."""
    by_key = {setting.key: setting for setting in SETTINGS.values()}
    argv = []
    for key in (*LLMD_KEYS, *LLMD_RETIRED_KEYS):
        if key in by_key and by_key[key].default is not None and by_key[key].default != ():
            setting = by_key[key]
            value = format_duration(setting.default) if setting.doc.duration else setting.default
            argv += [f"--{key}"] if isinstance(value, bool) else [f"--{key}", str(value)]
        elif key in IGNORED_KEYS:
            arity = IGNORED_KEYS[key].arity
            argv += [f"--{key}"] if arity == "switch" else [f"--{key}", "1"]
    return argv


def test_every_llmd_flag_is_accepted() -> None:
    argv = _llmd_argv()
    config, notes = _parse([word for word in argv if word != "--self-signed-certs"])
    switched_on = {
        setting.name: True
        for setting in SETTINGS.values()
        if setting.default is False and f"--{setting.key}" in argv and setting.key != "self-signed-certs"
    }
    assert config == Config(**switched_on)
    noted = {note.split(":")[0].removeprefix("ignoring --") for note in notes}
    assert noted == set(IGNORED_KEYS) & {*LLMD_KEYS, *LLMD_RETIRED_KEYS}
    assert {"tokenizers-cache-dir", "zmq-max-connect-attempts"} <= noted


# --- a real process ------------------------------------------------------------------------


async def _open_llmsim(*argv: str) -> trio.Process:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return await trio.lowlevel.open_process(
        [sys.executable, "-m", "llmsim", *argv],
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": path},
        cwd=ROOT,
    )


async def _read_until(stream: trio.abc.ReceiveStream, marker: bytes, received: bytes = b"") -> bytes:
    """``received`` plus everything read until a complete line holding ``marker`` (or EOF)."""
    while not any(marker in line for line in received.splitlines(keepends=True) if line.endswith(b"\n")):
        chunk = await stream.receive_some()
        if not chunk:
            break
        received += chunk
    return received


async def _wait_for_line(stream: trio.abc.ReceiveStream, marker: bytes, received: bytes = b"") -> bytes:
    """Like :func:`_read_until`, but EOF before the line is a failure."""
    received = await _read_until(stream, marker, received)
    assert marker in received, f"no line with {marker!r} before EOF: {received.decode(errors='replace')}"
    return received


@pytest.mark.slow
@pytest.mark.parametrize(
    ("first", "second"),
    [(signal.SIGINT, signal.SIGINT), (signal.SIGTERM, signal.SIGINT), (signal.SIGINT, signal.SIGTERM)],
)
async def test_a_second_signal_cuts_the_graceful_shutdown_short(first: signal.Signals, second: signal.Signals) -> None:
    """A stream that would run 100 s holds the shutdown (grace period 1 min): the second
    signal must end the process at once, not when the grace period is over."""
    process = await _open_llmsim(
        "serve", "--port", "0", "--inter-token-latency", "100ms", "--shutdown-grace-period", "1m"
    )
    assert process.stderr is not None
    try:
        with trio.fail_after(60):
            received = await _wait_for_line(process.stderr, b"llmsim serving ")
        url = re.search(rb" on (http://\S+) ", received)
        assert url is not None, received
        body = {"prompt": "hi", "max_tokens": 1000, "ignore_eos": True, "stream": True}
        async with (
            httpx.AsyncClient(base_url=url[1].decode()) as client,
            client.stream("POST", "/v1/completions", json=body) as response,
        ):
            chunks = response.aiter_bytes()
            await chunks.__anext__()  # the stream is in flight
            process.send_signal(first)
            with trio.fail_after(30):
                received = await _wait_for_line(process.stderr, b"llmsim: shutting down", received)
                await chunks.__anext__()  # and still streaming: the shutdown waits for it
            process.send_signal(second)
            with trio.fail_after(10):
                status = await process.wait()
                received += await _read_until(process.stderr, b"\x00never\x00")
        assert status == 128 + second, received.decode(errors="replace")
        assert b"llmsim: stopped at once by a second signal" in received
        assert b"Traceback" not in received
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
async def test_serve_then_shut_down_gracefully_on_signal(signum: signal.Signals) -> None:
    process = await _open_llmsim("serve", "--port", "0", "--model", "cli-model")
    assert process.stderr is not None
    try:
        with trio.fail_after(60):
            received = await _read_until(process.stderr, b"llmsim serving ")
        match = re.search(rb"^llmsim serving cli-model on (http://\S+) \(HTTP/1\.1 \+ HTTP/2\)$", received, re.M)
        assert match is not None, received.decode(errors="replace")
        async with httpx.AsyncClient(base_url=match[1].decode()) as client:
            response = await client.get("/health")
        assert response.status_code == 200
        process.send_signal(signum)
        with trio.fail_after(30):
            status = await process.wait()
            rest = await _read_until(process.stderr, b"\x00never\x00")
        assert status == 0, (received + rest).decode(errors="replace")
        assert b"Traceback" not in rest
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def _run_to_exit(*argv: str) -> tuple[int, list[str]]:
    """Run ``llmsim <argv>`` until it exits: its status and its stderr lines, notes left out."""
    process = await _open_llmsim(*argv)
    assert process.stderr is not None
    with trio.fail_after(60):
        received = await _read_until(process.stderr, b"\x00never\x00")
        status = await process.wait()
    return status, [line for line in received.decode().splitlines() if not line.startswith("llmsim: note: ")]


@pytest.mark.slow
async def test_process_reports_a_bad_flag_in_one_line() -> None:
    assert await _run_to_exit("serve", "--inter-token-latency", "quick") == (
        2,
        [
            "llmsim: invalid configuration: inter-token-latency: "
            "expected a duration such as 100ms, 1.5s or a number of milliseconds, got 'quick'"
        ],
    )


@pytest.mark.parametrize("problem", ["missing", "not-json"])
async def test_an_unusable_tokenizer_is_a_configuration_error(tmp_path: Path, problem: str) -> None:
    path = tmp_path / "tokenizer.json"
    if problem == "not-json":
        path.write_text("not a tokenizer\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        Simulator(Config(tokenizer=str(path)))
    assert caught.value.key == "tokenizer"
    assert str(path) in str(caught.value)


@pytest.mark.slow
async def test_process_reports_an_unusable_tokenizer_in_one_line(tmp_path: Path) -> None:
    status, lines = await _run_to_exit("serve", "--port", "0", "--tokenizer", str(tmp_path / "absent.json"))
    assert status == 2
    assert len(lines) == 1 and lines[0].startswith("llmsim: invalid configuration: tokenizer: "), lines
    assert "absent.json" in lines[0]


@pytest.mark.slow
async def test_process_reports_an_unusable_certificate_in_one_line(tmp_path: Path) -> None:
    """Files that exist but hold no certificate are found out only when serving starts."""
    bogus = tmp_path / "bogus.pem"
    bogus.write_text("not a certificate\n", encoding="utf-8")
    status, lines = await _run_to_exit(
        "serve", "--port", "0", "--ssl-certfile", str(bogus), "--ssl-keyfile", str(bogus)
    )
    assert status == 2
    assert len(lines) == 1 and lines[0].startswith("llmsim: invalid configuration: ssl-certfile: "), lines


@pytest.mark.slow
async def test_process_reports_a_busy_port_in_one_line() -> None:
    with trio.socket.socket() as busy:
        await busy.bind(("127.0.0.1", 0))
        busy.listen()
        status, lines = await _run_to_exit("serve", "--port", str(busy.getsockname()[1]))
    assert status == 1
    assert len(lines) == 1 and lines[0].startswith("llmsim: cannot serve: "), lines
