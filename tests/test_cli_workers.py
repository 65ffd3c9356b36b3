"""``--workers`` on the verbs that profile and plan (run, profile, plan, submit): the worker
counts to profile and plan over, in place of the spec's ``search.cluster_sizes``; checked
through the command's entry point in this process, as a user gets it."""

from __future__ import annotations

import json

import pytest
from helpers import assert_refused, models_record, tula_in_process, write_spec

from tula.core.perfmodel import PerfModel
from tula.core.records import load_record

PERF = PerfModel("ring", grad_bytes=10**6, c0=0.01, c1=0.001, beta=0.01 / 10**6)


def _models(tmp_path, sizes=(1, 2)):
    path = tmp_path / "models.json"
    path.write_text(json.dumps(models_record(PERF, sizes=sizes, full=True)))
    return path


def _sizes(plan: dict) -> set[int]:
    return {r["n_workers"] for r in plan["configurations"]}


def test_plan_from_models_plans_over_the_workers_given(tmp_path):
    models = _models(tmp_path)
    r = tula_in_process("plan", models, "--out", tmp_path / "all.json")
    assert r.returncode == 0, r.stderr
    assert _sizes(load_record(tmp_path / "all.json")) == {1, 2}  # can fail: the spec's counts without --workers
    r = tula_in_process("plan", models, "--workers", "1", "--out", tmp_path / "one.json")
    assert r.returncode == 0, r.stderr
    plan = load_record(tmp_path / "one.json")
    assert _sizes(plan) == {1} and plan["choice"]["n_workers"] == 1
    assert plan["spec"]["search"]["cluster_sizes"] == [1]


def test_plan_from_models_predicts_a_count_it_did_not_measure(tmp_path):
    r = tula_in_process("plan", _models(tmp_path), "--workers", "2,4", "--out", tmp_path / "p.json")
    assert r.returncode == 0, r.stderr
    plan = load_record(tmp_path / "p.json")
    assert _sizes(plan) == {2, 4}
    assert any(row["n_workers"] == 4 and row["feasible"] for row in plan["configurations"])


@pytest.mark.parametrize("verb", ["run", "profile", "plan", "submit"])
@pytest.mark.parametrize("value, sentence", [("1,two", "--workers: worker count 'two'"), ("0", "--workers: ")])
def test_a_bad_count_is_one_sentence_before_any_work(tmp_path, tiny_spec_dict, verb, value, sentence):
    spec = write_spec(tmp_path, tiny_spec_dict)
    assert_refused(tula_in_process(verb, spec, "--workers", value), sentence)
    assert not (tmp_path / "runs").exists()


def test_profile_measures_only_the_counts_given(tmp_path, tiny_spec_dict):
    spec = write_spec(tmp_path, tiny_spec_dict)  # search.cluster_sizes: [1, 2]
    out = tmp_path / "p" / "profile.json"
    r = tula_in_process("profile", spec, "--workers", "1", "--out", out)
    assert r.returncode == 0, r.stderr
    rec = load_record(out)
    assert rec["trials"] and {t["n_workers"] for t in rec["trials"]} == {1}
    assert rec["spec"]["search"]["cluster_sizes"] == [1]
    # continuing it is the same job only with the same counts
    again = tula_in_process("profile", spec, "--resume", out.parent)
    assert_refused(again, "was profiled from another spec than")


def test_run_resume_refuses_other_workers_than_it_was_started_with(tmp_path, tiny_spec_dict):
    from tula.core.spec import spec_from_dict
    from tula.pipeline import RunSettings, start_run

    out = tmp_path / "run"
    out.mkdir()
    job = spec_from_dict({**tiny_spec_dict, "search": {**tiny_spec_dict["search"], "cluster_sizes": [1]}})
    start_run(out, job, RunSettings("partial", None, False))  # a run started with --workers 1, stopped at once
    assert_refused(
        tula_in_process("run", "--resume", out, "--workers", "1,2"),
        f"the run in {out} was started with --workers 1; --resume continues it as it was started, so drop "
        "--workers 1,2",
    )
    spec = write_spec(tmp_path, tiny_spec_dict)  # its own counts are 1,2: with --workers 1 the same job
    other = write_spec(tmp_path, {**tiny_spec_dict, "epochs": 5}, name="other.yaml")
    assert_refused(tula_in_process("run", other, "--resume", out, "--workers", "1"), "differs from the spec the run in")
    assert_refused(tula_in_process("run", spec, "--resume", out), "differs from the spec the run in")
