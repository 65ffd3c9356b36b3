"""Tula: profile, model and plan distributed large-batch training of PyTorch models.

The pipeline, one record per stage (:mod:`tula.core.records`; ``docs/architecture.md`` draws
the layers, the records a job hands on, how a world of ranks starts and how the service runs
a job; its section "The files" lists the files)::

    JobSpec -> profile -> Profile -> fit -> FittedModels -> plan -> Plan -> train -> TrainRun -> report

Five layers, each importing only the ones below it (import-linter holds this: ``make lint``):

* :mod:`tula.cli`, the command, over every front;
* the fronts, none importing another: the service (:mod:`tula.service`), the scikit-learn
  estimators (:mod:`tula.sklearn`) and the Python API (:mod:`tula.job`);
* the stages every front runs: the pipeline (:mod:`tula.pipeline`), the reports
  (:mod:`tula.report`) and the optimisers' public names (:mod:`tula.optim`);
* :mod:`tula.engine`: what measures and trains, with torch;
* :mod:`tula.core`: the records, the rules and the pure models (no torch).

The public names here: :class:`tula.Job` (the pipeline from Python), :class:`tula.AGS` (the
optimiser wrapper for your own loop), :mod:`tula.examples` (the example specs shipped in the
package) and ``tula.__version__``.  They are made on first use, so ``import tula`` alone loads
no torch; type checkers and IDEs follow the imports below.
"""

# `TYPE_CHECKING = False` rather than `from typing import TYPE_CHECKING`: the same meaning to mypy and
# pyright, without importing typing (milliseconds) before the command can answer Ctrl-C
TYPE_CHECKING = False
if TYPE_CHECKING:
    from tula import examples
    from tula.job import Job
    from tula.optim import AGS

    __version__: str

__all__ = ["AGS", "Job", "__version__", "examples"]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tula")  # one source: pyproject.toml
    except PackageNotFoundError:  # pragma: no cover - running from a source tree that is not installed
        return "0+unknown"


def __getattr__(name: str):
    """``tula.__version__``, ``tula.AGS``, ``tula.Job`` and ``tula.examples``: made on first use
    (``import tula`` alone loads no torch, and costs nothing before the command can handle Ctrl-C)."""
    if name == "__version__":
        globals()["__version__"] = v = _version()
        return v
    if name == "AGS":
        from tula.optim import AGS

        return AGS
    if name == "Job":
        from tula.job import Job

        return Job
    if name == "examples":  # a submodule: imported by name (``from tula import examples`` here would ask this again)
        import importlib

        return importlib.import_module("tula.examples")
    raise AttributeError(f"module 'tula' has no attribute {name!r}")
