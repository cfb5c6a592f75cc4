"""A small renderer for the subset of Helm's Go templates that helm/llmsim uses.

No ``helm`` binary can be installed on the machines the tests run on (not from Debian,
PyPI or npm), so the chart is rendered here and the result validated like the plain
manifests.  This is not Helm: it knows the actions ``define``, ``if``/``else``, ``with``,
``range`` and ``end``, pipelines, the trim markers ``{{-`` and ``-}}`` (Go's rules), and
the functions ``include``, ``toYaml``, ``nindent``, ``indent``, ``quote``, ``default``,
``trunc``, ``trimSuffix`` and ``printf``; anything else is an error, and so is a
``.Values`` path that does not exist (Helm would print nothing), which catches typos.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

import yaml

__all__ = ["TemplateError", "render_chart"]

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\(|\)|[^\s()]+')


class TemplateError(Exception):
    pass


def _lex(text: str) -> list[tuple[str, str]]:
    """("text", ...) and ("action", ...) items, the trim markers applied."""
    items: list[tuple[str, str]] = []
    position, trim_next = 0, False
    for match in _ACTION.finditer(text):
        before = text[position : match.start()]
        if trim_next:
            before = before.lstrip()
        if match[1]:
            before = before.rstrip()
        items.append(("text", before))
        items.append(("action", match[2].strip()))
        position, trim_next = match.end(), bool(match[3])
    rest = text[position:]
    items.append(("text", rest.lstrip() if trim_next else rest))
    return items


def _parse(items: list[tuple[str, str]], start: int, defines: dict[str, list[Any]]) -> tuple[list[Any], int, str]:
    """Nodes up to the matching ``end`` or ``else``: (nodes, next index, what ended them)."""
    nodes: list[Any] = []
    index = start
    while index < len(items):
        kind, value = items[index]
        index += 1
        if kind == "text":
            nodes.append(("text", value))
            continue
        if value.startswith("/*"):
            continue
        word, _, rest = value.partition(" ")
        if word in ("end", "else"):
            return nodes, index, word
        if word in ("if", "with", "range"):
            body, index, ended = _parse(items, index, defines)
            other: list[Any] = []
            if ended == "else":
                other, index, ended = _parse(items, index, defines)
            nodes.append((word, rest, body, other))
        elif word == "define":
            body, index, _ = _parse(items, index, defines)
            defines[json.loads(rest)] = body
        else:
            nodes.append(("action", value))
    return nodes, index, "eof"


def _truthy(value: object) -> bool:
    return bool(value) if value is not None else False


def _to_yaml(value: object) -> str:
    return yaml.safe_dump(value, default_flow_style=False, sort_keys=True).rstrip("\n")


def _indent(width: int, text: str) -> str:
    pad = " " * width
    return pad + str(text).replace("\n", "\n" + pad)


def _printf(form: str, *args: object) -> str:
    return re.sub(r"%[sdv]", "%s", form) % args


class _Renderer:
    def __init__(self, defines: dict[str, list[Any]], root: Mapping[str, Any]) -> None:
        self.defines = defines
        self.root = root
        self.functions: dict[str, Callable[..., object]] = {
            "include": lambda name, data: self.render(self.defines[name], data),
            "toYaml": _to_yaml,
            "nindent": lambda width, text: "\n" + _indent(width, text),
            "indent": _indent,
            "quote": lambda value: json.dumps(str(value)),
            "default": lambda fallback, value: value if _truthy(value) else fallback,
            "trunc": lambda width, text: str(text)[:width],
            "trimSuffix": lambda suffix, text: str(text).removesuffix(suffix),
            "printf": _printf,
        }

    def render(self, nodes: list[Any], dot: object) -> str:
        out: list[str] = []
        for node in nodes:
            kind = node[0]
            if kind == "text":
                out.append(node[1])
            elif kind == "action":
                out.append(_show(self.pipeline(node[1], dot)))
            else:
                _, pipeline, body, other = node
                value = self.pipeline(pipeline, dot)
                if kind == "if":
                    out.append(self.render(body if _truthy(value) else other, dot))
                elif kind == "with":
                    out.append(self.render(body, value) if _truthy(value) else self.render(other, dot))
                else:  # range over a list
                    out.extend(self.render(body, item) for item in value or ())
        return "".join(out)

    def pipeline(self, text: str, dot: object) -> object:
        value: object = _NOTHING
        for command in _split_pipes(text):
            words = _TOKEN.findall(command)
            if not words:
                raise TemplateError(f"empty command in {text!r}")
            head, args = words[0], [self.value(word, dot) for word in words[1:]]
            if value is not _NOTHING:
                args.append(value)
            if head in self.functions:
                value = self.functions[head](*args)
            elif head[0] in '."$' or head[0].isdigit() or head in ("true", "false"):
                if args:
                    raise TemplateError(f"{head!r} is not a function, in {text!r}")
                value = self.value(head, dot)
            else:
                raise TemplateError(f"unknown function {head!r} in {text!r}")
        return value

    def value(self, word: str, dot: object) -> object:
        if word.startswith('"'):
            return json.loads(word)
        if word in ("true", "false"):
            return word == "true"
        if word[0].isdigit():
            return int(word)
        if word in (".", "$"):
            return dot if word == "." else self.root
        base: object = self.root if word.startswith("$") else dot
        for key in word.lstrip("$").strip(".").split("."):
            if not isinstance(base, Mapping) or key not in base:
                raise TemplateError(f"no {word} (at {key!r})")
            base = base[key]
        return base


_NOTHING = object()


def _split_pipes(text: str) -> list[str]:
    parts, current, quoted = [], "", False
    for char in text:
        if char == '"' and not current.endswith("\\"):
            quoted = not quoted
        if char == "|" and not quoted:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    parts.append(current.strip())
    return parts


def _show(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        raise TemplateError("a value is missing")
    return str(value)


def render_chart(chart: Mapping[str, Any], values: Mapping[str, Any], templates: Mapping[str, str]) -> dict[str, str]:
    """Every template (``_*.tpl`` only define) rendered with ``values``, release ``test``."""
    defines: dict[str, list[Any]] = {}
    parsed = {name: _parse(_lex(text), 0, defines)[0] for name, text in templates.items()}
    root = {
        "Values": values,
        "Release": {"Name": "test", "Namespace": "default", "Service": "Helm"},
        "Chart": {"Name": chart["name"], "Version": chart["version"], "AppVersion": chart.get("appVersion", "")},
    }
    renderer = _Renderer(defines, root)
    return {name: renderer.render(nodes, root) for name, nodes in parsed.items() if not name.startswith("_")}
