"""reference/cli.md: the command line from its own definitions (``typer.main.get_command(tula.cli.app)``).

Every verb in the order the command lists it: its help, its usage, its arguments and options (type,
default, help, panel) and its help's epilog (the examples).  Sub-commands (``tula examples copy``,
``tula spec schema``) follow their group.
"""

from __future__ import annotations

import enum
import inspect
import json
import re
import typing
from pathlib import Path
from typing import Any

from schema_md import anchor

#: the names a value's Python type has on a command line (click's)
_TYPE_NAMES = {str: "TEXT", int: "INTEGER", float: "FLOAT", bool: "BOOLEAN", Path: "PATH"}

_RICH_TAG = re.compile(r"\[/?(?:bold|dim|italic|underline|green|red|yellow|blue|cyan|magenta|b|i|u|code)\]")


def _plain(value: Any) -> str:
    """Help text without rich markup, its paragraphs kept."""
    if not value:
        return ""
    out = inspect.cleandoc(str(value))
    out = out.replace("\b\n", "\n").replace("\b", "")
    return _RICH_TAG.sub("", out)


def _cell(value: Any) -> str:
    out = " ".join(_plain(value).split())
    return out.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _is_option(param: Any) -> bool:
    return hasattr(param, "is_flag")


def _annotation_name(annotation: Any) -> str:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(annotation))
    if args:  # Optional[X], list[X], X | None
        return _annotation_name(args[0])
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(f"`{m.value}`" for m in annotation)
    return f"`{_TYPE_NAMES.get(annotation, getattr(annotation, '__name__', str(annotation)).upper())}`"


def _type(param: Any) -> str:
    if _is_option(param) and param.is_flag:
        return "flag"
    descriptor = getattr(param, "type_descriptor", None)
    if param.metavar and _is_option(param):  # an option's metavar (DIR, KEY=VALUE) says more than its type
        text = f"`{param.metavar}`"
    elif descriptor is not None:
        text = _annotation_name(descriptor.annotation)
    else:
        kind = getattr(param, "type", None)
        text = f"`{getattr(kind, 'name', str(kind)).upper()}`"
    if param.multiple:
        text += ", repeatable"
    return text


def _default(param: Any) -> str:
    if param.required:
        return "**required**"
    value = param.default
    if callable(value) or value is None or value == ():
        return ""
    if _is_option(param) and param.is_flag and param.secondary_opts:
        return f"`{param.opts[0] if value else param.secondary_opts[0]}`"
    if hasattr(value, "value"):  # an Enum's member
        value = value.value
    if isinstance(value, (list, tuple)):
        return " ".join(f"`{v}`" for v in value)
    if _is_option(param) and param.is_flag:
        return "on" if value else "off"
    return f"`{json.dumps(value) if isinstance(value, str) else value}`".replace("|", "\\|")


def _names(param: Any) -> str:
    if not _is_option(param):
        return f"`{(param.metavar or param.name).upper()}`"
    names = [*param.opts, *param.secondary_opts]
    return ", ".join(f"`{n}`" for n in names)


def _params_table(params: list[Any]) -> list[str]:
    params = [p for p in params if not getattr(p, "hidden", False) and p.name != "help"]
    if not params:
        return []
    lines = ["| Argument or option | Type | Default | Panel | Help |", "| --- | --- | --- | --- | --- |"]
    for p in params:
        panel = getattr(p, "rich_help_panel", None) or ("Options" if _is_option(p) else "Arguments")
        lines.append(f"| {_names(p)} | {_type(p)} | {_default(p)} | {panel} | {_cell(getattr(p, 'help', ''))} |")
    return lines


def _usage(cmd: Any, path: str) -> str:
    """``tula VERB [OPTIONS] SPEC [DEST]``: the usage line ``--help`` prints."""
    parts = [path, "[OPTIONS]"]
    for p in cmd.params:
        if not _is_option(p):
            name = (p.metavar or p.name).upper() + ("..." if p.nargs == -1 else "")
            parts.append(name if p.required else f"[{name}]")
    if hasattr(cmd, "list_commands"):
        parts.append("COMMAND [ARGS]...")
    return " ".join(parts)


def _command(cmd: Any, ctx: Any, path: list[str]) -> list[str]:
    title = " ".join(path)
    lines = [f"## `{title}` {{#{anchor(title)}}}", ""]
    help_text = _plain(cmd.help)
    if help_text:
        lines += [help_text, ""]
    usage = _usage(cmd, title)
    lines += ["```text", usage, "```", ""]
    if cmd.params:
        lines += _params_table(cmd.params) + [""]
    epilog = _plain(cmd.epilog)
    if epilog.lower().startswith("examples"):  # the help's own heading; the page has its own
        epilog = epilog.split("\n", 1)[1].strip() if "\n" in epilog else ""
    if epilog:
        lines += ["**Examples**", "", "```text", epilog, "```", ""]
    if hasattr(cmd, "list_commands"):  # a group: its sub-commands in their order
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            lines += _command(sub, type(ctx)(sub, info_name=name, parent=ctx), [*path, name])
    return lines


def _context_class() -> type:
    """The click Context class typer's commands take (typer 0.29 keeps its own copy of click)."""
    try:
        from typer._click.core import Context
    except ImportError:  # a typer that uses click itself
        from click import Context
    return Context


def page() -> str:
    """The page's Markdown.

    Returns
    -------
    str
        reference/cli.md.
    """
    import typer.main

    import tula.cli

    group = typer.main.get_command(tula.cli.app)
    ctx = _context_class()(group, info_name="tula")
    names = [n for n in group.list_commands(ctx) if not group.get_command(ctx, n).hidden]
    lines = [
        "# Command line",
        "",
        "!!! note",
        "    Generated from the command's own definitions (`tula.cli.app`) when the site is built; "
        "`tula VERB --help` prints the same.",
        "",
        _plain(group.help),
        "",
        "Verbs, in the order a user meets them: " + ", ".join(f"[`{n}`](#{anchor('tula ' + n)})" for n in names) + ".",
        "",
        "```text",
        _usage(group, "tula"),
        "```",
        "",
        "Global options:",
        "",
        *(_params_table(group.params) or ["(none)"]),
        "",
    ]
    for name in names:
        sub = group.get_command(ctx, name)
        lines += _command(sub, type(ctx)(sub, info_name=name, parent=ctx), ["tula", name])
    return "\n".join(lines)
