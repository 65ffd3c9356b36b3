"""JSON Schemas (pydantic's ``model_json_schema()``) as Markdown tables, for the generated reference pages.

One table per model: each field with its type (constraints and enums included), its default and its
description; a nested model is a section of its own, linked from the field that holds it.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: reStructuredText the docstrings use, turned into Markdown: ``code`` and :role:`~a.b.Name`
_RST_LITERAL = re.compile(r"``(.+?)``")
_RST_ROLE = re.compile(r":[a-z]+:`(~?)([^`]+)`")


def text(value: Any) -> str:
    """A docstring or description as one Markdown paragraph that fits in a table cell.

    Parameters
    ----------
    value : Any
        The text (``None``: empty).

    Returns
    -------
    str
        The text on one line, reStructuredText literals and roles as code, ``|`` escaped.
    """
    if not value:
        return ""
    out = " ".join(str(value).split())
    out = _RST_ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`", out)
    out = _RST_LITERAL.sub(lambda m: f"`{m.group(1)}`", out)
    return out.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def paragraphs(value: Any) -> str:
    """A docstring as Markdown paragraphs (its blank lines kept), for a section's introduction.

    Parameters
    ----------
    value : Any
        The text (``None``: empty).

    Returns
    -------
    str
        Each paragraph as :func:`text` makes it, separated by blank lines.
    """
    return "\n\n".join(text(part) for part in str(value or "").split("\n\n") if part.strip())


def anchor(name: str) -> str:
    """The anchor id of a model's section.

    Parameters
    ----------
    name : str
        The model's name in the schema's ``$defs``.

    Returns
    -------
    str
        A lower-case id.
    """
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _bounds(s: dict) -> str:
    marks = [
        ("minimum", "≥"),
        ("exclusiveMinimum", ">"),
        ("maximum", "≤"),
        ("exclusiveMaximum", "<"),
        ("minItems", "items ≥"),
        ("maxItems", "items ≤"),
        ("minLength", "length ≥"),
        ("pattern", "matching"),
    ]
    found = [f"{sign} {s[key]}" if key != "pattern" else f"matching `{s[key]}`" for key, sign in marks if key in s]
    return f" ({', '.join(found)})" if found else ""


def type_of(s: dict) -> str:
    """A field's schema as a short Markdown type: ``integer (≥ 1)``, ``one of `a`, `b` ``, a link to a model.

    Parameters
    ----------
    s : dict
        The field's JSON Schema.

    Returns
    -------
    str
        The type, with its constraints.
    """
    if "$ref" in s:
        name = _ref_name(s["$ref"])
        return f"[{name}](#{anchor(name)})"
    if "anyOf" in s or "oneOf" in s:
        parts = [type_of(p) for p in s.get("anyOf", s.get("oneOf"))]
        return " or ".join(dict.fromkeys(parts))
    if "allOf" in s and len(s["allOf"]) == 1:
        return type_of(s["allOf"][0])
    if "enum" in s:
        return "one of " + ", ".join(f"`{json.dumps(v)}`" for v in s["enum"])
    if "const" in s:
        return f"`{json.dumps(s['const'])}`"
    kind = s.get("type")
    if kind == "array":
        if "prefixItems" in s:
            return "[" + ", ".join(type_of(p) for p in s["prefixItems"]) + "]"
        items = s.get("items")
        inner = type_of(items) if items else "any"
        return f"list of {inner}{_bounds({k: v for k, v in s.items() if k in ('minItems', 'maxItems')})}"
    if kind == "object":
        extra = s.get("additionalProperties")
        if isinstance(extra, dict) and extra:
            return f"mapping of string to {type_of(extra)}"
        return "mapping"
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind is None:
        return "any"
    return f"{kind}{_bounds(s)}"


def default_of(s: dict, required: bool) -> str:
    """A field's default as Markdown code, ``required``, or empty when the schema gives none.

    Parameters
    ----------
    s : dict
        The field's JSON Schema.
    required : bool
        Whether the model requires the field.

    Returns
    -------
    str
        The default.
    """
    if required:
        return "**required**"
    if "default" in s:
        return f"`{json.dumps(s['default'])}`".replace("|", "\\|")
    return ""


def model_table(schema: dict, defaults: dict[str, str] | None = None) -> list[str]:
    """The Markdown table of one model's fields.

    Parameters
    ----------
    schema : dict
        The model's JSON Schema (an object with ``properties``).
    defaults : dict[str, str] | None
        Defaults (already Markdown) for fields whose schema has none (those made by a factory).

    Returns
    -------
    list[str]
        The table's lines.
    """
    required = set(schema.get("required", ()))
    lines = ["| Field | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for name, s in schema.get("properties", {}).items():
        default = default_of(s, name in required) or (defaults or {}).get(name, "")
        lines.append(f"| `{name}` | {type_of(s)} | {default} | {text(s.get('description'))} |")
    return lines


def models_in_order(schema: dict) -> list[str]:
    """The names of the models a schema refers to, in the order a reader meets them (depth first).

    Parameters
    ----------
    schema : dict
        A JSON Schema with ``$defs``.

    Returns
    -------
    list[str]
        The ``$defs`` names, each once.
    """
    defs = schema.get("$defs", {})
    order: list[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            if "$ref" in node:
                name = _ref_name(node["$ref"])
                if name not in order and name in defs:
                    order.append(name)
                    visit(defs[name])
            for key, value in node.items():
                if key != "$defs":
                    visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit({k: v for k, v in schema.items() if k != "$defs"})
    return order + [name for name in defs if name not in order]
