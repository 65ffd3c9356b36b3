"""The architecture's contracts hold, and they are not vacuous: import-linter passes on the
source as it is and fails on a copy with one deliberate violation -- a torch import in the
core, an upward import from the core into the engine, an import circle between two core
modules -- naming the contract and the import; ruff and mypy pass (``make lint``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{name} is not installed in {BIN}: `make venv` installs the test extras")
    return str(path)


def lint_imports(src: Path) -> subprocess.CompletedProcess:
    """import-linter on the package under ``src`` (its directory first on the path: the copy,
    not the installed tree, is analysed), with the repository's contracts; no cache."""
    return subprocess.run(
        [_tool("lint-imports"), str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(src)},
    )


@pytest.fixture(scope="module")
def source_copy(tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("lint") / "src"
    shutil.copytree(ROOT / "src", dst, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return dst


def _with_line(src: Path, module: str, line: str) -> Path:
    """A fresh copy of ``src`` whose ``module`` (a path under src/) has ``line`` added after
    its docstring's future import."""
    dst = src.parent / f"src-{abs(hash((module, line)))}"
    shutil.copytree(src, dst)
    path = dst / module
    text = path.read_text()
    anchor = "from __future__ import annotations\n"
    assert anchor in text, f"{module} has no future import to anchor the line to"
    path.write_text(text.replace(anchor, anchor + line + "\n", 1))
    return dst


def test_the_contracts_hold_on_the_source(source_copy):
    r = lint_imports(source_copy)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


def test_torch_in_the_core_breaks_the_forbidden_contract(source_copy):
    r = lint_imports(_with_line(source_copy, "tula/core/perfmodel.py", "import torch  # noqa"))
    assert r.returncode != 0
    assert "never imports torch" in r.stdout and "BROKEN" in r.stdout
    assert "tula.core.perfmodel -> torch" in r.stdout


def test_the_core_importing_the_engine_breaks_the_layers(source_copy):
    r = lint_imports(_with_line(source_copy, "tula/core/plan.py", "from tula.engine import ddp  # noqa"))
    assert r.returncode != 0
    assert "tula.core.plan -> tula.engine.ddp" in r.stdout


def test_a_front_importing_another_front_or_a_stage_importing_a_front_breaks_the_layers(source_copy):
    """The fronts (service, sklearn, job) are independent; the stages (pipeline, report) sit below them."""
    r = lint_imports(_with_line(source_copy, "tula/service/replan.py", "import tula.sklearn  # noqa"))
    assert r.returncode != 0
    assert "tula.service.replan -> tula.sklearn" in r.stdout
    r = lint_imports(_with_line(source_copy, "tula/pipeline.py", "import tula.service.store  # noqa"))
    assert r.returncode != 0
    assert "tula.pipeline -> tula.service.store" in r.stdout


def test_an_import_circle_in_the_core_is_found(source_copy):
    # spec imports registry's names; registry importing spec back closes a circle
    r = lint_imports(_with_line(source_copy, "tula/core/registry.py", "import tula.core.spec  # noqa"))
    assert r.returncode != 0
    assert "No cycles are allowed in tula.core." in r.stdout
    assert "- .spec -> .registry" in r.stdout or "- .registry -> .spec" in r.stdout


def test_ruff_and_mypy_pass():
    for cmd in (
        [_tool("ruff"), "check", "src", "tests", "bench", "examples"],
        [_tool("ruff"), "format", "--check", "src", "tests", "bench", "examples"],
        [_tool("mypy")],
    ):
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"{' '.join(cmd[1:])}:\n{r.stdout[-3000:]}{r.stderr[-2000:]}"
