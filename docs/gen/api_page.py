"""reference/python-api.md: mkdocstrings blocks (``::: module.Name``) for the public Python API.

What ``tula``'s ``__all__`` lists (each name at the module that defines it), the scikit-learn
estimators, the record classes of :mod:`tula.core.records` and the errors of :mod:`tula.core.errors`.
"""

from __future__ import annotations

import inspect

#: what ``tula`` exports when its ``__all__`` does not say (the names its module ``__getattr__`` makes)
DEFAULT_PUBLIC = ("Job", "AGS")


def public_names() -> list[tuple[str, str]]:
    """The classes and functions ``tula`` exports, with the module path that defines each.

    Returns
    -------
    list[tuple[str, str]]
        ``(name, "module.QualName")`` pairs, in ``__all__``'s order.
    """
    import tula

    out = []
    for name in getattr(tula, "__all__", DEFAULT_PUBLIC):
        obj = getattr(tula, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            out.append((name, f"{obj.__module__}.{obj.__qualname__}"))
    return out


def _block(path: str, heading_level: int = 3, **options: object) -> list[str]:
    lines = [f"::: {path}", "    options:", f"      heading_level: {heading_level}"]
    for key, value in options.items():
        if isinstance(value, (list, tuple)):
            lines.append(f"      {key}:")
            lines += [f"        - {v}" for v in value]
        else:
            lines.append(f"      {key}: {str(value).lower() if isinstance(value, bool) else value}")
    return [*lines, ""]


def page() -> str:
    """The page's Markdown.

    Returns
    -------
    str
        reference/python-api.md.
    """
    from tula.core import errors, records

    lines = [
        "# Python API",
        "",
        "!!! note",
        "    Generated from the code's docstrings (mkdocstrings) when the site is built.",
        "",
        "## The package `tula`",
        "",
        "`import tula` loads no torch; the names below are imported where they are first used.",
        "",
    ]
    for name, path in public_names():
        lines += _block(path, heading=f"tula.{name}", toc_label=f"tula.{name}")
        lines += [f"`tula.{name}` is defined in `{path.rsplit('.', 1)[0]}`.", ""]
    lines += [
        "## scikit-learn estimators",
        "",
        *_block("tula.sklearn.TulaClassifier"),
        *_block("tula.sklearn.TulaRegressor"),
    ]
    record_classes = [cls.__name__ for cls in records.SCHEMAS.values()]
    lines += ["## Records", ""]
    lines += _block(
        "tula.core.records",
        members=[*record_classes, "load_record", "save_record", "validate_record"],
        show_root_heading=False,
        show_root_toc_entry=False,
    )
    error_classes = [
        name
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == errors.__name__
    ]
    lines += ["## Errors", ""]
    lines += _block("tula.core.errors", members=error_classes, show_root_heading=False, show_root_toc_entry=False)
    return "\n".join(lines)
