"""``llmsim dataset build SHAREGPT.json OUT.sqlite``: a dataset for ``--dataset-path``.

llm-d-inference-sim's ``cmd/dataset-tool`` asks a vLLM render server to tokenize; this
builds the same SQLite file offline, with llmsim's tokenizer (the simulated one, or
``--tokenizer PATH``).  Chat prompts are tokenized by the chat endpoint's own code
(:func:`llmsim.api.chat.request.chat_prompt_ids` on a request of plain messages), so a
server with the same tokenizer finds the answers by the hashes it computes for a chat
request with those messages, or a completion request whose prompt is the question.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmsim.api.chat.request import chat_prompt_ids, parse_chat_request
from llmsim.model.dataset import build_rows, read_sharegpt, write_dataset
from llmsim.model.tokenizer import Tokenizer, load_tokenizer

__all__ = ["build_dataset"]


def build_dataset(source: str, output: str, *, tokenizer: str | None = None, table: str = "llmd") -> int:
    """Write the dataset of the ShareGPT-style JSON file ``source`` to the new SQLite file
    ``output``; the number of rows.  ValueError says what is wrong with either file."""
    loaded = load_tokenizer(tokenizer)
    conversations = read_sharegpt(source)

    def chat_ids(messages: Sequence[tuple[str, str]]) -> list[int]:
        return _chat_prompt_ids(loaded, messages)

    return write_dataset(output, build_rows(conversations, loaded, chat_ids), table=table)


def _chat_prompt_ids(tokenizer: Tokenizer, messages: Sequence[tuple[str, str]]) -> list[int]:
    request = parse_chat_request({"messages": [{"role": role, "content": content} for role, content in messages]})
    return chat_prompt_ids(tokenizer, request.messages, request.tools)
