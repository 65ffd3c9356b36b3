"""Tula: profile, model and plan distributed large-batch training of PyTorch models.

The pipeline, one record per stage (:mod:`tula.records`; see ``DESIGN.md``)::

    JobSpec -> profile -> Profile -> fit -> FittedModels -> plan -> Plan -> train -> TrainRun -> report
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("tula")  # one source: pyproject.toml
except PackageNotFoundError:  # pragma: no cover - running from a source tree that is not installed
    __version__ = "0+unknown"
