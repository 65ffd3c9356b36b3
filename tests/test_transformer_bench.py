"""``bench/transformer_plan.py`` (#44's benchmark) without its worlds: the held-out grid and the
largest batch predicted under a memory cap.  Its real run (about 4 minutes of worlds) is recorded
in docs/benchmarks.md; ``--quick`` takes over a minute, too long for the suite."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = Path(__file__).parent / "data" / "records"


def _bench():
    sys.path.insert(0, str(ROOT / "bench"))  # the script imports bench/_stats.py as the folder it runs from
    spec = importlib.util.spec_from_file_location("bench_transformer_plan", ROOT / "bench" / "transformer_plan.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_the_grid_holds_out_the_fitted_lengths_and_scores_fsdp_and_checkpointing_apart():
    bench = _bench()
    for quick in (False, True):
        points = bench.grid(quick)
        assert len(set(points)) == len(points)
        assert bench.FIT_LENGTH not in {p.sequence_length for p in points}  # no point at the fitted length
        assert {p.n_workers for p in points} == {1, 2}
        covered = [p for p in points if p.covered]
        assert covered and all(p.parallelism == "ddp" and not p.checkpointing for p in covered)
        assert {p.parallelism for p in points} == {"ddp", "fsdp"} and any(p.checkpointing for p in points)
    assert "fsdp ckpt" in bench.Point(2, 40, 48, "fsdp", True).label


def test_the_largest_batch_under_a_cap_is_the_last_whose_predicted_peak_fits():
    from tula.core.fitted import FittedModels
    from tula.core.records import ModelsRecord
    from tula.core.variants import RunVariant

    bench = _bench()
    models = ModelsRecord.from_dict(json.loads((RECORDS / "models.json").read_text()))
    fitted = FittedModels.from_record(models)
    peak = lambda b: float(fitted.predict(n_workers=1, local_batch=b).peak_mem_bytes[0])  # noqa: E731
    budget = int(peak(37) + 1)
    plain = RunVariant(False)
    b_star = bench.largest_fitting_batch(models, 32, budget, plain)
    assert b_star == 37 and peak(b_star) <= budget < peak(b_star + 1)
    assert bench.largest_fitting_batch(models, 32, int(peak(1)) - 1, plain) == 0  # not one sample fits
    # a variant the record did not measure (no sharding effect): predicted as plain DDP, and said so
    assert bench.fitted_for(models, RunVariant(False, "fsdp"))[1] is False
    assert bench.fitted_for(models, plain)[1] is True
