"""The example job specs shipped in the package: list them, find them, copy one to edit.

Each example is a YAML job spec in this package (``tula/examples/NAME.yaml``), installed with
the wheel, so ``tula run --example digits`` works after ``pip install`` without a checkout.
The first comment line of each file says what it trains (:func:`summary`).

Examples
--------
>>> from tula import examples
>>> examples.names()
['digits', 'mnist1d', 'tiny_gpt']
>>> examples.summary("digits")  # doctest: +ELLIPSIS
"A small CNN on scikit-learn's digits ..."
>>> examples.copy("digits")  # doctest: +SKIP
PosixPath('digits.yaml')

This module reads files only: it imports no torch.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from tula.core.errors import SpecError, TulaError

__all__ = ["copy", "names", "path", "summary"]

_SUFFIX = ".yaml"


def _files():
    return resources.files(__name__)


def names() -> list[str]:
    """The names of the shipped examples, sorted.

    Returns
    -------
    list of str
        The example names (a file ``NAME.yaml`` each), e.g. ``["digits", "mnist1d"]``.
    """
    return sorted(f.name[: -len(_SUFFIX)] for f in _files().iterdir() if f.name.endswith(_SUFFIX) and f.is_file())


def _resource(name: str):
    known = names()
    if name not in known:
        raise SpecError(f"no example {name!r}; the examples are: {', '.join(known)}.")
    return _files() / f"{name}{_SUFFIX}"


def summary(name: str) -> str:
    """One line saying what an example trains: its file's first comment line.

    Parameters
    ----------
    name : str
        An example's name, one of :func:`names`.

    Returns
    -------
    str
        The first comment line without its ``#`` (empty if the file has no comment).

    Raises
    ------
    SpecError
        If no example has that name.
    """
    for line in _resource(name).read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            return stripped.lstrip("#").strip()
        if stripped:
            break
    return ""


def path(name: str) -> Path:
    """The path of an example's YAML file inside the installed package (read it, do not edit it).

    Parameters
    ----------
    name : str
        An example's name, one of :func:`names`.

    Returns
    -------
    pathlib.Path
        The file ``tula/examples/NAME.yaml`` where the package is installed.

    Raises
    ------
    SpecError
        If no example has that name.
    TulaError
        If the package is not on the file system (a zipped install): use :func:`copy` instead.
    """
    res = _resource(name)
    if isinstance(res, Path):
        return res
    raise TulaError(
        f"example {name!r} is inside a zipped package, not a file; write a copy with `tula examples copy {name}`."
    )


def copy(name: str, dest: str | os.PathLike[str] | None = None, *, force: bool = False) -> Path:
    """Write an example's spec to a file of your own, to edit and run.

    Parameters
    ----------
    name : str
        An example's name, one of :func:`names`.
    dest : str or os.PathLike or None
        Where to write it: a file path, or an existing directory (the file is then
        ``DEST/NAME.yaml``); ``None`` writes ``NAME.yaml`` in the current directory.  Missing
        parent directories are created.
    force : bool
        Overwrite an existing file; without it an existing destination is refused.

    Returns
    -------
    pathlib.Path
        The file written.

    Raises
    ------
    SpecError
        If no example has that name.
    TulaError
        If the destination exists and ``force`` is not set, or cannot be written.
    """
    text = _resource(name).read_text(encoding="utf-8")
    target = Path("." if dest is None else dest)
    if target.is_dir():
        target = target / f"{name}{_SUFFIX}"
    if target.exists() and not force:
        raise TulaError(f"{target} already exists; give another destination, or overwrite it with --force.")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    except OSError as e:
        raise TulaError(f"cannot write {target}: {e.strerror or e}.") from None
    return target
