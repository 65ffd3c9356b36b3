"""One pydantic validation error, typed: where it is, what pydantic says, of which type.

A spec, a record, a plan's constraints, the fitted models and the service's settings each
turn the first error of a :class:`pydantic.ValidationError` into one sentence of their own;
:func:`first_error` reads that error once, and :class:`FieldError` gives the parts the
sentences are made of (the field's dotted path, the message without pydantic's
``"Value error, "`` prefix, lower-cased where a sentence goes on after a colon)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

_VALUE_ERROR = "Value error, "  # what pydantic puts before a validator's ValueError


@dataclass(frozen=True)
class FieldError:
    """The first error of a :class:`pydantic.ValidationError`."""

    loc: tuple[int | str, ...]
    """the path to the field: keys and list indices"""
    raw_message: str
    """pydantic's message as it is (``"Value error, ..."`` for a validator's ValueError)"""
    type: str
    """pydantic's error type: ``missing``, ``extra_forbidden``, ``literal_error``, ..."""
    input: Any = None
    """the value refused"""

    def where(self, *, escape_keys: bool = False) -> str:
        """The field's dotted path (``"a.0.b"``; ``""`` for the whole object); ``escape_keys``:
        a key written as its repr without quotes (a key may hold a line break)."""
        return ".".join(repr(p)[1:-1] if escape_keys and isinstance(p, str) else str(p) for p in self.loc)

    @property
    def message(self) -> str:
        """pydantic's message without its ``"Value error, "`` prefix."""
        return self.raw_message.removeprefix(_VALUE_ERROR)

    @property
    def missing(self) -> bool:
        return self.type == "missing"


def first_error(err: ValidationError) -> FieldError:
    """``err``'s first error, typed."""
    e = err.errors()[0]
    return FieldError(loc=tuple(e["loc"]), raw_message=e["msg"], type=e["type"], input=e.get("input"))


def lowered(message: str) -> str:
    """``message`` with its first letter lower-case, to go on after a colon (``""`` stays ``""``)."""
    return message[:1].lower() + message[1:]
