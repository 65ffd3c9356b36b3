"""Dependencies a GPU user can install (#25 item 4): pyproject.toml declares torch and
torchvision as ranges -- the oldest tested (torch 2.11, the H200 node's) up to the newest (2.14.x)
-- so pip keeps a node's CUDA build; constraints.txt pins the exact versions `make` installs
(CI's), and the Makefile installs with it.  Pure reads of the files, and of what is installed."""

from __future__ import annotations

import re
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - python 3.10
    tomllib = pytest.importorskip("tomli")

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _requirements() -> dict[str, Requirement]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {(r := Requirement(d)).name.lower(): r for d in deps}


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, ver = line.partition("==")
            assert sep and ver, f"constraints.txt: {line!r} is not an exact pin"
            pins[name.strip().lower()] = ver.strip()
    return pins


def test_torch_and_torchvision_are_ranges_from_the_oldest_tested_to_the_newest():
    reqs = _requirements()
    for name, oldest, newest, beyond in (
        ("torch", "2.11.0", "2.14.1", "2.15.0"),
        ("torchvision", "0.26.0", "0.29.1", "0.30.0"),
    ):
        spec = reqs[name].specifier
        assert not any(s.operator in ("==", "===") for s in spec), f"{name} is pinned in pyproject.toml: {spec}"
        assert spec.contains(oldest) and spec.contains(newest) and not spec.contains(beyond), (name, spec)
        assert not spec.contains(str(Version(oldest).major) + "." + str(Version(oldest).minor - 1)), (name, spec)


def test_the_constraints_file_pins_what_ci_installs_inside_those_ranges():
    reqs, pins = _requirements(), _pins()
    assert pins["torch"] == "2.14.1" and pins["torchvision"] == "0.29.1"
    for name, ver in pins.items():
        if name in reqs:  # a pin pyproject.toml would refuse could never be installed
            assert reqs[name].specifier.contains(ver, prereleases=True), (name, ver, reqs[name].specifier)
    # every direct dependency of Tula has its pin (torch's own dependencies follow from torch's)
    missing = [n for n, r in reqs.items() if n not in pins and (r.marker is None or r.marker.evaluate())]
    assert not missing, f"constraints.txt pins no version of {missing}"


def test_make_installs_with_the_constraints_and_reinstalls_when_they_change():
    makefile = (ROOT / "Makefile").read_text()
    stamp_rule = re.search(r"^\$\(STAMP\):(.*)$", makefile, re.M)
    assert stamp_rule and "constraints.txt" in stamp_rule.group(1).split()
    installs = re.findall(r"pip install[^\n]*-e '\.\[[^\n]*", makefile)
    assert installs and all("-c constraints.txt" in line for line in installs), installs


def test_this_environment_has_the_pinned_torch():
    # `make venv` installed from constraints.txt: what the tests run with is what it names (a
    # different torch here is an environment someone made by hand, and its numbers are not CI's)
    pins = _pins()
    installed = Version(version("torch")).base_version
    if installed != pins["torch"]:
        pytest.skip(f"torch {version('torch')} is installed here, not the pinned {pins['torch']}")
    assert Version(version("torchvision")).base_version == pins["torchvision"]
