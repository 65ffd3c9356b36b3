import json
import os
import time

import pytest
import yaml
from helpers import assert_refused, env_with_tests, run_tula, tula_in_process


@pytest.mark.slow  # a real DDP world
def test_run_then_replan_from_saved_models(tmp_path, tiny_spec_dict, tiny_pipeline):
    # `tula run` of the tiny spec: the session's (a copy of it, which the commands below may write into)
    assert tiny_pipeline.spec == tiny_spec_dict
    spec = tiny_pipeline.spec_path
    out = tiny_pipeline.copy_to(tmp_path / "run")
    for name in ("profile.json", "models.json", "plan.json", "plan.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    prof = json.loads((out / "profile.json").read_text())
    assert {t["status"] for t in prof["trials"]} == {"ok"}
    plan = json.loads((out / "plan.json").read_text())
    assert plan["objective"] == "knee" and plan["choice"]["feasible"]
    assert "choice" in tiny_pipeline.stdout

    # re-plan from the saved models: no profiling, a different objective
    t0 = time.monotonic()
    r2 = tula_in_process(
        "plan", out / "models.json", "--objective", "time", "--out", tmp_path / "p2.json", "--plot", tmp_path / "p2.png"
    )
    assert r2.returncode == 0, r2.stderr
    assert time.monotonic() - t0 < 30
    assert "profiling" not in r2.stderr
    p2 = json.loads((tmp_path / "p2.json").read_text())
    assert p2["objective"] == "time"
    fastest = min(c["total_time_s"] for c in p2["configurations"] if c["feasible"])
    assert p2["choice"]["total_time_s"] == fastest
    assert (tmp_path / "p2.png").exists()

    # a plan is not something to plan from: one sentence, exit 2, nothing overwritten
    before = (out / "plan.json").read_text()
    r3 = run_tula("plan", out / "plan.json", "--out", out / "plan.json")
    assert r3.returncode == 2 and "is a plan" in r3.stderr and "Traceback" not in r3.stderr
    assert (out / "plan.json").read_text() == before

    # run trained at the choice; a second run into the same --out refuses before profiling,
    # and the command it suggests continues the run (here: nothing left to do)
    tr = json.loads((out / "train" / "train.json").read_text())
    assert (tr["n_workers"], tr["global_batch"]) == (plan["choice"]["n_workers"], plan["choice"]["global_batch"])
    assert [h["epoch"] for h in tr["history"]] == [1, 2] and tr["replicas_identical"]
    r4 = run_tula("run", spec, "--out", out)
    assert r4.returncode == 2 and "already holds a run" in r4.stderr, r4.stderr
    assert json.loads((out / "profile.json").read_text()) == prof  # not profiled again
    hint = " ".join(r4.stderr.split()).split("continue it with `")[1].split("`")[0].split()
    assert hint[:3] == ["tula", "run", "--resume"]
    r5 = tula_in_process(*hint[1:])
    assert r5.returncode == 0, r5.stderr
    assert "is complete" in r5.stdout and "profiling" not in r5.stderr
    assert json.loads((out / "profile.json").read_text()) == prof
    assert [h["epoch"] for h in json.loads((out / "train" / "train.json").read_text())["history"]] == [1, 2]


@pytest.mark.slow  # a real DDP world
def test_run_trains_with_the_batch_schedule_of_the_spec(tmp_path, tiny_spec_dict):
    """`tula run` starts training at the plan's choice and the spec's schedule moves it from there."""
    d = dict(
        tiny_spec_dict,
        train={
            "warmup_epochs": 0,
            "batch_schedule": {"kind": "geometric", "factor": 2, "delay": 1},
            "workers": {"min": 1, "max": 2},
        },
    )
    spec = tmp_path / "sched.yaml"
    spec.write_text(yaml.safe_dump(d))
    out = tmp_path / "run"
    r = tula_in_process("run", spec, "--out", out)
    assert r.returncode == 0, r.stderr
    choice = json.loads((out / "plan.json").read_text())["choice"]
    tr = json.loads((out / "train" / "train.json").read_text())
    assert tr["batch_schedule"] == "geometric"
    b0 = choice["global_batch"]
    assert tr["history"][0]["global_batch"] == b0 and tr["history"][0]["n_workers"] == choice["n_workers"]
    assert tr["history"][1]["global_batch"] == 2 * b0  # 2 x at most 256: below every cap of this job
    assert tr["history"][1]["n_workers"] == min(2, 2 * choice["n_workers"])
    assert tr["steps_done"] == sum(1438 // h["global_batch"] for h in tr["history"])


def test_unknown_model_exits_2(tmp_path, tiny_spec_dict):
    d = dict(tiny_spec_dict, model={"name": "alexnetz"})
    spec = tmp_path / "bad.yaml"
    spec.write_text(yaml.safe_dump(d))
    r = run_tula("profile", spec, "--out", tmp_path / "p.json")
    assert r.returncode == 2
    assert "unknown model 'alexnetz'" in r.stderr and "Traceback" not in r.stderr
    assert_refused(r, "unknown model 'alexnetz'")  # the real command: only the sentence
    assert not (tmp_path / "p.json").exists()


def test_bare_tula_shows_help_and_version_is_the_package_version():
    from importlib.metadata import version

    r = run_tula()
    assert r.returncode == 0 and "Usage" in r.stdout and "error" not in r.stderr.lower(), (r.stdout, r.stderr)
    r = run_tula("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"tula {version('tula')}"


def test_train_help_lists_every_registered_method():
    """The CLI reads the one method registry: a method added there shows up here."""
    from tula.core.registry import METHODS

    r = run_tula("train", "--help", env={**os.environ, "TERMINAL_WIDTH": "2000"})
    text = " ".join(r.stdout.split())  # one line per option at that width
    for name, info in METHODS.items():
        assert f"{name}: {' '.join(info.summary.split())}" in text, name


@pytest.mark.slow  # a real DDP world
def test_dead_worker_mid_profile_keeps_finished_trials(tmp_path, tiny_spec_dict):
    """Rank 1 dies on the largest N=2 trial: exit 2 with one sentence naming the rank, and
    the trials finished before it are in the profile record."""
    d = dict(tiny_spec_dict, model={"name": "workers:dies_on_rank_one", "kwargs": {"die_at_batch": 100}})
    spec = tmp_path / "dies.yaml"
    spec.write_text(yaml.safe_dump(d))
    out = tmp_path / "p.json"
    r = run_tula("profile", spec, "--out", out, env=env_with_tests())
    assert r.returncode == 2, r.stderr
    assert "rank 1 of 2 died" in r.stderr and "Traceback" not in r.stderr
    assert f"saved in {out}" in r.stderr.replace("\n", "")
    rec = json.loads(out.read_text())
    status = {(t["n_workers"], t["global_batch"]): t["status"] for t in rec["trials"]}
    # partial search: N=1 at B=16 and 256 (fine), N=2 at B=16 (fine) and 256 (b=128: rank 1 dies)
    assert status == {(1, 16): "ok", (1, 256): "ok", (2, 16): "ok", (2, 256): "error"}
    assert "died" in next(t["note"] for t in rec["trials"] if t["status"] == "error")


# --------------------------------------------------------------------------- tula train's steps, without a world
def test_train_job_takes_the_command_lines_changes_to_the_spec():
    from tula.cli import _train_job
    from tula.core.spec import spec_from_dict

    base = spec_from_dict({"name": "steps", "epochs": 5})
    job = _train_job(base, None, 3, "geometric", 2)
    assert job.epochs == 3 and job.train.accumulation_steps == 2
    assert job.train.batch_schedule is not None and job.train.batch_schedule.kind == "geometric"
    assert _train_job(base, None, None, None, None) == base  # nothing given: the spec as it is


def test_train_config_takes_the_options_then_the_spec_then_the_workers_rule(tmp_path):
    from tula.cli import _train_config
    from tula.core.errors import TulaError
    from tula.core.spec import spec_from_dict

    job = spec_from_dict({"name": "steps", "train": {"n_workers": 2, "global_batch": 64}})
    assert _train_config(job, None, None, None, None, False, tmp_path)[1:] == (2, 64)
    assert _train_config(job, 4, 256, None, None, False, tmp_path)[1:] == (4, 256)
    ruled = spec_from_dict({"name": "steps", "train": {"workers": {"min": 1, "max": 8, "batch_per_worker": 32}}})
    assert _train_config(ruled, None, 100, None, None, False, tmp_path)[1:] == (4, 100)  # ceil(100 / 32)
    with pytest.raises(TulaError, match="no configuration to train at: give --workers and --batch"):
        _train_config(spec_from_dict({"name": "steps"}), 2, None, None, None, False, tmp_path)
