"""A model's own chat template, rendered with jinja2 the way transformers renders it.

With ``--tokenizer PATH``, the directory of the tokenizer may hold the model's chat
template: ``chat_template.jinja`` (which wins, as in transformers) or the
``chat_template`` of ``tokenizer_config.json`` (a string, or a list of named templates).
:func:`load_chat_template` reads it once at start-up; nothing is ever fetched.

:meth:`ChatTemplate.render` follows transformers' ``render_jinja_template`` and
``_compile_jinja_template`` (``transformers/utils/chat_template_utils.py``): an
``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and ``lstrip_blocks``, the
``loopcontrols`` extension and a ``{% generation %}`` tag, a ``tojson`` filter that
does not escape HTML (``json.dumps`` with ``ensure_ascii=False``), the globals
``raise_exception`` and ``strftime_now``, the special tokens of the tokenizer config
(``bos_token``, ``eos_token``...) as variables, and ``continue_final_message`` done
by marking the final message and cutting the rendered text there.

:func:`content_format` is vLLM's guess of whether a template wants message content
as a string or as a list of ``{"type": "text", ...}`` parts
(``vllm/renderers/hf.py:364-597``, ``_detect_content_format``).
"""

from __future__ import annotations

import copy
import datetime
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import attrs
import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox

__all__ = [
    "CONFIG_FILE",
    "TEMPLATE_FILE",
    "ChatTemplate",
    "ChatTemplateError",
    "ContentFormat",
    "compile_template",
    "content_format",
    "load_chat_template",
]

TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"
#: The tokenizer config's special tokens that transformers hands to the template.
_SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "

ContentFormat = Literal["string", "openai"]


class ChatTemplateError(ValueError):
    """The template refused the conversation (``raise_exception``, a jinja error, or a
    final message it cannot continue).  The message is the template's own reason."""


class _GenerationTag(jinja2.ext.Extension):
    """transformers' ``{% generation %}...{% endgeneration %}`` (assistant masks): the
    body renders as it is."""

    tags = {"generation"}  # noqa: RUF012 (jinja's own class attribute)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: object,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """transformers' ``tojson``: ``json.dumps`` without jinja's HTML escaping."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.datetime.now().strftime(format)


def compile_template(source: str) -> jinja2.Template:
    """``source`` compiled in transformers' environment.  Raises jinja2's
    ``TemplateSyntaxError`` for a broken template."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


@attrs.frozen
class ChatTemplate:
    """One model's chat template(s), compiled, with the special tokens they may use."""

    #: Template source by name (``"default"`` for a single template).
    sources: Mapping[str, str]
    special_tokens: Mapping[str, object] = attrs.field(factory=dict)
    _compiled: Mapping[str, jinja2.Template] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        compiled = {name: compile_template(source) for name, source in self.sources.items()}
        object.__setattr__(self, "_compiled", compiled)

    def source(self, *, with_tools: bool = False) -> str:
        """The template vLLM picks: ``tool_use`` when tools are given and there is one,
        else ``default`` (transformers' ``get_chat_template``)."""
        return self.sources[self._name(with_tools)]

    def _name(self, with_tools: bool) -> str:
        if with_tools and "tool_use" in self.sources:
            return "tool_use"
        return "default"

    @property
    def content_format(self) -> ContentFormat:
        return content_format(self.source())

    @property
    def supports_developer_role(self) -> bool:
        """vLLM turns ``developer`` messages into ``system`` ones for templates that never
        name the role (``vllm/renderers/hf.py:600-616``)."""
        source = self.source()
        return '"developer"' in source or "'developer'" in source

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text, as transformers' ``render_jinja_template`` makes it.

        Raises:
            ChatTemplateError: the template refused the conversation.
        """
        name = self._name(tools is not None)
        chat: list[Any] = list(messages)
        final_text = ""
        if continue_final_message:
            chat, final_text = self._mark_final_message(chat, self.sources[name])
        context = {**self.special_tokens, **(variables or {})}
        context.update(messages=chat, tools=tools, documents=context.get("documents"))
        context["add_generation_prompt"] = add_generation_prompt
        try:
            rendered = self._compiled[name].render(context)
        except Exception as exc:  # whatever the template raises, vLLM reports its text (vllm/renderers/hf.py:916-926)
            raise ChatTemplateError(str(exc)) from None
        if continue_final_message:
            rendered = _cut_at_tag(rendered, final_text)
        return rendered

    @staticmethod
    def _mark_final_message(chat: list[Any], source: str) -> tuple[list[Any], str]:
        """A copy of ``chat`` whose final text ends with transformers' marker tag."""
        if not chat:
            raise ChatTemplateError("continue_final_message is set but there is no final message to continue!")
        chat = copy.deepcopy(chat)
        final = chat[-1].get("content")
        if final is None:
            raise ChatTemplateError('continue_final_message is set but the final message has no "content" to continue!')
        if "content" not in source:
            raise ChatTemplateError(
                'continue_final_message is set to "content" but this is not an accepted field in the chat_template'
            )
        if isinstance(final, list | tuple):
            for block in reversed(final):
                if "text" in block:
                    final_text = str(block["text"])
                    block["text"] = final_text + _CONTINUE_TAG
                    return chat, final_text
            raise ChatTemplateError(
                "continue_final_message is set but we could not find any text to continue in the final message!"
            )
        chat[-1] = {**chat[-1], "content": str(final) + _CONTINUE_TAG}
        return chat, str(final)


def _cut_at_tag(rendered: str, final_text: str) -> str:
    tag = _CONTINUE_TAG.strip()
    if final_text.strip() not in rendered or tag not in rendered:
        raise ChatTemplateError(
            "continue_final_message is set but the final message does not appear in the chat after applying the "
            "chat template! This can happen if the chat template deletes portions of the final message. Please "
            "verify the chat template and final message in your chat to ensure they are compatible."
            f"Final message to continue: {final_text.strip()}\nRendered chat:\n{rendered}"
        )
    at = rendered.rindex(tag)
    if rendered[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:at]
    return rendered[:at].rstrip()


# --- loading ---------------------------------------------------------------------------------


def load_chat_template(directory: str) -> ChatTemplate | None:
    """The chat template in ``directory`` (``None`` when it has none).

    Raises:
        ValueError: a template or config file that cannot be read, parsed or compiled
            (the message names the file).
    """
    config_path = os.path.join(directory, CONFIG_FILE)
    config: dict[str, Any] = {}
    if os.path.isfile(config_path):
        config = _read_config(config_path)
    template_path = os.path.join(directory, TEMPLATE_FILE)
    if os.path.isfile(template_path):
        sources = {"default": _read_text(template_path)}
        where = template_path
    else:
        found = _config_sources(config.get("chat_template"), config_path)
        if found is None:
            return None
        sources, where = found, config_path
    try:
        return ChatTemplate(sources, _special_tokens(config))
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"chat template {where!r} is broken: {exc.message} (line {exc.lineno})") from None


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as file:
            return file.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"chat template {path!r} could not be read: {exc}") from None


def _read_config(path: str) -> dict[str, Any]:
    try:
        config = json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise ValueError(f"tokenizer config {path!r} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"tokenizer config {path!r} is not a JSON object")
    return config


def _config_sources(value: object, path: str) -> dict[str, str] | None:
    """``chat_template`` of the config: one template, or a list of named ones."""
    if value is None:
        return None
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, list) and all(
        isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("template"), str)
        for item in value
    ):
        sources = {item["name"]: item["template"] for item in value}
        if "default" not in sources:
            raise ValueError(f"tokenizer config {path!r}: the chat templates have no 'default' one")
        return sources
    raise ValueError(f"tokenizer config {path!r}: chat_template must be a string or a list of named templates")


def _special_tokens(config: Mapping[str, Any]) -> dict[str, object]:
    """The special tokens as template variables (transformers' ``special_tokens_map``):
    a token may be stored as a string or as an ``AddedToken`` object."""
    tokens: dict[str, object] = {}
    for key in _SPECIAL_TOKEN_KEYS:
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            tokens[key] = value
    extra = config.get("additional_special_tokens")
    if isinstance(extra, list) and extra:
        tokens["additional_special_tokens"] = [
            item.get("content") if isinstance(item, dict) else item for item in extra
        ]
    return tokens


# --- content format (vLLM's detection) -----------------------------------------------------------


def content_format(source: str) -> ContentFormat:
    """``"openai"`` when the template loops over a message's content (it wants a list of
    parts), else ``"string"``: vLLM's ``_detect_content_format`` (``vllm/renderers/hf.py:
    424-597``) for the shapes real templates use: ``for message in messages`` (or an alias
    assigned from it), then ``for part in message.content`` (or ``message['content']``),
    a macro's loop over the content it is called with, or a loop over a variable named
    ``content``.  (vLLM's namespace aliases are not followed.)"""
    try:
        ast = compile_template(source).environment.parse(source)
    except jinja2.TemplateError:
        return "string"
    message_names = set(_message_loop_names(ast))
    macro_params = _macro_content_params(ast, message_names)
    in_macros = {id(loop) for macro in ast.find_all(jinja2.nodes.Macro) for loop in macro.find_all(jinja2.nodes.For)}
    for loop in ast.find_all(jinja2.nodes.For):
        if any(_is_field_of(loop.iter, name, "content") for name in message_names):
            return "openai"
        if isinstance(loop.iter, jinja2.nodes.Name):
            if loop.iter.name in macro_params.get(id(loop), ()):
                return "openai"  # a macro's loop over the message content it was given
            if id(loop) not in in_macros and loop.iter.name == "content":
                return "openai"  # {% set content = message.content %}...{% for part in content %}
    return "string"


def _macro_content_params(ast: jinja2.nodes.Template, message_names: set[str]) -> dict[int, set[str]]:
    """For each loop inside a macro: the macro's parameters that some call passes a
    message's content to (``render_content(message.content)``)."""
    params_by_loop: dict[int, set[str]] = {}
    calls = list(ast.find_all(jinja2.nodes.Call))
    for macro in ast.find_all(jinja2.nodes.Macro):
        names = [arg.name for arg in macro.args]
        params: set[str] = set()
        for call in calls:
            if not (isinstance(call.node, jinja2.nodes.Name) and call.node.name == macro.name):
                continue
            for name, arg in zip(names, call.args, strict=False):
                if any(_is_field_of(arg, message, "content") for message in message_names):
                    params.add(name)
            for keyword in call.kwargs:
                if keyword.key in names and any(
                    _is_field_of(keyword.value, message, "content") for message in message_names
                ):
                    params.add(keyword.key)
        if params:
            for loop in macro.find_all(jinja2.nodes.For):
                params_by_loop[id(loop)] = params
    return params_by_loop


def _message_loop_names(ast: jinja2.nodes.Template) -> Iterator[str]:
    """Names the template gives to one message: loop targets over ``messages`` or over a
    variable assigned from it (``{% set loop_messages = messages[1:] %}``)."""
    sources = {"messages"}
    for assign in ast.find_all(jinja2.nodes.Assign):
        if isinstance(assign.target, jinja2.nodes.Name) and _is_name(assign.node, sources):
            sources.add(assign.target.name)
    for loop in ast.find_all(jinja2.nodes.For):
        if _is_name(loop.iter, sources) and isinstance(loop.target, jinja2.nodes.Name):
            yield loop.target.name


def _is_name(node: jinja2.nodes.Node, names: set[str]) -> bool:
    """``node`` is one of ``names``, maybe sliced or filtered (``messages[1:]``)."""
    if isinstance(node, jinja2.nodes.Filter | jinja2.nodes.Test):
        return node.node is not None and _is_name(node.node, names)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _is_name(node.node, names)
    return isinstance(node, jinja2.nodes.Name) and node.name in names


def _is_field_of(node: jinja2.nodes.Node, name: str, key: str) -> bool:
    """``node`` is ``name.key`` or ``name['key']``, maybe sliced or filtered."""
    if isinstance(node, jinja2.nodes.Filter | jinja2.nodes.Test):
        return node.node is not None and _is_field_of(node.node, name, key)
    if isinstance(node, jinja2.nodes.Getitem):
        if isinstance(node.arg, jinja2.nodes.Slice):
            return _is_field_of(node.node, name, key)
        return _is_name(node.node, {name}) and isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
    if isinstance(node, jinja2.nodes.Getattr):
        return _is_name(node.node, {name}) and node.attr == key
    return False
