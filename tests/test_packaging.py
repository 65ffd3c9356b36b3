"""The package as a user gets it: the wheel's contents and metadata, one version everywhere,
the citation file, the shipped example specs (:mod:`tula.examples`), and the wheel installed
into a fresh venv outside the checkout, where ``tula examples`` and ``tula run --example digits``
work."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, assert_imports_no_torch, assert_refused

from tula import examples
from tula.core.errors import SpecError, TulaError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

EXAMPLES = ["digits", "mnist1d", "tiny_gpt"]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


# --------------------------------------------------------------------------- one version
def test_the_version_is_the_same_in_pyproject_the_citation_and_the_changelog():
    version = _pyproject()["project"]["version"]
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert str(citation["version"]) == version
    releases = re.findall(r"^## \[([^\]]+)\]", (ROOT / "CHANGELOG.md").read_text(), flags=re.MULTILINE)
    assert releases[0] == "Unreleased", releases
    assert releases[1] == version, f"the changelog's latest release is {releases[1]}, pyproject says {version}"


def test_the_version_comes_from_the_installed_metadata():
    """``tula.__version__`` reads the one version (pyproject's, through the installed metadata)."""
    import tula

    assert tula.__version__ == _pyproject()["project"]["version"]


def test_citation_cff_cites_the_software_and_the_two_papers():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0"
    for key in ("message", "title", "version", "license", "authors", "references"):
        assert cff.get(key), key
    assert cff["title"] == "Tula" and cff["license"] == "Apache-2.0"
    assert cff["authors"] == [{"name": "The Tula developers"}]
    titles = {ref["title"]: ref for ref in cff["references"]}
    tula_paper = titles["Tula: Optimizing Time, Cost, and Generalization in Distributed Large-Batch Training"]
    dask_paper = titles["Training machine learning models faster with Dask"]
    assert [a["family-names"] for a in tula_paper["authors"]] == ["Tyagi", "Wang"]
    assert [a["family-names"] for a in dask_paper["authors"]] == ["Holt", "Sievert"]
    for ref in cff["references"]:
        assert ref["type"] and all(a.get("given-names") for a in ref["authors"])
        assert "doi" not in ref, "no DOI is printed in the papers' texts"


def test_licence_and_metadata_in_pyproject():
    project = _pyproject()["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert project["authors"] == [{"name": "The Tula developers"}]
    assert project["readme"] == "README.md" and project["keywords"]
    assert "Typing :: Typed" in project["classifiers"]
    licence = (ROOT / "LICENSE").read_text()
    assert licence.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in licence
    assert "Copyright 2026 The Tula developers" in licence


# --------------------------------------------------------------------------- tula.examples
def test_examples_are_listed_summarised_and_found():
    assert examples.names() == EXAMPLES
    for name in EXAMPLES:
        path = examples.path(name)
        assert path.name == f"{name}.yaml" and path.parent == Path(examples.__file__).parent
        summary = examples.summary(name)
        assert summary and "\n" not in summary and not summary.startswith("#")
        assert yaml.safe_load(path.read_text())["name"]  # a spec, not only a comment
    assert "digits" in examples.summary("digits")


def test_an_unknown_example_is_one_sentence_naming_the_known_ones(tmp_path):
    for call in (examples.path, examples.summary, examples.copy):
        with pytest.raises(SpecError) as e:
            call("cifar")
        assert str(e.value) == "no example 'cifar'; the examples are: digits, mnist1d, tiny_gpt."
    assert list(tmp_path.iterdir()) == []


def test_copy_writes_the_example_and_refuses_to_overwrite_without_force(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    written = examples.copy("digits")
    assert written == Path("digits.yaml") and written.read_text() == examples.path("digits").read_text()
    (tmp_path / "digits.yaml").write_text("mine\n")
    with pytest.raises(TulaError) as e:
        examples.copy("digits")
    assert str(e.value) == "digits.yaml already exists; give another destination, or overwrite it with --force."
    assert (tmp_path / "digits.yaml").read_text() == "mine\n"  # left as it was
    assert examples.copy("digits", force=True).read_text() == examples.path("digits").read_text()
    # a directory takes NAME.yaml; a file path is written as given, its folders made
    (tmp_path / "specs").mkdir()
    assert examples.copy("mnist1d", tmp_path / "specs") == tmp_path / "specs" / "mnist1d.yaml"
    assert examples.copy("mnist1d", "new/dir/m.yaml").read_text() == examples.path("mnist1d").read_text()


def test_copy_into_an_unwritable_place_is_one_sentence(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(TulaError) as e:
        examples.copy("digits", blocker / "digits.yaml")  # a folder that is a file
    assert str(e.value).startswith(f"cannot write {blocker / 'digits.yaml'}: ") and "\n" not in str(e.value)


def test_the_examples_module_loads_no_torch():
    assert_imports_no_torch("tula.examples")


# --------------------------------------------------------------------------- the wheel
@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the checkout's package files (pip, no build isolation,
    nothing downloaded): the checkout gets no build/ or egg-info of the build's."""
    src = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "src" / "tula", src / "src" / "tula", ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path_factory.mktemp("dist")
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", str(src),
         "-w", str(dist)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    (built,) = dist.glob("tula-*.whl")
    return built


def test_the_wheel_holds_py_typed_the_examples_and_the_licence(wheel):
    version = _pyproject()["project"]["version"]
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        info = f"tula-{version}.dist-info"
        for needed in ("tula/py.typed", "tula/examples/__init__.py", "tula/examples/digits.yaml",
                       "tula/examples/mnist1d.yaml", f"{info}/licenses/LICENSE"):  # fmt: skip
            assert needed in names, needed
        assert z.read(f"{info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
        assert z.read("tula/examples/digits.yaml") == examples.path("digits").read_bytes()
        metadata = z.read(f"{info}/METADATA").decode()
    headers = metadata.split("\n\n", 1)[0].splitlines()
    assert "License-Expression: Apache-2.0" in headers
    assert "License-File: LICENSE" in headers
    assert "Author: The Tula developers" in headers
    classifiers = [h for h in headers if h.startswith("Classifier: ")]
    assert "Classifier: Typing :: Typed" in classifiers
    assert "Classifier: Programming Language :: Python :: 3.10" in classifiers
    assert "Classifier: Operating System :: POSIX :: Linux" in classifiers


@pytest.fixture(scope="module")
def fresh_venv(wheel, tmp_path_factory) -> Path:
    """A new venv outside the checkout with the wheel installed (no dependencies); those come
    from this venv's site-packages through a .pth file written after the install (installing
    torch again would take minutes, and pip would otherwise take this venv's editable tula for
    the package already installed)."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    assert ROOT not in venv.parents
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    r = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps",
         "--no-index", str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    site = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout.strip()
    )  # fmt: skip
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "_tula_test_dependencies.pth").write_text("".join(f"{p}\n" for p in sorted(ours)))
    return venv


def _fresh_env(venv: Path) -> dict:
    """The environment of a user who activated ``venv``: nothing of the checkout on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH")}
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.mark.slow
def test_the_wheel_in_a_fresh_venv_outside_the_checkout_runs_the_demo(fresh_venv, tmp_path):
    env, work = _fresh_env(fresh_venv), tmp_path / "work"
    work.mkdir()

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), cwd=work, env=env, capture_output=True, text=True, timeout=timeout)

    # the package imported is the wheel's, not the checkout's src/ (no editable finder leaks in)
    r = run("python", "-c", "import sys, tula, tula.examples as e; print(tula.__file__); print(e.path('digits')); "
            "print(tula.__version__); print(any(m == 'torch' for m in sys.modules))")  # fmt: skip
    assert r.returncode == 0, r.stderr
    package, digits, version, torch_loaded = r.stdout.split("\n")[:4]
    assert Path(package).is_relative_to(fresh_venv) and Path(digits).is_relative_to(fresh_venv), r.stdout
    assert not Path(package).is_relative_to(ROOT), r.stdout
    assert version == _pyproject()["project"]["version"] and torch_loaded == "False"
    tula = str(fresh_venv / "bin" / "tula")

    r = run(tula, "examples")
    assert r.returncode == 0, r.stderr
    assert "digits" in r.stdout and "mnist1d" in r.stdout, r.stdout

    r = run(tula, "examples", "copy", "digits")
    assert r.returncode == 0, r.stderr
    assert (work / "digits.yaml").read_text() == examples.path("digits").read_text()

    r = run(tula, "examples", "copy", "cifar")
    assert_refused(r, "no example 'cifar'; the examples are: digits, mnist1d, tiny_gpt.")

    out = tmp_path / "out"
    r = run(tula, "run", "--example", "digits", "--epochs", "1", "--out", str(out), timeout=900)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert (out / "plan.json").is_file() and (out / "train" / "train.json").is_file()
