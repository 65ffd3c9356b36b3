"""reference/records.md: the record formats, from the JSON Schemas of :mod:`tula.core.records`' models.

A field's description is its schema's; where the model gives none, the comment the source keeps beside
the field (``#:`` above it, or ``#`` after it) stands in.  The run manifest's example is written by the
code ``tula run`` writes it with; the other records hold measurements, so the page shows none made up.
"""

from __future__ import annotations

import ast
import inspect
import io
import json
import tempfile
import tokenize
from pathlib import Path

from pydantic import TypeAdapter
from schema_md import anchor, model_table, models_in_order, paragraphs

#: what each record is and where it is written
FILES = {
    "tula.profile": "`profile.json` (`tula profile`, `tula run`): the measured trials",
    "tula.models": "`models.json` (`tula fit`): the fitted memory and performance models",
    "tula.plan": "`plan.json` (`tula plan`): every configuration's prediction and the choice",
    "tula.train": "`train/train.json` (`tula train`): the training run, epoch by epoch",
    "tula.run": "`run.json` (`tula run`): what the run was asked to do, for `tula run --resume DIR`",
    "tula.checkpoint": "the metadata of `checkpoint.pt` (`tula train`), read before anything is launched",
}


def source_comments(module) -> dict[str, dict[str, str]]:
    """The comments beside the fields of a module's classes: ``#:`` lines above a field, or a
    ``#`` comment at the end of its line.

    Parameters
    ----------
    module : module
        The module whose source is read.

    Returns
    -------
    dict[str, dict[str, str]]
        Class name to field name to comment.
    """
    source = inspect.getsource(module)
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string
    out: dict[str, dict[str, str]] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        fields = out.setdefault(node.name, {})
        for stmt in node.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            above, line = [], stmt.lineno - 1
            while comments.get(line, "").startswith("#:"):
                above.insert(0, comments[line][2:].strip())
                line -= 1
            after = comments.get(stmt.end_lineno or stmt.lineno, "")
            note = " ".join(above) or after.lstrip("#").split("# type:")[0].strip()
            if note and not note.startswith(("type:", "noqa")):
                fields[stmt.target.id] = note
    return out


def _with_comments(schema: dict, comments: dict[str, str]) -> dict:
    props = {
        name: ({**s, "description": comments[name]} if not s.get("description") and name in comments else s)
        for name, s in schema.get("properties", {}).items()
    }
    return {**schema, "properties": props}


def run_manifest_example() -> dict:
    """A run manifest as ``tula run`` writes it (:func:`tula.pipeline.start_run`), of the default spec.

    Returns
    -------
    dict
        The record.
    """
    from tula.core.spec import JobSpec
    from tula.pipeline import RunSettings, start_run

    with tempfile.TemporaryDirectory(prefix="tula-docs-") as tmp:
        start_run(Path(tmp), JobSpec(name="digits"), RunSettings(search="partial", objective=None, train=True))
        return json.loads((Path(tmp) / "run.json").read_text())


def page() -> str:
    """The page's Markdown.

    Returns
    -------
    str
        reference/records.md.
    """
    from tula.core import records

    comments = source_comments(records)
    lines = [
        "# Record formats",
        "",
        "!!! note",
        "    Generated from the JSON Schemas of the record models in `src/tula/core/records.py` when the site "
        "is built.",
        "",
        "Every stage writes one JSON record and the next stage reads it back: each has a `kind` and a "
        "`version`, is validated when it is read (a damaged or newer record is one sentence, not a traceback), "
        "and keeps fields it does not know (a newer minor writer may add some).",
        "",
        "| Kind | Version | Model | File |",
        "| --- | --- | --- | --- |",
    ]
    for kind, cls in records.SCHEMAS.items():
        lines.append(
            f"| `{kind}` | {records.VERSIONS[kind]} | [{cls.__name__}](#{anchor(cls.__name__)}) | {FILES.get(kind, '')} |"
        )
    lines.append("")
    done: set[str] = set()
    nested: dict[str, dict] = {}
    for kind, cls in records.SCHEMAS.items():
        schema = TypeAdapter(cls).json_schema()
        lines += [f"## {records.NAMES[kind].capitalize()}: {cls.__name__} {{#{anchor(cls.__name__)}}}", ""]
        lines += [paragraphs(schema.get("description")), ""]
        lines += [*model_table(_with_comments(schema, comments.get(cls.__name__, {}))), ""]
        if kind == records.RUN_KIND:
            lines += ["Example, as `tula run` writes it:", "", "```json", json.dumps(run_manifest_example(), indent=2)]
            lines += ["```", ""]
        for name in models_in_order(schema):
            nested.setdefault(name, schema["$defs"][name])
        done.add(cls.__name__)
    if nested:
        lines += ["## Nested records", ""]
        for name, s in nested.items():
            if name in done:
                continue
            lines += [f"### {name} {{#{anchor(name)}}}", "", paragraphs(s.get("description")), ""]
            lines += [*model_table(_with_comments(s, comments.get(name, {}))), ""]
    return "\n".join(lines)
