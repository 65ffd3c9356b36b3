"""Fitting and planning read records and run on numpy alone: torch is never imported."""

import json

from helpers import profile_record, run_python

from tula.core.records import validate_record


def test_fit_plan_and_report_run_without_torch(tiny_spec_dict, tmp_path):
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps(validate_record(profile_record(tiny_spec_dict), "test")))
    code = f"""
import sys
from tula.core.records import load_record, PROFILE_KIND
from tula.core.fit import fit_models
from tula.core.plan import make_plan
from tula.report import plan_table, plot_plan
models = fit_models(load_record({str(prof)!r}, expect=(PROFILE_KIND,)))
plan = make_plan(models, "time")
plan_table(plan)
plot_plan(plan, models.trials, {str(tmp_path / "plan.png")!r})
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
assert not loaded, loaded[:5]
print(plan.choice.n_workers, plan.choice.global_batch)
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    # T/E = D/B * t_step: N=1, B=256 gives 1438/256 * 3.56 ms = 20.0 ms per epoch; N=2 halves the
    # compute but adds 2 ms of sync: 1438/256 * 4.28 ms = 24.0 ms.  The fit recovers the exact
    # synthetic times, so the fastest is N=1 at the largest batch the search allows (256).
    assert r.stdout.split() == ["1", "256"]
    assert (tmp_path / "plan.png").read_bytes()[:4] == b"\x89PNG"
