"""Dataset mode: answers from a SQLite file in llm-d-inference-sim's format.

The format (``pkg/dataset/sqlite_helper.go``): one table (``llmd`` unless
``--dataset-table-name`` says otherwise) with the columns ``id INTEGER``, ``prompt_hash
BLOB``, ``gen_tokens JSON`` and ``n_gen_tokens INTEGER``.  ``prompt_hash`` is the SHA-256
of the prompt's token ids written as little-endian uint32s (``pkg/dataset/utils.go``
``getInputHash``): the ids of the chat template applied to the messages for a chat
request, of the prompt text for a completion.  ``gen_tokens`` is the answer as
``{"Tokens": [ids], "Strings": [pieces]}`` (what Go writes for ``api.Tokenized``; the
keys are read in any case, and a bare list of pieces, the older format, is read too).

Which answer a request gets follows ``CustomDataset.GetResponseTokens``
(``pkg/dataset/custom_dataset.go``), with ``limit`` the request's output cap:

* rows for the prompt's hash: one of those no longer than ``limit``, else one of the
  longer ones, cut; with ``ignore_eos``, one exactly ``limit`` long, else a longer one
  cut, else a shorter one padded with corpus text;
* no row for it: any row no longer than ``limit`` (exactly ``limit`` with
  ``ignore_eos``), else any row, cut to ``limit`` (or, with ``ignore_eos``, padded).

llm-d picks "any row" with SQL's ``ORDER BY RANDOM()``; here every pick comes from the
request's RNG, so answers are reproducible under ``--seed``.  Lengths are the rows'
``n_gen_tokens``; the chosen answer's text (its pieces joined) is then tokenized with
llmsim's tokenizer like the corpus (:class:`llmsim.model.text.TextGenerator`), cut and
padded to the final length.

The table's hashes and lengths are read once, at start-up (:func:`load_dataset`); an
answer's tokens are read by rowid when it is chosen: from the file, opened read-only,
or, with ``--dataset-in-memory``, from a copy of the whole database made in memory at
start-up.  :func:`build_rows` and :func:`write_dataset` make such a file from a
ShareGPT-style JSON file (``llmsim dataset build``), as llm-d's ``cmd/dataset-tool``
does (``pkg/dataset/ds_tool.go``), but offline with llmsim's tokenizer.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import random
import shutil
import sqlite3
import struct
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import attrs

from llmsim.model.tokenizer import Tokenizer
from llmsim.options import ConfigError, ModelOptions

__all__ = [
    "COLUMNS",
    "Dataset",
    "build_rows",
    "download_dataset",
    "load_dataset",
    "open_dataset",
    "prompt_hash",
    "read_sharegpt",
    "write_dataset",
]

#: The columns llm-d-inference-sim checks, with their declared types (sqlite_helper.go:34-42).
COLUMNS = {"id": "INTEGER", "prompt_hash": "BLOB", "gen_tokens": "JSON", "n_gen_tokens": "INTEGER"}
_DOWNLOAD_TIMEOUT = 60.0  # seconds without a byte before a download gives up


def prompt_hash(token_ids: Sequence[int]) -> bytes:
    """llm-d's ``getInputHash``: SHA-256 of the ids as little-endian uint32s."""
    return hashlib.sha256(struct.pack(f"<{len(token_ids)}I", *(i & 0xFFFFFFFF for i in token_ids))).digest()


def _quoted(table: str) -> str:
    """The table name as an SQL identifier (any name, no injection)."""
    return '"' + table.replace('"', '""') + '"'


@attrs.frozen
class _Row:
    rowid: int
    length: int  # n_gen_tokens


class Dataset:
    """An open dataset: every row's hash and length in memory, its tokens read when chosen."""

    def __init__(self, connection: sqlite3.Connection, table: str, rows: Iterable[tuple[int, bytes, int]]) -> None:
        self._connection = connection
        self._select = f"SELECT gen_tokens FROM {_quoted(table)} WHERE rowid = ?"
        self._by_hash: dict[bytes, list[_Row]] = {}
        by_length: list[_Row] = []
        for rowid, digest, length in rows:
            row = _Row(rowid, length)
            self._by_hash.setdefault(digest, []).append(row)
            by_length.append(row)
        by_length.sort(key=lambda row: (row.length, row.rowid))
        self._by_length = by_length
        self._lengths = [row.length for row in by_length]

    def __len__(self) -> int:
        return len(self._by_length)

    def answer(self, rng: random.Random, prompt_ids: Sequence[int], limit: int, ignore_eos: bool) -> str | None:
        """The text of the answer chosen for a prompt (see the module docstring), before it
        is cut or padded to ``limit``; None if that row's tokens cannot be read."""
        rows = self._by_hash.get(prompt_hash(prompt_ids)) if prompt_ids else None
        row = self._for_prompt(rng, rows, limit, ignore_eos) if rows else self._any(rng, limit, ignore_eos)
        return self._text(row.rowid)

    @staticmethod
    def _for_prompt(rng: random.Random, rows: list[_Row], limit: int, ignore_eos: bool) -> _Row:
        shorter = [row for row in rows if row.length <= limit]
        longer = [row for row in rows if row.length > limit]
        if ignore_eos:
            exact = [row for row in shorter if row.length == limit]
            return rng.choice(exact or longer or shorter)
        return rng.choice(shorter or longer)

    def _any(self, rng: random.Random, limit: int, ignore_eos: bool) -> _Row:
        """A row no longer than ``limit`` (exactly that long with ``ignore_eos``), else any row."""
        low = bisect.bisect_left(self._lengths, limit) if ignore_eos else 0
        high = bisect.bisect_right(self._lengths, limit)
        if high > low:
            return self._by_length[rng.randrange(low, high)]
        return self._by_length[rng.randrange(len(self._by_length))]

    def _text(self, rowid: int) -> str | None:
        found = self._connection.execute(self._select, (rowid,)).fetchone()
        return None if found is None else _answer_text(found[0])


def _answer_text(value: object) -> str | None:
    """The text of a ``gen_tokens`` value (its pieces joined), None if it holds none."""
    try:
        tokens = json.loads(value) if isinstance(value, (str, bytes)) else None
    except ValueError:
        return None
    if isinstance(tokens, dict):
        tokens = next((item for key, item in tokens.items() if str(key).lower() == "strings"), None)
    if isinstance(tokens, list) and all(isinstance(piece, str) for piece in tokens):
        return "".join(tokens)
    return None


# --- opening a dataset at start-up --------------------------------------------------------------


def load_dataset(options: ModelOptions) -> Dataset | None:
    """The dataset ``options`` name (downloaded first if ``dataset-url`` says so and the file
    is missing), or None without ``dataset-path``.  Problems are ConfigErrors naming the key."""
    path = options.dataset_path
    if path is None:
        return None
    if options.dataset_url is not None and not os.path.exists(path):
        try:
            download_dataset(options.dataset_url, path)
        except ValueError as exc:
            raise ConfigError("dataset-url", str(exc)) from None
    try:
        return open_dataset(path, table=options.dataset_table_name, in_memory=options.dataset_in_memory)
    except ValueError as exc:
        raise ConfigError("dataset-path", str(exc)) from None


def open_dataset(path: str, *, table: str = "llmd", in_memory: bool = False) -> Dataset:
    """Open the SQLite dataset at ``path`` read-only (or copied into memory) and read its
    hashes and lengths; ValueError saying what is wrong with the file."""
    if not os.path.isfile(path):
        raise ValueError(f"no such file: {path}")
    connection = None
    try:
        connection = sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro", uri=True, check_same_thread=False)
        if in_memory:
            memory = sqlite3.connect(":memory:", check_same_thread=False)
            connection.backup(memory)
            connection.close()
            connection = memory
        _verify(connection, table, path)
        rows = connection.execute(f"SELECT rowid, prompt_hash, n_gen_tokens FROM {_quoted(table)}").fetchall()
    except sqlite3.Error as exc:
        if connection is not None:
            connection.close()
        raise ValueError(f"cannot read {path} as a SQLite dataset: {exc}") from None
    usable = [(rowid, bytes(digest), length) for rowid, digest, length in rows if _usable(digest, length)]
    if not usable:
        connection.close()
        raise ValueError(f"table {table!r} of {path} holds no answers")
    return Dataset(connection, table, usable)


def _usable(digest: object, length: object) -> bool:
    return isinstance(digest, bytes) and isinstance(length, int) and length >= 0


def _verify(connection: sqlite3.Connection, table: str, path: str) -> None:
    """llm-d's ``verifyDB``: the table has the four columns, of their declared types."""
    declared = {name: kind for _, name, kind, *_ in connection.execute(f"PRAGMA table_info({_quoted(table)})")}
    if not declared:
        raise ValueError(f"{path} has no table {table!r}")
    for name, kind in COLUMNS.items():
        if name not in declared:
            raise ValueError(f"table {table!r} of {path} has no column {name}")
        if str(declared[name]).upper() != kind:
            raise ValueError(f"column {name} of table {table!r} in {path} is {declared[name]}, not {kind}")


def download_dataset(url: str, path: str) -> None:
    """Download ``url`` to ``path`` with the standard library (llm-d's
    ``custom_dataset_downloader.go``: only when ``path`` does not exist; an empty or
    broken download leaves nothing behind).  ValueError says what went wrong."""
    partial = f"{path}.part"
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT) as response, open(partial, "wb") as out:
            shutil.copyfileobj(response, out, 1 << 20)
        if os.path.getsize(partial) == 0:
            raise ValueError(f"downloaded nothing from {url}")
        os.replace(partial, path)
    except (OSError, ValueError) as exc:  # urllib's URLError and HTTPError are OSErrors
        if os.path.exists(partial):
            os.remove(partial)
        raise ValueError(f"cannot download {url} to {path}: {exc}") from None


# --- building a dataset from ShareGPT-style conversations ----------------------------------------

#: A conversation as (question, answer) pairs, in order.
Conversation = list[tuple[str, str]]


def read_sharegpt(path: str) -> list[Conversation]:
    """The conversations of a ShareGPT-style JSON file: ``[{"id": ..., "conversations":
    [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}, ...]}]``.  Turns are
    read in human/gpt pairs up to the first pair that is not one (as ds_tool.go does).
    ValueError if the file is not such a list."""
    try:
        with open(path, encoding="utf-8") as file:
            records = json.load(file)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    if not isinstance(records, list):
        raise ValueError(f"{path} must hold a JSON array of conversations")
    return [_pairs(record.get("conversations")) for record in records if isinstance(record, dict)]


def _pairs(turns: object) -> Conversation:
    pairs: Conversation = []
    if not isinstance(turns, list):
        return pairs
    for human, gpt in zip(turns[::2], turns[1::2], strict=False):
        if not (_turn(human, "human") and _turn(gpt, "gpt")):
            break
        pairs.append((human["value"], gpt["value"]))
    return pairs


def _turn(turn: object, role: str) -> bool:
    return isinstance(turn, dict) and turn.get("from") == role and isinstance(turn.get("value"), str)


#: Token ids of a chat prompt of (role, content) messages, as the chat endpoint computes them.
ChatPromptIds = Callable[[Sequence[tuple[str, str]]], Sequence[int]]


def build_rows(
    conversations: Iterable[Conversation], tokenizer: Tokenizer, chat_prompt_ids: ChatPromptIds
) -> Iterator[tuple[bytes, bytes, int]]:
    """(prompt_hash, gen_tokens, n_gen_tokens) rows: for every turn of every conversation,
    one for the question as a completion prompt and one for the conversation so far as a
    chat prompt, both answered by that turn's answer (ds_tool.go
    ``conversationToOutputRecords``)."""
    for conversation in conversations:
        messages: list[tuple[str, str]] = []
        for question, answer in conversation:
            messages.append(("user", question))
            ids = tokenizer.encode(answer)
            tokens = json.dumps({"Tokens": ids, "Strings": tokenizer.tokenize(answer)}, separators=(",", ":"))
            for prompt in (tokenizer.encode(question, add_special_tokens=True), chat_prompt_ids(messages)):
                yield prompt_hash(prompt), tokens.encode(), len(ids)
            messages.append(("assistant", answer))


def write_dataset(path: str, rows: Iterable[tuple[bytes, bytes, int]], *, table: str = "llmd") -> int:
    """Write ``rows`` to a new SQLite file at ``path`` with llm-d's table (sqlite_helper.go
    ``getCreateTableQuery``); the number of rows.  An existing file is not overwritten."""
    if os.path.exists(path):
        raise ValueError(f"output file already exists: {path}")
    name = _quoted(table)
    connection = sqlite3.connect(path)
    try:
        with connection:
            connection.execute(
                f"CREATE TABLE {name} (id INTEGER PRIMARY KEY, prompt_hash BLOB NOT NULL, "
                "gen_tokens JSON NOT NULL, n_gen_tokens INTEGER NOT NULL)"
            )
            cursor = connection.executemany(
                f"INSERT INTO {name} (prompt_hash, gen_tokens, n_gen_tokens) VALUES (?, ?, ?)", rows
            )
            return cursor.rowcount
    finally:
        connection.close()
