"""Dataset mode (``--dataset-path``): answers from a SQLite file in llm-d-inference-sim's
format, chosen as its ``pkg/dataset/custom_dataset.go`` chooses them, through the real
router, engine and text generator on trio's mock clock; and ``llmsim dataset build``."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from trio.testing import MockClock

from llmsim.app import Simulator
from llmsim.cli import main
from llmsim.config import Config, ConfigError
from llmsim.dataset_tool import build_dataset
from llmsim.model.corpus import SENTENCES
from llmsim.model.dataset import open_dataset, prompt_hash
from llmsim.model.tokenizer import SimTokenizer
from tests.api.fakes import post, running, sse_payloads

ROOT = Path(__file__).resolve().parents[2]
SHORT = "Short answer here."  # 4 tokens of the simulated tokenizer
MEDIUM = "A medium answer with exactly eight tokens."  # 8
LONG = "This is the long answer, and it should hold at least fifteen tokens in all of it."  # 19
SHAREGPT = [
    {
        "id": "1",
        "conversations": [
            {"from": "human", "value": "What is the capital of France?"},
            {"from": "gpt", "value": LONG},
            {"from": "human", "value": "And of Italy?"},
            {"from": "gpt", "value": SHORT},
        ],
    },
    {
        "id": "2",
        "conversations": [
            {"from": "human", "value": "Tell me something."},
            {"from": "gpt", "value": MEDIUM},
            {"from": "gpt", "value": "not a human turn: the rest is skipped"},
            {"from": "human", "value": "Never read."},
        ],
    },
]
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


def tokens(text: str) -> list[str]:
    return SimTokenizer().tokenize(text)


@pytest.fixture
def dataset(tmp_path: Path) -> str:
    source = tmp_path / "sharegpt.json"
    source.write_text(json.dumps(SHAREGPT), encoding="utf-8")
    output = tmp_path / "answers.sqlite3"
    assert build_dataset(str(source), str(output)) == 2 * 3  # a completion and a chat row per turn
    return str(output)


def chat(messages: list[dict[str, str]], **fields: Any) -> dict[str, Any]:
    return {"model": "llmsim/sim-model", "messages": messages, **fields}


def completion(prompt: object, **fields: Any) -> dict[str, Any]:
    return {"model": "llmsim/sim-model", "prompt": prompt, **fields}


def test_lengths_of_the_answers() -> None:
    assert [len(tokens(text)) for text in (SHORT, MEDIUM, LONG)] == [4, 8, 19]


def test_prompt_hash_is_llmd_get_input_hash() -> None:
    """llm-d's own vector (pkg/dataset/custom_dataset_test.go:80-82): the Qwen2 ids of
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10" hash to 73205d2e..."""
    ids = [16, 11, 220, 17, 11, 220, 18, 11, 220, 19, 11, 220, 20, 11, 220, 21, 11, 220, 22, 11, 220]
    ids += [23, 11, 220, 24, 11, 220, 16, 15]
    assert prompt_hash(ids).hex() == "73205d2e432e6b117e0b75cdddeac019ee863f4b524f75bf57c15c5a47a445e4"


@pytest.mark.parametrize("in_memory", [False, True])
async def test_a_known_chat_prompt_gets_its_answer(autojump_clock: MockClock, dataset: str, in_memory: bool) -> None:
    async with running(dataset_path=dataset, dataset_in_memory=in_memory) as sim:
        first = await post(sim, "/v1/chat/completions", chat(FRANCE))
        history = [*FRANCE, {"role": "assistant", "content": LONG}, {"role": "user", "content": "And of Italy?"}]
        second = await post(sim, "/v1/chat/completions", chat(history, stream=True))
    body = first.json()
    assert body["choices"][0]["message"]["content"] == LONG
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == len(tokens(LONG)) + 1  # and its EOS token
    *chunks, done = sse_payloads(second.body)
    assert done == "[DONE]"
    assert "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks) == SHORT


async def test_a_known_completion_prompt_gets_its_answer(autojump_clock: MockClock, dataset: str) -> None:
    async with running(dataset_path=dataset) as sim:
        response = await post(sim, "/v1/completions", completion("Tell me something.", max_tokens=50))
    assert response.json()["choices"][0]["text"] == MEDIUM


async def test_messages_and_responses_answer_from_the_dataset(autojump_clock: MockClock, dataset: str) -> None:
    """Their prompts render the same conversation as chat does, so they hash the same."""
    async with running(dataset_path=dataset) as sim:
        message = await post(sim, "/v1/messages", {"model": "llmsim/sim-model", "max_tokens": 100, "messages": FRANCE})
        body = {"model": "llmsim/sim-model", "input": FRANCE[0]["content"]}
        response = await post(sim, "/v1/responses", body)
    assert message.json()["content"][0]["text"] == LONG
    assert response.json()["output"][0]["content"][0]["text"] == LONG


async def test_min_tokens_pads_a_shorter_answer(autojump_clock: MockClock, dataset: str) -> None:
    async with running(dataset_path=dataset) as sim:
        response = await post(sim, "/v1/completions", completion("And of Italy?", max_tokens=20, min_tokens=7))
    choice = response.json()["choices"][0]
    assert choice["text"].startswith(SHORT) and len(tokens(choice["text"])) == 7
    assert (choice["finish_reason"], response.json()["usage"]["completion_tokens"]) == ("stop", 8)  # and its EOS


async def test_max_tokens_cuts_the_answer(autojump_clock: MockClock, dataset: str) -> None:
    async with running(dataset_path=dataset) as sim:
        response = await post(sim, "/v1/chat/completions", chat(FRANCE, max_tokens=5))
    choice = response.json()["choices"][0]
    assert choice["message"]["content"] == "".join(tokens(LONG)[:5])
    assert choice["finish_reason"] == "length"
    assert response.json()["usage"]["completion_tokens"] == 5


async def test_ignore_eos_pads_a_short_answer_with_corpus_text(autojump_clock: MockClock, dataset: str) -> None:
    async with running(dataset_path=dataset) as sim:
        response = await post(sim, "/v1/completions", completion("And of Italy?", max_tokens=12, ignore_eos=True))
    choice = response.json()["choices"][0]
    assert choice["text"].startswith(SHORT)
    assert any(sentence.startswith(choice["text"][len(SHORT) :]) for sentence in SENTENCES)
    assert (choice["finish_reason"], response.json()["usage"]["completion_tokens"]) == ("length", 12)


@pytest.mark.parametrize(
    ("max_tokens", "ignore_eos", "expected"),
    [
        (6, False, {SHORT}),  # the only answer no longer than the cap
        (10, False, {SHORT, MEDIUM}),
        (8, True, {MEDIUM}),  # ignore_eos: one exactly as long as the cap
    ],
)
async def test_a_miss_falls_back_to_an_answer_that_fits(
    autojump_clock: MockClock, dataset: str, max_tokens: int, ignore_eos: bool, expected: set[str]
) -> None:
    """No row for the prompt: any row no longer than the cap (exactly the cap with
    ignore_eos), as llm-d's getResponsesForLen (sqlite_helper.go:289-296)."""
    seen = set()
    async with running(dataset_path=dataset) as sim:
        for k in range(12):
            body = completion(f"An unknown prompt number {k}", max_tokens=max_tokens, ignore_eos=ignore_eos)
            seen.add((await post(sim, "/v1/completions", body)).json()["choices"][0]["text"])
    assert seen == expected


async def test_a_miss_with_no_answer_short_enough_cuts_one(autojump_clock: MockClock, dataset: str) -> None:
    async with running(dataset_path=dataset) as sim:
        response = await post(sim, "/v1/completions", completion("Unknown", max_tokens=3))
    choice = response.json()["choices"][0]
    assert any(choice["text"] == "".join(tokens(text)[:3]) for text in (SHORT, MEDIUM, LONG))
    assert choice["finish_reason"] == "length"


async def test_a_file_in_llmd_format_answers_a_token_id_prompt(autojump_clock: MockClock, tmp_path: Path) -> None:
    """The first row of llm-d's pkg/dataset/.llm-d/test.valid.sqlite3, as its dataset tool
    writes it (gen_tokens a BLOB of Go's {"Tokens", "Strings"}); the prompt as the ids
    that hash to it."""
    path = tmp_path / "llmd.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE llmd (id INTEGER PRIMARY KEY, prompt_hash BLOB NOT NULL, gen_tokens JSON NOT NULL, "
            "n_gen_tokens INTEGER NOT NULL)"
        )
        answer = b'{"Tokens":[9707,3738,0],"Strings":["Hello"," human","!"]}'
        digest = bytes.fromhex("73205d2e432e6b117e0b75cdddeac019ee863f4b524f75bf57c15c5a47a445e4")
        db.execute("INSERT INTO llmd (prompt_hash, gen_tokens, n_gen_tokens) VALUES (?, ?, 3)", (digest, answer))
    db.close()
    ids = [16, 11, 220, 17, 11, 220, 18, 11, 220, 19, 11, 220, 20, 11, 220, 21, 11, 220, 22, 11, 220]
    async with running(dataset_path=str(path)) as sim:
        response = await post(sim, "/v1/completions", completion([*ids, 23, 11, 220, 24, 11, 220, 16, 15]))
    assert response.json()["choices"][0]["text"] == "Hello human!"


def test_answers_are_reproducible_under_a_seed(dataset: str) -> None:
    opened = open_dataset(dataset)
    picks = [[opened.answer(random.Random(seed), [1, 2, 3], 10, False) for seed in range(8)] for _ in range(2)]
    assert picks[0] == picks[1]
    assert set(picks[0]) == {SHORT, MEDIUM}


# --- bad files are start-up errors ----------------------------------------------------------------


def _table(path: Path, create: str) -> str:
    with sqlite3.connect(path) as db:
        db.execute(create)
    db.close()
    return str(path)


def _bad_files(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """The failures of llm-d's invalid fixtures (pkg/dataset/.llm-d/test.invalid*.sqlite3)."""
    not_sqlite = tmp_path / "not.sqlite3"
    not_sqlite.write_text("not a database", encoding="utf-8")
    columns = "prompt_hash BLOB, gen_tokens JSON, n_gen_tokens INTEGER"
    return {
        "missing": (str(tmp_path / "absent.sqlite3"), "no such file"),
        "not-sqlite": (str(not_sqlite), "cannot read"),
        "no-table": (_table(tmp_path / "t.sqlite3", f"CREATE TABLE llmdx (id INTEGER, {columns})"), "no table 'llmd'"),
        "no-column": (_table(tmp_path / "c.sqlite3", f"CREATE TABLE llmd ({columns})"), "has no column id"),
        "bad-type": (
            _table(tmp_path / "y.sqlite3", "CREATE TABLE llmd (id INTEGER, prompt_hash BLOB, gen_tokens TEXT, n INT)"),
            "column gen_tokens of table 'llmd'",
        ),
        "empty": (_table(tmp_path / "e.sqlite3", f"CREATE TABLE llmd (id INTEGER, {columns})"), "holds no answers"),
    }


@pytest.mark.parametrize("problem", ["missing", "not-sqlite", "no-table", "no-column", "bad-type", "empty"])
async def test_an_unusable_dataset_is_a_configuration_error(tmp_path: Path, problem: str) -> None:
    path, message = _bad_files(tmp_path)[problem]
    with pytest.raises(ConfigError) as caught:
        Simulator(Config(dataset_path=path))
    assert caught.value.key == "dataset-path"
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.slow
def test_process_reports_an_unusable_dataset_in_one_line(tmp_path: Path) -> None:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "llmsim", "serve", "--port", "0", "--dataset-path", str(tmp_path / "absent.sqlite3")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": path},
        check=False,
    )
    lines = [line for line in done.stderr.splitlines() if not line.startswith("llmsim: note: ")]
    assert done.returncode == 2
    assert len(lines) == 1 and lines[0].startswith("llmsim: invalid configuration: dataset-path: no such file"), lines


def test_echo_mode_refuses_a_dataset() -> None:
    with pytest.raises(ConfigError, match="dataset-path: a dataset cannot be used in echo mode"):
        Config(mode="echo", dataset_path="answers.sqlite3")


def test_a_url_needs_a_path() -> None:
    with pytest.raises(ConfigError, match="dataset-url: dataset-path is required"):
        Config(dataset_url="https://example.com/answers.sqlite3")


async def test_a_missing_file_is_downloaded_from_the_url(dataset: str, tmp_path: Path) -> None:
    """A file:// URL: the download path, without a network."""
    target = tmp_path / "downloaded" / "answers.sqlite3"
    Simulator(Config(dataset_path=str(target), dataset_url=Path(dataset).as_uri()))
    assert target.read_bytes() == Path(dataset).read_bytes()


async def test_an_existing_file_is_not_downloaded_again(dataset: str) -> None:
    Simulator(Config(dataset_path=dataset, dataset_url="http://127.0.0.1:9/unreachable.sqlite3"))


async def test_a_failed_download_is_a_configuration_error(tmp_path: Path) -> None:
    target = tmp_path / "answers.sqlite3"
    with pytest.raises(ConfigError) as caught:
        Simulator(Config(dataset_path=str(target), dataset_url=(tmp_path / "nowhere.sqlite3").as_uri()))
    assert caught.value.key == "dataset-url"
    assert not target.exists() and not list(tmp_path.iterdir())


# --- llmsim dataset build ---------------------------------------------------------------------------


def test_the_build_command_writes_a_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "sharegpt.json"
    source.write_text(json.dumps(SHAREGPT), encoding="utf-8")
    output = tmp_path / "out.sqlite3"
    assert main(["dataset", "build", str(source), str(output), "--table-name", "answers"]) == 0
    assert "wrote 6 rows" in capsys.readouterr().err
    opened = open_dataset(str(output), table="answers")
    assert len(opened) == 6
    completion_hash = prompt_hash(SimTokenizer().encode("Tell me something."))
    with sqlite3.connect(output) as db:
        (raw,) = db.execute("SELECT gen_tokens FROM answers WHERE prompt_hash = ?", (completion_hash,)).fetchone()
    db.close()
    assert json.loads(raw)["Strings"] == tokens(MEDIUM)


def test_the_build_command_never_overwrites(dataset: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "sharegpt.json"
    with pytest.raises(SystemExit) as exited:
        main(["dataset", "build", str(source), dataset])
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"llmsim: dataset build: output file already exists: {dataset}\n"
