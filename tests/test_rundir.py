"""Run directories: one run at a time, no silent overwrites, --out checked before any work."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import (
    assert_refused,
    env_with_tests,
    one_line,
    popen_tula,
    run_tula,
    train_args,
    tula_in_process,
    write_spec,
)

from tula.core.errors import RunDirError
from tula.engine.checkpoint import CHECKPOINT
from tula.engine.rundir import LOCK, check_out_file, locked


@pytest.mark.slow
def test_second_run_into_a_locked_directory_is_refused_naming_the_first(tiny_spec_dict, tmp_path):
    # the first run's ranks mostly sleep (workers:sleepy_mlp, 0.05 s a step on 2 ranks): on 2 busy
    # cores, a first run that trained flat out starved the second command's start for 15 s
    d = dict(tiny_spec_dict, epochs=200, model={"name": "workers:sleepy_mlp", "kwargs": {"sleep_s": 0.05}})
    spec = write_spec(tmp_path, d)
    out = tmp_path / "run"
    args = train_args(spec, out)
    env = env_with_tests()
    first = popen_tula(*args, env=env)
    try:
        deadline = time.monotonic() + 120
        while not (out / CHECKPOINT).exists():
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()
            time.sleep(0.05)
        second = tula_in_process(*args)  # another process than the first's, as a second command is
        assert second.returncode == 2, second.stderr
        assert f"is in use by another Tula run (pid {first.pid}" in one_line(second.stderr)
        assert first.poll() is None  # the first is untouched
    finally:
        os.killpg(first.pid, signal.SIGINT)
        first.communicate(timeout=120)
    assert first.returncode == 130
    lines = [json.loads(s)["epoch"] for s in (out / "metrics.jsonl").read_text().splitlines()]
    assert lines == sorted(set(lines)), "an epoch was written twice"


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / LOCK).write_text(
        json.dumps({"pid": dead.pid, "host": "h", "command": "tula train x", "started": "then"})
    )
    seen = []
    with locked(tmp_path, on_stale=seen.append):
        info = json.loads((tmp_path / LOCK).read_text())
        assert info["pid"] == os.getpid()
        # another process trying the same directory while this one holds it is refused
        r = subprocess.run(
            [sys.executable, "-c", f"from tula.engine.rundir import locked\nwith locked({str(tmp_path)!r}): pass"],
            capture_output=True,
            text=True,
        )
        assert r.returncode != 0 and f"in use by another Tula run (pid {os.getpid()}" in r.stderr
    assert seen and seen[0]["pid"] == dead.pid


def test_out_file_checks_name_the_problem(tmp_path):
    f = tmp_path / "f.json"
    f.write_text("{}")
    with pytest.raises(RunDirError, match="already exists and was not written by this command; pass --force"):
        check_out_file(f, force=False)
    assert check_out_file(f, force=True) == f
    with pytest.raises(RunDirError, match="is a directory"):
        check_out_file(tmp_path, force=True)
    with pytest.raises(RunDirError, match="is a file"):
        check_out_file(f / "x.json", force=True)


@pytest.mark.parametrize(
    "make_args, sentence",
    [
        (
            lambda spec, tmp: train_args(spec, _file(tmp)),
            "is a file, not a directory",
        ),
        (lambda spec, tmp: ["run", spec, "--out", _file(tmp)], "is a file, not a directory"),
        (
            lambda spec, tmp: ["profile", spec, "--out", _file(tmp)],
            "already exists and was not written by this command",
        ),
        (
            lambda spec, tmp: ["plan", spec, "--out", str(_with_profile(tmp) / "plan.json")],
            "profile.json' already exists and was not written by this command",
        ),
        (
            lambda spec, tmp: train_args(spec, str(tmp), "--resume", str(tmp)),
            "holds no checkpoint.pt; give the directory of the training run to continue",
        ),
        (
            lambda spec, tmp: train_args(spec, str(tmp / "o"), workers="0"),
            "--workers: worker count 0 is below 1",
        ),
        (lambda spec, tmp: ["run", "--resume", str(tmp)], "holds no Tula run to continue"),
        (
            lambda spec, tmp: ["run", "--resume", _with_run(tmp, spec), "--no-train"],
            "was started with --train; --resume continues it as it was started, so drop --no-train",
        ),
        (
            lambda spec, tmp: ["run", "--resume", _with_run(tmp, spec), "--search", "full"],
            "was started with --search partial; --resume continues it as it was started, so drop --search full",
        ),
        (
            lambda spec, tmp: ["run", "--resume", _with_run(tmp, spec), "--objective", "cost"],
            "was started with the spec's objective; --resume continues it as it was started, so drop --objective cost",
        ),
    ],
)
def test_cli_output_problems_are_one_sentence_before_any_work(tiny_spec_dict, tmp_path, make_args, sentence):
    """Checked in this process through the command's entry point (tula.cli.main).  "Before
    any work": no rank started -- the spec's model leaves a file named with the pid of each
    process that built it, and none but this one (a workload check) did -- no progress bar,
    no changed file."""
    marker = tmp_path / "model-built"
    d = dict(tiny_spec_dict, model={"name": "workers:marks_when_built", "kwargs": {"marker": str(marker)}})
    spec = write_spec(tmp_path, d)
    work = tmp_path / "work"
    work.mkdir()
    args = make_args(str(spec), work)
    before = {p: p.read_bytes() for p in work.rglob("*") if p.is_file()}
    r = tula_in_process(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert sentence in one_line(r.stderr) and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith("error:") and "━" not in r.stderr  # refused before any work (no bar)
    assert_refused(r, sentence)
    built_by = {int(p.suffix[1:]) for p in tmp_path.glob("model-built.*")}
    assert built_by <= {os.getpid()}, f"a rank (pid {built_by - {os.getpid()}}) built the model before the refusal"
    assert {p: p.read_bytes() for p in work.rglob("*") if p.is_file() and p.name != LOCK} == {
        p: b for p, b in before.items()
    }
    assert not (work / "o" / CHECKPOINT).exists()


def test_cli_output_problem_as_a_command_prints_only_its_sentence_with_exit_2(tiny_spec_dict, tmp_path):
    """One refusal of `tula run` from the real command: exit code 2, the sentence, nothing else."""
    spec = write_spec(tmp_path, tiny_spec_dict)
    r = run_tula("run", spec, "--out", _file(tmp_path), timeout=300)
    assert_refused(r, "is a file, not a directory")


def _file(tmp):
    f = tmp / "taken"
    f.write_text("not a directory")
    return str(f)


def _with_run(tmp, spec_path):
    """A run directory as `tula run SPEC` (partial search, the spec's objective, training) leaves it."""
    from tula.core.records import RUN_KIND, save_record
    from tula.core.spec import load_spec

    save_record(
        {
            "kind": RUN_KIND,
            "version": 1,
            "spec": load_spec(spec_path).to_dict(),
            "search": "partial",
            "objective": None,
            "train": True,
        },
        tmp / "run.json",
    )
    return str(tmp)


def _with_profile(tmp):
    (tmp / "profile.json").write_text('{"kind": "tula.profile"}')
    return tmp
