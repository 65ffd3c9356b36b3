"""SIGINT and SIGTERM to a real `tula train` / `tula run`: the ranks stop at the next step,
the last finished epoch's checkpoint and every finished trial are on disk, one sentence
says what was kept and how to continue, the exit code is 130 / 143, no rank survives,
and the suggested command continues the run exactly."""

import json
import os
import signal
import subprocess
import time

import pytest
from helpers import (
    cmdline,
    descendants,
    group_alive,
    one_line,
    popen_tula,
    ranks_below,
    train_args,
    tula_in_process,
    write_spec,
)

from tula.core.records import read_jsonl
from tula.engine.checkpoint import CHECKPOINT, checkpoint_meta
from tula.engine.train import METRICS

pytestmark = pytest.mark.slow


def _wait_for(cond, timeout=240.0, proc=None):
    deadline = time.monotonic() + timeout
    while not cond():
        assert proc is None or proc.poll() is None, f"ended early: {proc.stderr.read()}"
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


@pytest.mark.parametrize("sig, code, to_group", [(signal.SIGINT, 130, False), (signal.SIGTERM, 143, True)])
def test_signal_to_tula_train_keeps_last_epoch_and_resume_finishes_exactly(
    tiny_spec_dict, tmp_path, sig, code, to_group
):
    d = dict(tiny_spec_dict, epochs=200)
    d["train"] = {"warmup_epochs": 0}
    spec = write_spec(tmp_path, d)
    out = tmp_path / "run"
    proc = popen_tula(*train_args(spec, out), stdout=subprocess.PIPE)
    _wait_for(lambda: (out / CHECKPOINT).exists(), proc=proc)
    ranks = ranks_below(proc.pid)
    assert ranks, "no rank processes found"
    t_signal = time.monotonic()
    os.killpg(proc.pid, sig) if to_group else os.kill(proc.pid, sig)  # Ctrl-C in a terminal reaches the group
    _, err = proc.communicate(timeout=120)
    stop_s = time.monotonic() - t_signal
    assert proc.returncode == code, err
    assert stop_s < 30, f"took {stop_s:.1f} s to stop"
    text = one_line(err)
    assert f"training stopped by {signal.Signals(sig).name}" in text and "Traceback" not in err
    assert "leaked semaphore" not in err
    kept = checkpoint_meta(out)["epoch"]
    assert 1 <= kept < 200
    assert f"epochs 1-{kept} of 200 are kept in {out / CHECKPOINT}" in text
    assert [r["epoch"] for r in read_jsonl(out / METRICS)] == list(range(1, kept + 1))
    assert not (out / "train.json").exists()
    assert not group_alive(proc.pid), f"processes of the run survived: {group_alive(proc.pid, 0)}"
    assert all(not os.path.exists(f"/proc/{r}") for r in ranks)

    # the suggested command continues: here with fewer epochs, so it finishes quickly
    hint = text.split("continue with: ")[1].split()
    assert hint[:2] == ["tula", "train"] and "--resume" in hint
    d["epochs"] = kept + 2
    write_spec(tmp_path, d)
    r = tula_in_process(*hint[1:])
    assert r.returncode == 0, r.stderr
    rec = json.loads((out / "train.json").read_text())
    assert rec["resumed_from_epoch"] == kept
    assert [h["epoch"] for h in rec["history"]] == list(range(1, kept + 3))
    assert rec["steps_done"] == (kept + 2) * rec["steps_per_epoch"]


def test_sigint_while_profiling_keeps_finished_trials_and_run_resume_does_not_rerun_them(tiny_spec_dict, tmp_path):
    d = dict(tiny_spec_dict, name="slowprof")
    d["profile"] = {**d["profile"], "timed_steps": 25}
    d["search"] = {**d["search"], "max_batch": 64}  # 6 trials: 2 before the signal, 4 after the resume
    spec = write_spec(tmp_path, d)
    out = tmp_path / "run"
    proc = popen_tula("run", spec, "--search", "full", "--no-train", "--out", out, stdout=subprocess.PIPE)
    trials_seen = 0
    while trials_seen < 2:  # the CLI logs a line per finished trial when stderr is not a terminal
        line = proc.stderr.readline()
        assert line, f"profiling ended before it could be interrupted: {proc.communicate()}"
        trials_seen += line.startswith("trial N=")
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    text = one_line(err)
    assert "profiling stopped by SIGINT" in text and "Traceback" not in err
    assert f"continue with: tula run --resume {out}" in text
    assert not group_alive(proc.pid)
    partial = json.loads((out / "profile.json").read_text())
    assert partial["interrupted"] == "SIGINT"
    finished = {(t["n_workers"], t["global_batch"]): t for t in partial["trials"]}
    assert finished, "no trial had finished before the signal; wait longer"
    assert len(finished) < len(partial["configs"])
    assert f"{len(finished)} of {len(partial['configs'])} trial(s) finished" in text

    r = tula_in_process("run", "--resume", out)
    assert r.returncode == 0, r.stderr
    full = json.loads((out / "profile.json").read_text())
    assert "interrupted" not in full
    assert {(t["n_workers"], t["global_batch"]) for t in full["trials"]} == {tuple(c) for c in full["configs"]}
    for t in full["trials"]:  # the finished trials are kept as measured, not run again
        key = (t["n_workers"], t["global_batch"])
        if key in finished:
            assert t == finished[key]
    assert (out / "plan.json").exists() and not (out / "train").exists()


def _fork_server_below(pid: int) -> list[int]:
    return [p for p in descendants(pid, keep_helpers=True) if "multiprocessing.forkserver" in cmdline(p)]


def test_ctrl_c_while_the_fork_server_imports_torch_is_one_sentence_and_no_traceback(tiny_spec_dict, tmp_path):
    """Ctrl-C in a terminal reaches the whole process group, the ranks' fork server too, which
    spends its first seconds importing torch: it is born ignoring SIGINT, so the command alone
    answers (it printed a KeyboardInterrupt traceback of about 50 lines from inside torch before)."""
    spec = write_spec(tmp_path, tiny_spec_dict)
    proc = popen_tula(*train_args(spec, tmp_path / "run"), stdout=subprocess.PIPE)
    _wait_for(lambda: _fork_server_below(proc.pid), timeout=60, proc=proc)
    time.sleep(0.3)  # its interpreter is up and importing
    server = _fork_server_below(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert one_line(err).split("interrupted: ")[1], err  # one sentence says it stopped
    assert not group_alive(proc.pid), f"processes of the run survived: {group_alive(proc.pid, 0)}"
    assert all(not os.path.exists(f"/proc/{p}") for p in server)


def _sigint_ignored(pid: int) -> bool:
    """Whether the kernel has SIGINT ignored for ``pid`` (bit 2 of /proc/PID/status's SigIgn)."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    raise AssertionError(f"no SigIgn line for {pid}")


def test_ctrl_c_stops_a_command_started_with_sigint_ignored(tiny_spec_dict, tmp_path):
    """A shell that runs a command in the background starts it with SIGINT ignored, and Python
    keeps it ignored: the command ignored Ctrl-C while it started, then answered it once its own
    handlers were set, after importing torch.  The entry point decides instead: Ctrl-C stops the
    command at every moment.  The kernel shows SIGINT no longer ignored before torch's library is
    loaded into the process (it was after, before the entry point decided); Ctrl-C sent then, while
    the command line's imports run, ends the command 130 with a sentence."""
    spec = write_spec(tmp_path, tiny_spec_dict)

    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = popen_tula(*train_args(spec, tmp_path / "run"), stdout=subprocess.PIPE, preexec_fn=ignore_sigint)
    _wait_for(lambda: not _sigint_ignored(proc.pid), timeout=60, proc=proc)
    with open(f"/proc/{proc.pid}/maps") as maps:
        assert "libtorch" not in maps.read(), "SIGINT was ignored until torch had been imported"
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted: " in err, err


def test_ctrl_c_as_the_last_epoch_ends_is_not_success_and_resume_finishes(tiny_spec_dict, tmp_path):
    """A stop that lands after the last step but before the command ends: training had
    finished, but the command ended 0 and said nothing (measured before: exit 0).  Now exit
    130 with the sentence of what is kept -- whichever moment the signal lands in -- and the
    suggested command finishes the run."""
    spec = write_spec(tmp_path, dict(tiny_spec_dict, epochs=2))
    out = tmp_path / "run"
    proc = popen_tula(*train_args(spec, out), stdout=subprocess.PIPE)
    for line in proc.stderr:  # the CLI logs a line per epoch when stderr is not a terminal
        if line.startswith("epoch 2:"):
            break
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted: " in err, err
    r = tula_in_process(*train_args(spec, out, "--resume", out))
    assert r.returncode == 0, r.stderr
    run = json.loads((out / "train.json").read_text())
    assert [h["epoch"] for h in run["history"]] == [1, 2]


def test_a_ctrl_c_that_user_code_swallows_is_still_exit_130(tmp_path):
    """The model factory raises SIGINT against its own process and catches the KeyboardInterrupt
    (as a library's callback may: "Exception ignored in ..."), so `tula check` goes on to pass:
    the entry point remembers the SIGINT, and the command ends 130 with a sentence, never 0."""
    from helpers import env_with_tests, run_tula

    spec = write_spec(
        tmp_path,
        {
            "model": {"name": "factories:swallows_ctrl_c", "kwargs": {"width": 4}},
            "data": {"factory": "factories:make_segmentation", "kwargs": {"n": 40}, "loader_workers": 0},
            "train": {"loss": "factories:PixelBCE"},
        },
    )
    r = run_tula("check", spec, env=env_with_tests(), timeout=120)
    assert r.returncode == 130, (r.returncode, r.stdout, r.stderr)
    assert "interrupted: " in r.stderr and "Traceback" not in r.stderr, r.stderr
    ok = run_tula(
        "check",
        write_spec(
            tmp_path,
            {
                "model": {"name": "factories:tiny_fcn"},
                "data": {"factory": "factories:make_segmentation", "kwargs": {"n": 40}, "loader_workers": 0},
                "train": {"loss": "factories:PixelBCE"},
            },
            "ok.yaml",
        ),
        env=env_with_tests(),
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr  # the same check without the signal passes


def test_ctrl_c_while_the_command_starts_is_one_sentence(tiny_spec_dict, tmp_path):
    """Ctrl-C 0.25 s into `tula train`, where the command line's own imports run (about 0.6 s
    here): exit 130 and a sentence, never a traceback from inside an import (the entry point,
    tula.__main__, imports the command line inside its handler)."""
    spec = write_spec(tmp_path, tiny_spec_dict)
    proc = popen_tula(*train_args(spec, tmp_path / "run"), stdout=subprocess.PIPE)
    time.sleep(0.25)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted: " in err, err
