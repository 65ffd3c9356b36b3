"""Every benchmark script (``bench/*.py``) still starts: it imports against today's package and
its argument parser answers ``--help``.  The benchmarks are not run by the suite (they time real
work for minutes to hours), so a script broken by an API change -- a renamed function, a record
read as a dict -- was found only when someone next ran it; this finds the break at import (a name
that is gone) and, with ``make lint``'s mypy over ``bench/``, in the calls themselves."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py"))
#: scripts without a command line: imported only
IMPORT_ONLY = {
    "_stats.py": "the benchmarks' statistics helpers, not a command",
    "precision.py": "no arguments: started, it runs the whole comparison",
}
#: the benchmarks' own extras (pyproject's ``bench``), absent from the test environment
BENCH_EXTRAS = {"lightning"}


def _import(name: str, monkeypatch: pytest.MonkeyPatch):
    """``bench/<name>`` as a module of its own, with ``bench/`` on the path as when it runs
    (its ``from _stats import ...``); the path and the module are restored afterwards."""
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{Path(name).stem}", BENCH / name)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)  # its dataclasses look their module up
    try:
        spec.loader.exec_module(mod)
    except ModuleNotFoundError as err:
        if err.name in BENCH_EXTRAS:
            pytest.skip(f"{name} needs {err.name} (pip install -e '.[bench]')")
        raise
    return mod


def test_every_script_is_listed():
    assert len(SCRIPTS) > 20  # the folder was found
    assert set(IMPORT_ONLY) <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_script_imports_and_its_parser_answers_help(name, monkeypatch, capsys):
    mod = _import(name, monkeypatch)
    if name in IMPORT_ONLY:
        return
    assert callable(getattr(mod, "main", None)), f"{name} has no main()"
    monkeypatch.setattr(sys, "argv", [str(BENCH / name), "--help"])
    with pytest.raises(SystemExit) as ended:
        mod.main()
    assert ended.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:") and "--help" in out
