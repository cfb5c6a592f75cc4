"""The chat request's prompt: plain conversations' prompt text is remembered."""

from __future__ import annotations

from llmsim.api.chat.request import ChatMessage, ContentPart, _plain_prompt, chat_prompt_ids, chat_turns
from llmsim.api.prompts import prompt_ids
from llmsim.model.tokenizer import SimTokenizer, render_chat


def test_plain_conversation_prompt_is_the_chatml_rendering_and_remembered() -> None:
    messages = (ChatMessage("system", "Be brief."), ChatMessage("user", "Hello there"), ChatMessage("assistant"))
    text = _plain_prompt(messages)
    assert text == render_chat(chat_turns(messages))
    again = (ChatMessage("system", "Be brief."), ChatMessage("user", "Hello there"), ChatMessage("assistant"))
    assert _plain_prompt(again) is text  # an equal conversation, another request: remembered


def test_other_conversations_are_not_remembered_but_rendered_alike() -> None:
    tokenizer = SimTokenizer()
    parts = (ChatMessage("user", (ContentPart("text", "Hi"), ContentPart("text", "there"))),)
    long = (ChatMessage("user", "word " * 2000),)
    # What a request may hold besides contents counts too: an entry stays a few KB.
    long_role = (ChatMessage("r" * 5000, "hi"),)
    long_tool_call_id = (ChatMessage("tool", "hi", tool_call_id="c" * 5000),)
    many = tuple(ChatMessage("user", "") for _ in range(33))
    for messages in (parts, long, long_role, long_tool_call_id, many):
        assert _plain_prompt(messages) is None
        assert chat_prompt_ids(tokenizer, messages) == prompt_ids(tokenizer, chat_turns(messages))
    plain = (ChatMessage("user", "Hello there"),)
    assert chat_prompt_ids(tokenizer, plain) == prompt_ids(tokenizer, chat_turns(plain))


def test_the_remembered_prompt_is_keyed_by_what_the_rendering_reads() -> None:
    first = (ChatMessage("tool", "42", tool_call_id="call-1"), ChatMessage("user", None))
    text = _plain_prompt(first)
    assert text == render_chat(chat_turns(first))
    # the rendering reads roles and contents only: the same text, remembered
    assert _plain_prompt((ChatMessage("tool", "42", tool_call_id="call-2"), ChatMessage("user", None))) is text
    for other in (
        (ChatMessage("tool", "42"), ChatMessage("user", "")),  # None and "" render alike, remembered apart
        (ChatMessage("user", "42"), ChatMessage("tool", None)),
        (ChatMessage("tool", "42user"),),
    ):
        assert _plain_prompt(other) == render_chat(chat_turns(other))
