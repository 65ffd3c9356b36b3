"""Fit stage: a profile record in, a fitted-models record out.

The models record is small and self-contained (spec, memory model, performance model,
data-set size, the measured trials for plots), so it is saved once and re-planned from
without profiling again.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .errors import RecordError
from .memory import MemoryModel
from .perfmodel import PerfModel, fit_perf_model
from .profile import PROFILE_KIND
from .spec import JobSpec, spec_from_dict

MODELS_KIND = "tula.models"
PLAN_KIND = "tula.plan"


def oom_local_batch(trials: list[dict]) -> int | None:
    """Smallest local batch that ran out of memory (or was skipped after one did)."""
    bad = [t["local_batch"] for t in trials if t["status"] in ("oom", "skipped")]
    return min(bad) if bad else None


def fit_models(profile: dict) -> dict:
    """Fit the memory and performance models of a profile record."""
    spec = spec_from_dict(profile["spec"])
    trials = profile["trials"]
    if not any(t["status"] == "ok" for t in trials):
        raise RecordError("the profile has no successful trial to fit a performance model to "
                          "(every trial ran out of memory or failed)")
    perf = fit_perf_model(trials, spec.collective, profile["model"]["grad_bytes"])
    ok = [t for t in trials if t["status"] == "ok"]
    probed = MemoryModel.from_dict(profile["memory"])
    mem = probed.refit([t["local_batch"] for t in ok], [t["peak_mem_bytes"] for t in ok])
    t_err = np.abs(perf.t_step_s([t["local_batch"] for t in ok], [t["n_workers"] for t in ok]) /
                   np.array([t["t_step_s"] for t in ok]) - 1)
    m_err = np.abs(mem.predict_peak_bytes(np.array([t["local_batch"] for t in ok])) /
                   np.array([t["peak_mem_bytes"] for t in ok]) - 1)
    return {
        "kind": MODELS_KIND, "version": 1, "spec": spec.to_dict(), "search": profile["search"],
        "device": profile["device"], "dataset_size": profile["dataset_size"],
        "memory_budget_bytes": profile["memory_budget_bytes"], "memory": mem.to_dict(), "memory_probed": probed.to_dict(), "perf": perf.to_dict(),
        "oom_local_batch": oom_local_batch(trials),
        "fit_error": {"t_step_median_rel": float(np.median(t_err)), "t_step_max_rel": float(t_err.max()),
                      "peak_mem_median_rel": float(np.median(m_err)), "peak_mem_max_rel": float(m_err.max())},
        "trials": trials, "profiling_s": profile.get("profiling_s"),
    }


def load_record(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise RecordError(f"file {str(p)!r} does not exist")
    try:
        rec = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RecordError(f"{str(p)!r} is not a JSON record ({err})") from None
    if not isinstance(rec, dict) or rec.get("kind") not in (PROFILE_KIND, MODELS_KIND, PLAN_KIND):
        raise RecordError(f"{str(p)!r} is not a Tula record (expected a profile, models or plan JSON)")
    return rec


def save_record(rec: dict, path: str | Path) -> Path:
    """Write atomically (temp file + rename), so a crash never leaves half a record."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(rec, indent=1, default=_jsonable))
    tmp.replace(p)
    return p


def _jsonable(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


def models_from(rec: dict) -> tuple[JobSpec, MemoryModel, PerfModel]:
    return spec_from_dict(rec["spec"]), MemoryModel.from_dict(rec["memory"]), PerfModel.from_dict(rec["perf"])
