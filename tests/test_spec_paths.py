"""Spec fields no other test tries (issue #27, item 3): ``profile.trial_timeout_s`` with a trial
that hangs, and ``search.batch_growth`` other than 2.

The hanging trial's model is defined here (:func:`hangs_from`): a rank imports it by its
name ``test_spec_paths:hangs_from`` (tests/ on the ranks' import path)."""

from __future__ import annotations

import os
import time

import pytest
from helpers import MODELS_D, local_launcher, models_record, ranks_below

HANG_AT = 64  # the local batch from which a training step never ends


def hangs_from(local_batch: int = HANG_AT, **kwargs):
    """Tula's small CNN whose training forward pass sleeps for an hour from ``local_batch``
    samples on: a trial there hangs (a sleep, no CPU) until something kills its rank."""
    from tula.engine.workloads import SmallCNN

    class _Hangs(SmallCNN):
        def forward(self, x):
            if self.training and x.shape[0] >= local_batch:
                time.sleep(3600)
            return super().forward(x)

    return _Hangs(**kwargs)


@pytest.mark.slow  # a spawned world (a world with a timeout cannot run in this process)
def test_a_hanging_trial_ends_at_the_trial_timeout_and_the_finished_trials_are_kept(tiny_spec_dict, tests_on_path):
    from tula.core.spec import spec_from_dict
    from tula.engine.profile import ProfileFailed, profile

    trial_timeout_s = 2.5
    d = dict(
        tiny_spec_dict,
        model={"name": "test_spec_paths:hangs_from", "kwargs": {"in_channels": 1, "num_classes": 10, "width": 8}},
        search={"cluster_sizes": [1], "min_batch": 16, "max_batch": 64},
        profile={**tiny_spec_dict["profile"], "trial_timeout_s": trial_timeout_s},
    )
    spec = spec_from_dict(d)
    # the world's limit: a trial's timeout for each of its 3 candidate trials (B 16, 32, 64), and one more
    limit_s = trial_timeout_s * (3 + 1)
    t0 = time.monotonic()
    with pytest.raises(ProfileFailed) as caught:
        profile(spec, "partial", launcher=local_launcher())
    took_s = time.monotonic() - t0
    err = caught.value
    assert err.cause == "timeout", (err.cause, str(err))
    assert f"did not finish within {limit_s:.0f} s" in str(err), str(err)
    assert limit_s <= took_s < limit_s + 60, took_s  # at the limit, not after the hour's sleep
    rec = err.record
    status = {(t.n_workers, t.global_batch): t.status for t in rec.trials}
    assert status == {(1, 16): "ok", (1, HANG_AT): "error"}, status  # partial search: the extremes
    assert rec.failed and "did not finish within" in rec.failed
    assert ranks_below(os.getpid()) == []  # the hung rank was killed, not left sleeping


@pytest.mark.parametrize(
    "growth, batches",
    [(3, [16, 48, 144]), (4, [16, 64, 256]), (5, [16, 80]), (16, [16, 256])],
)
def test_batch_growth_other_than_two_is_the_grid_the_search_and_the_plan_use(growth, batches):
    from tula.core.errors import SpecError
    from tula.core.perfmodel import PerfModel
    from tula.core.plan import make_plan
    from tula.core.space import candidate_configs, candidate_global_batches
    from tula.core.spec import JobSpec, spec_from_dict
    from tula.service.admission import search_space_size

    spec = spec_from_dict(
        {"search": {"cluster_sizes": [1, 2], "min_batch": 16, "max_batch": 256, "batch_growth": growth}}
    )
    assert candidate_global_batches(spec.search, 100_000) == batches
    configs = candidate_configs(spec.search, 100_000, None)
    assert [(c.n_workers, c.global_batch) for c in configs] == [(n, b) for n in (1, 2) for b in batches]
    assert search_space_size(spec) == len(configs)  # the service's bound counts the same grid
    assert candidate_global_batches(spec.search, 100) == [b for b in batches if b <= 100]  # the data set caps it

    # the planner's candidates (the rows a plan lists; it chooses on the dense curve between
    # them) are the same grid (min_batch 10, max_batch 1000 in the models record)
    rec = models_record(PerfModel("ring", grad_bytes=10**6, c0=0.01, c1=0.001, beta=0.01 / 10**6))
    rec["spec"] = spec_from_dict({**rec["spec"], "search": {**rec["spec"]["search"], "batch_growth": growth}}).to_dict()
    plan = make_plan(rec, "time")
    grid = [b for b in (10 * growth**k for k in range(10)) if b <= MODELS_D]
    for n in (1, 2):
        got = sorted(r.global_batch for r in plan.configurations if r.candidate and r.n_workers == n)
        assert got == [b for b in grid if b % n == 0], (n, got)
    # below 2 is one sentence
    with pytest.raises(SpecError, match="search.batch_growth"):
        spec_from_dict({"search": {"batch_growth": 1}})
    assert JobSpec().search.batch_growth == 2


def test_a_data_set_that_does_not_fit_in_memory_is_the_users_error_in_one_sentence(tmp_path, tiny_spec_dict):
    """A synthetic set of about 2 PB: the allocator's failure is the user's error (exit 2, one
    sentence naming the set and its size), never an internal error, and no rank is started."""
    import yaml
    from helpers import assert_refused, tula_in_process

    data = {"name": "synthetic", "sample_shape": [3, 4096, 4096], "num_samples": 10_000_000}
    spec = tmp_path / "huge.yaml"
    spec.write_text(yaml.safe_dump({**tiny_spec_dict, "data": data}))
    r = tula_in_process("profile", spec, "--out", tmp_path / "p.json")
    assert_refused(r, "data set 'synthetic' of 1831.1 TiB does not fit in this host's memory")
    assert "use fewer or smaller samples" in r.stderr and not (tmp_path / "p.json").exists()
