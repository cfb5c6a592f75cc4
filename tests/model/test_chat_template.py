"""The model's own chat template, rendered as transformers renders it
(``transformers/utils/chat_template_utils.py``: ``_compile_jinja_template``,
``render_jinja_template``), and loaded from a tokenizer directory without any fetch.

Every expected string is derived by hand from the template text in ``hf_dir.py``."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest

from llmsim.model.chat_template import ChatTemplate, ChatTemplateError, content_format, load_chat_template
from llmsim.model.tokenizer import ChatTurn, HFTokenizer, load_tokenizer
from tests.model.hf_dir import ALTERNATING, BOS, LLAMA3, QWEN, VISION, build_tokenizer_dir

HEADER = "<|start_header_id|>{}<|end_header_id|>\n\n"


def llama(**special: Any) -> ChatTemplate:
    return ChatTemplate({"default": LLAMA3}, {"bos_token": BOS, **special})


def test_llama3_conversation_with_the_generation_prompt() -> None:
    """BOS from the config before the first message, each message trimmed, then the
    assistant header."""
    messages = [{"role": "system", "content": "Be brief. "}, {"role": "user", "content": " Hello there"}]
    assert llama().render(messages) == (
        BOS
        + HEADER.format("system")
        + "Be brief.<|eot_id|>"
        + HEADER.format("user")
        + "Hello there<|eot_id|>"
        + HEADER.format("assistant")
    )
    assert llama().render(messages, add_generation_prompt=False).endswith("Hello there<|eot_id|>")


def test_qwen_tools_tool_calls_and_results() -> None:
    """Tools as ``tojson`` lines (``json.dumps``: ``", "`` and ``": "``, no ASCII
    escaping), an earlier call's arguments as an object, its result as a user turn."""
    tool = {
        "type": "function",
        "function": {"name": "get_weather", "description": "Météo <now>", "parameters": {"type": "object"}},
    }
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": '{"temp": 21}', "tool_call_id": "c1"},
    ]
    rendered = ChatTemplate({"default": QWEN}).render(messages, tools=[tool])
    assert rendered == (
        "<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n\n<tools>\n"
        '{"type": "function", "function": {"name": "get_weather", "description": "Météo <now>", '
        '"parameters": {"type": "object"}}}\n</tools><|im_end|>\n'
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        "<|im_end|>\n"
        '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n"
    )


def test_qwen_without_tools_adds_its_default_system_prompt() -> None:
    rendered = ChatTemplate({"default": QWEN}).render([{"role": "user", "content": "Hi"}])
    assert rendered == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_continue_final_message_cuts_where_the_message_ends() -> None:
    """transformers marks the final text with ``CONTINUE_FINAL_MESSAGE_TAG `` and cuts
    there: exactly, when the template keeps the text as it is (Qwen), or with trailing
    blanks stripped, when it trims the message (Llama 3)."""
    messages = [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "One, two, "}]
    qwen = ChatTemplate({"default": QWEN}).render(messages, add_generation_prompt=False, continue_final_message=True)
    assert qwen == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nCount<|im_end|>\n"
        "<|im_start|>assistant\nOne, two, "
    )
    trimmed = llama().render(messages, add_generation_prompt=False, continue_final_message=True)
    assert trimmed == BOS + HEADER.format("user") + "Count<|eot_id|>" + HEADER.format("assistant") + "One, two,"
    assert messages[-1]["content"] == "One, two, "  # the caller's messages are left alone


def test_continue_final_message_needs_text_to_continue() -> None:
    with pytest.raises(ChatTemplateError, match="could not find any text"):
        ChatTemplate({"default": VISION}).render(
            [{"role": "user", "content": [{"type": "image"}]}], add_generation_prompt=False, continue_final_message=True
        )
    with pytest.raises(ChatTemplateError, match='has no "content"'):
        llama().render([{"role": "user"}], add_generation_prompt=False, continue_final_message=True)


def test_raise_exception_is_the_templates_own_refusal() -> None:
    template = ChatTemplate({"default": ALTERNATING}, {"bos_token": "<bos>"})
    ok = template.render([{"role": "user", "content": "Hi "}])
    assert ok == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    with pytest.raises(ChatTemplateError) as caught:
        template.render([{"role": "assistant", "content": "Hi"}])
    assert str(caught.value) == "Conversation roles must alternate user/assistant/user/assistant/..."


def test_environment_is_transformers() -> None:
    """``tojson`` is ``json.dumps`` (no HTML escaping, ``indent`` and ``sort_keys``
    honoured), ``strftime_now`` is local time, ``{% generation %}`` renders its body,
    loop controls work, and the sandbox refuses attribute escapes."""
    source = (
        "{{ x | tojson }}|{{ x | tojson(indent=2, sort_keys=true) }}|{{ strftime_now('%Y') }}|"
        "{% generation %}gen{% endgeneration %}|{% for i in [1, 2, 3] %}{% if i == 2 %}{% break %}{% endif %}"
        "{{ i }}{% endfor %}"
    )
    x = {"b": "<&>", "a": "é"}
    rendered = ChatTemplate({"default": source}).render([], variables={"x": x})
    year = datetime.datetime.now().strftime("%Y")
    pretty = json.dumps(x, indent=2, sort_keys=True, ensure_ascii=False)
    assert rendered == f"{json.dumps(x, ensure_ascii=False)}|{pretty}|{year}|gen|1"
    with pytest.raises(ChatTemplateError):
        ChatTemplate({"default": "{{ ''.__class__.__mro__ }}"}).render([])


def test_template_errors_on_bad_values_are_refusals() -> None:
    """A value the template cannot use (here: adding a number to a string) is a refusal, not a crash."""
    with pytest.raises(ChatTemplateError, match=r"^can only concatenate str"):
        ChatTemplate({"default": "{{ messages[0]['content'] + 1 }}"}).render([{"role": "user", "content": "x"}])


def test_content_format_is_vllms_guess() -> None:
    """``openai`` for a template that loops over a message's content
    (vllm/renderers/hf.py:579-597), else ``string``."""
    assert content_format(VISION) == "openai"
    assert content_format(LLAMA3) == "string"
    assert content_format(QWEN) == "string"
    aliased = (
        "{% set msgs = messages[1:] %}{% for m in msgs %}{% for part in m.content %}{{ part.text }}{% endfor %}"
        "{% endfor %}"
    )
    assert content_format(aliased) == "openai"
    macro = (
        "{% macro render(parts, tag) %}{% for p in parts %}{{ p.text }}{% endfor %}{% endmacro %}"
        "{% for m in messages %}{{ render(m.content, tag='x') }}{% endfor %}"
    )
    assert content_format(macro) == "openai"
    assert content_format(macro.replace("render(m.content", "render(m.role")) == "string"
    named = "{% for m in messages %}{% set content = m.content %}{% for p in content %}{{ p }}{% endfor %}{% endfor %}"
    assert content_format(named) == "openai"


def test_named_templates_pick_tool_use_when_tools_are_given() -> None:
    """transformers' ``get_chat_template``: ``tool_use`` with tools, else ``default``."""
    template = ChatTemplate({"default": "plain", "tool_use": "tools:{{ tools | length }}"})
    assert template.render([]) == "plain"
    assert template.render([], tools=[{"type": "function"}]) == "tools:1"


# --- loading ---------------------------------------------------------------------------------------


def write_config(directory: Path, **config: object) -> Path:
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def test_loads_the_config_template_and_its_special_tokens(tmp_path: Path) -> None:
    """``bos_token`` may be an ``AddedToken`` object in the config."""
    write_config(tmp_path, chat_template=LLAMA3, bos_token={"__type": "AddedToken", "content": BOS}, eos_token=None)
    template = load_chat_template(str(tmp_path))
    assert template is not None
    assert template.special_tokens == {"bos_token": BOS}
    assert template.render([{"role": "user", "content": "Hi"}]).startswith(BOS + HEADER.format("user") + "Hi")


def test_chat_template_jinja_wins_over_the_config(tmp_path: Path) -> None:
    write_config(tmp_path, chat_template="from the config", bos_token="<s>")
    (tmp_path / "chat_template.jinja").write_text("{{ bos_token }}from the file")
    template = load_chat_template(str(tmp_path))
    assert template is not None and template.render([]) == "<s>from the file"


def test_a_list_of_named_templates(tmp_path: Path) -> None:
    write_config(tmp_path, chat_template=[{"name": "default", "template": "d"}, {"name": "tool_use", "template": "t"}])
    template = load_chat_template(str(tmp_path))
    assert template is not None and template.sources == {"default": "d", "tool_use": "t"}
    write_config(tmp_path, chat_template=[{"name": "rag", "template": "r"}])
    with pytest.raises(ValueError, match="no 'default'"):
        load_chat_template(str(tmp_path))


def test_no_template_means_none(tmp_path: Path) -> None:
    assert load_chat_template(str(tmp_path)) is None
    write_config(tmp_path, bos_token="<s>")
    assert load_chat_template(str(tmp_path)) is None


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"tokenizer_config.json": "{not json"}, "is not valid JSON"),
        ({"tokenizer_config.json": "[1]"}, "is not a JSON object"),
        ({"tokenizer_config.json": '{"chat_template": 5}'}, "must be a string or a list"),
        ({"tokenizer_config.json": '{"chat_template": "{% for %}"}'}, "is broken"),
        ({"chat_template.jinja": "{{ unclosed"}, "is broken"),
    ],
)
def test_broken_files_are_one_line_errors_naming_the_file(tmp_path: Path, files: dict[str, str], message: str) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=message) as caught:
        load_chat_template(str(tmp_path))
    assert str(tmp_path) in str(caught.value) and "\n" not in str(caught.value)


def test_hf_tokenizer_loads_the_template_beside_it(tmp_path: Path) -> None:
    """From the directory or from its ``tokenizer.json``; the ChatTurn path (messages,
    responses) renders through it too."""
    directory = build_tokenizer_dir(tmp_path / "model")
    for path in (directory, directory / "tokenizer.json"):
        tokenizer = load_tokenizer(str(path))
        assert isinstance(tokenizer, HFTokenizer) and tokenizer.chat_template is not None
        text = tokenizer.apply_chat_template([ChatTurn("user", "Hello there")])
        assert text == BOS + HEADER.format("user") + "Hello there<|eot_id|>" + HEADER.format("assistant")
        ids = tokenizer.encode(text)
        assert ids[0] == 0 and tokenizer.decode(ids) == text  # the special tokens are single tokens
        assert tokenizer.encode("Hello", add_special_tokens=True) == [0, *tokenizer.encode("Hello")]


def test_hf_tokenizer_without_template_keeps_the_builtin_rendering(tmp_path: Path) -> None:
    tokenizer = load_tokenizer(str(build_tokenizer_dir(tmp_path / "model", template=None)))
    assert tokenizer.chat_template is None
    assert tokenizer.apply_chat_template([ChatTurn("user", "Hi")]) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_hf_tokenizer_with_a_broken_template_fails_to_load(tmp_path: Path) -> None:
    directory = build_tokenizer_dir(tmp_path / "model", template="{% if %}")
    with pytest.raises(ValueError, match=r"chat template .* is broken"):
        load_tokenizer(str(directory))
