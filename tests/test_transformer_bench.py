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


def test_the_choice_is_scored_against_the_fastest_row_the_planner_weighs_from_the_same_repeats():
    """The planner's verdict from measured rows (the step times of the last full run at a load of 5-8,
    2026-11-29 08:53): the choice (N=2 B=64 L=16, not a grid point, measured among the grid's repeats)
    against the fastest modelled row; a row the profile did not model is not the best; the row the
    models rank first is scored alike."""
    bench = _bench()

    def row(p, times: list[float], pred_s: float, modelled: bool = True) -> dict:
        median = sorted(times)[len(times) // 2]
        return {
            "label": p.label, "modelled": modelled, "global_batch": p.global_batch,
            "sequence_length": p.sequence_length, "t_step_pred_s": pred_s, "t_step_s": times,
            "tokens_per_s": p.global_batch * p.sequence_length / median,
        }  # fmt: skip

    fastest = bench.Point(1, 40, 48)
    first = bench.Point(2, 64, 24)
    rows = [
        row(fastest, [0.0307, 0.0275, 0.0219], 0.1736),
        row(first, [0.0500, 0.0359, 0.0297], 0.0641),
        row(bench.Point(2, 12, 24, "fsdp"), [0.001, 0.001, 0.001], 1.0, modelled=False),  # not weighed
    ]
    choice = bench.Point(2, 64, 16)
    verdict = bench.planner_choice(choice, rows, row(choice, [0.0278, 0.0368, 0.0268], 0.02))
    assert verdict["best_grid"] == fastest.label
    assert abs(verdict["choice_vs_best"] - (64 * 16 / 0.0278) / (40 * 48 / 0.0275)) < 1e-12  # 0.527x
    assert verdict["models_first_in_grid"] == first.label
    assert abs(verdict["models_first_vs_best"] - (64 * 24 / 0.0359) / (40 * 48 / 0.0275)) < 1e-12
    # the choice on the grid, faster than every other row: 1.0x
    on_grid = bench.planner_choice(fastest, rows, rows[0])
    assert on_grid["choice_vs_best"] == 1.0 and on_grid["choice_t_step_s"] == rows[0]["t_step_s"]
    # a choice none of whose repeats ran: not scored
    assert "choice_vs_best" not in bench.planner_choice(choice, rows, {"t_step_pred_s": 0.02, "statuses": ["oom"]})
