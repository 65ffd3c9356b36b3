"""Text that Tula did not write, printed as it is: the one rule for every error, note and message.

What a library, a user or a stored record says -- an exception's sentence, a path, a spec's
name, a rank's note, a job's message -- is never read as rich markup (gloo's
``[/path/pair.cc:152]`` reads as a closing tag, and rich raises ``MarkupError`` while the
error is being reported) nor as emoji codes, and it is made printable whatever it holds:
undecodable bytes (surrogate escapes) become ``\\xNN``, NUL becomes ``\\x00``, an exception
whose ``str()`` raises is named by its type.  Our own words keep their style, given beside
the foreign text as ``(text, style)``::

    say(err_console, ("error:", "bold red"), " ", err)

:func:`plain` is the same rule for text that is not printed by rich (the service's JSON
error bodies, stored failure messages, HTML before it is escaped); :class:`Table` is a rich
table whose str title, headers and cells are plain text.
"""

from __future__ import annotations

from typing import Any

import rich.table
from rich.console import Console, RenderableType
from rich.markup import escape
from rich.text import Text

__all__ = ["plain", "first_line", "text", "say", "Table"]


def plain(x: Any) -> str:
    """``str(x)``, never raising, and encodable as UTF-8 (for a terminal, JSON, a database)."""
    try:
        s = x if isinstance(x, str) else str(x)
    except Exception:  # noqa: BLE001 - an exception's __str__ may itself fail
        try:
            s = f"{type(x).__name__} (its message cannot be read)"
        except Exception:  # noqa: BLE001
            s = "(a message that cannot be read)"
    if not isinstance(s, str):  # a str subclass's __str__ returning something else
        s = repr(s)
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: bytes that were not UTF-8 (os.fsdecode, sys.argv)
        try:
            s = s.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:  # surrogates that are no escaped byte
            s = s.encode("utf-8", "backslashreplace").decode("utf-8")
    return s.replace("\x00", "\\x00") if "\x00" in s else s


def first_line(x: Any, limit: int | None = None) -> str:
    """The first non-empty line of ``plain(x)`` ('' when there is none), at most ``limit`` characters."""
    line = next((ln.strip() for ln in plain(x).splitlines() if ln.strip()), "")
    return line if limit is None else line[:limit]


def text(*parts: Any) -> Text:
    """One rich ``Text`` from ``parts``: a part is foreign text printed as it is, or a
    ``(text, style)`` pair (our own words, or foreign text we style) -- never markup."""
    out = Text()
    for part in parts:
        if isinstance(part, Text):
            out.append_text(part)
        elif isinstance(part, tuple):
            out.append(plain(part[0]), style=part[1])
        else:
            out.append(plain(part))
    return out


def say(console: Console, *parts: Any, **print_kw: Any) -> None:
    """Print :func:`text` of ``parts`` on ``console``, highlighted as ``console.print`` does a
    string (numbers, quoted strings) on a terminal, but not parsed."""
    line = text(*parts)
    highlighter = getattr(console, "highlighter", None)
    if getattr(console, "_highlight", False) and highlighter is not None:
        try:
            line = highlighter(line)
        except Exception:  # noqa: BLE001 - colour is never worth an error while reporting one
            pass
    console.print(line, **print_kw)


def _cell(x: Any, style: str = "") -> Any:
    return Text(plain(x), style=style) if isinstance(x, str) else x


class Table(rich.table.Table):
    """A rich table whose str title, caption, headers and cells are printed as they are."""

    def __init__(self, *headers: Any, title: Any = None, caption: Any = None, **kw: Any) -> None:
        super().__init__(
            *headers,
            title=_cell(title, kw.get("title_style") or "table.title"),
            caption=_cell(caption, kw.get("caption_style") or "table.caption"),
            **kw,
        )

    def add_column(self, header: RenderableType = "", footer: RenderableType = "", **kw: Any) -> None:
        # headers stay strings (``column.header == "R^2"`` keeps working), escaped so that
        # nothing in them is read as markup
        super().add_column(*(escape(plain(x)) if isinstance(x, str) else x for x in (header, footer)), **kw)

    def add_row(self, *renderables: Any, **kw: Any) -> None:
        super().add_row(*(_cell(r) for r in renderables), **kw)


def fmt_bytes(n: float | None) -> str:
    """``1536`` -> ``1.5 KiB``; ``None`` -> ``-``."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
