"""reference/spec.md: the job spec from ``JobSpec.model_json_schema()`` -- every section and field."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel
from schema_md import anchor, model_table, models_in_order, paragraphs


def factory_defaults(cls: type[BaseModel]) -> dict[str, str]:
    """The defaults of a model's fields made by a ``default_factory`` (a JSON Schema has none for them).

    Parameters
    ----------
    cls : type[BaseModel]
        The model.

    Returns
    -------
    dict[str, str]
        Field name to its default as Markdown: code, or a link to the nested model's section.
    """
    out = {}
    for name, field in cls.model_fields.items():
        if field.is_required() or field.default_factory is None:
            continue
        value: Any = field.get_default(call_default_factory=True)
        if isinstance(value, BaseModel):
            out[name] = f"see [{type(value).__name__}](#{anchor(type(value).__name__)})"
        else:
            out[name] = f"`{json.dumps(value, default=str)}`"
    return out


def _paths(schema: dict) -> dict[str, list[str]]:
    """Where each nested model sits in a spec: ``{"AGSSpec": ["train.ags"], ...}``."""
    defs = schema.get("$defs", {})
    where: dict[str, list[str]] = {}

    def refs(s: dict) -> list[str]:
        if "$ref" in s:
            return [s["$ref"].rsplit("/", 1)[-1]]
        inner = s.get("anyOf", []) + s.get("allOf", []) + ([s["items"]] if isinstance(s.get("items"), dict) else [])
        return [r for part in inner for r in refs(part)]

    def visit(props: dict, prefix: str) -> None:
        for field, s in props.items():
            for name in refs(s):
                path = f"{prefix}{field}" + ("[]" if s.get("type") == "array" else "")
                if path not in where.setdefault(name, []):
                    where[name].append(path)
                    visit(defs.get(name, {}).get("properties", {}), path + ".")

    visit(schema.get("properties", {}), "")
    return where


def page() -> str:
    """The page's Markdown.

    Returns
    -------
    str
        reference/spec.md.
    """
    from tula.core import spec as spec_module

    schema = spec_module.JobSpec.model_json_schema()
    classes = {
        name: obj
        for name, obj in vars(spec_module).items()
        if isinstance(obj, type) and issubclass(obj, BaseModel) and obj.__module__ == spec_module.__name__
    }
    where = _paths(schema)
    lines = [
        "# Job spec",
        "",
        "!!! note",
        "    Generated from the spec's JSON Schema (`JobSpec.model_json_schema()` in `src/tula/core/spec.py`) "
        "when the site is built. `tula spec schema` prints the same schema, for an editor to complete and "
        "check a spec with.",
        "",
        "A spec is a YAML mapping. Every field is optional unless marked **required**; a field the schema does "
        "not list is refused with a sentence naming it. Sizes in bytes also take a unit (`512MiB`, `2GB`), and "
        "durations in seconds one too (`8h`, `90min`, `1h30m`).",
        "",
        "## The top level {#jobspec}",
        "",
        paragraphs(schema.get("description")),
        "",
        *model_table(schema, factory_defaults(spec_module.JobSpec)),
        "",
    ]
    for name in models_in_order(schema):
        sub = schema["$defs"][name]
        paths = where.get(name, [])
        title = ", ".join(f"`{p}`" for p in paths) if paths else name
        lines += [f"## {title} {{#{anchor(name)}}}", ""]
        lines += [f"*{name}*", "", paragraphs(sub.get("description")), ""]
        lines += model_table(sub, factory_defaults(classes[name]) if name in classes else None)
        lines.append("")
    return "\n".join(lines)
