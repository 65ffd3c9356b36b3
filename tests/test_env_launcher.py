"""``--cluster env``: Tula inside a world someone else launched.  Real ``torchrun`` (2 ranks
on CPU, gloo), and two processes given SLURM's variables as ``srun`` gives them: training
reaches the same parameters as the local launcher, SIGINT ends every rank with 130 at a
step boundary and the printed command resumes the run exactly, a profile runs the trials
of the world's size and records the others as skipped, and bad input is one sentence with
exit 2 on every rank."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import assert_refused, free_port, train_args, tula_cmd, tula_in_process, write_spec

from tula.core.records import read_jsonl
from tula.engine.checkpoint import checkpoint_meta
from tula.engine.train import METRICS

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


def _torchrun(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", str(free_port()), "-m", "tula", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _srun_like(args: list[str], cwd: Path, port: int) -> list[subprocess.Popen]:
    """Two ranks started as srun starts them: SLURM's variables, MASTER_ADDR/PORT exported by
    the job script; each its own process, its own output."""
    procs = []
    for r in range(2):
        env = {**os.environ, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r), "SLURM_NTASKS": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip
        procs.append(
            subprocess.Popen(
                [*tula_cmd(), *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    return procs


def _history(out: Path) -> list[dict]:
    return json.loads((out / "train.json").read_text())["history"]


def test_torchrun_trains_as_the_local_launcher_does(reference_run, tmp_path):
    """The local side is the session's reference run: ``tula train --method ags --workers 2
    --batch 64`` of the same spec (AGS, the spec's default method, is what torchrun trains here)."""
    spec = write_spec(tmp_path, reference_run.spec_dict())
    epochs = reference_run.spec["epochs"]
    r = _torchrun(["train", str(spec), "--cluster", "env", "--batch", "64", "--out", "env"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    env_h, local_h = _history(tmp_path / "env"), _history(reference_run.dir)
    assert (
        reference_run.record("train.json")["method"]
        == json.loads((tmp_path / "env" / "train.json").read_text())["method"]
        == "ags"
    )
    assert [h["n_workers"] for h in env_h] == [2] * epochs
    # the same job on the same 2 ranks: the same losses, bit for bit
    assert [h["train_loss"] for h in env_h] == [h["train_loss"] for h in local_h]
    assert [h["test_loss"] for h in env_h] == [h["test_loss"] for h in local_h]
    # rank 0 wrote the records once; the checkpoint is there to resume from
    assert checkpoint_meta(tmp_path / "env")["epoch"] == epochs


def test_torchrun_profile_runs_the_trials_of_its_size_and_says_which_it_cannot(tiny_spec_dict, tmp_path):
    spec = write_spec(tmp_path, tiny_spec_dict)
    r = _torchrun(["profile", str(spec), "--cluster", "env", "--out", "p/profile.json"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    prof = json.loads((tmp_path / "p" / "profile.json").read_text())
    ok = [t for t in prof["trials"] if t["status"] == "ok"]
    skipped = [t for t in prof["trials"] if t["status"] == "skipped"]
    assert ok and {t["n_workers"] for t in ok} == {2}
    assert skipped and {t["n_workers"] for t in skipped} == {1}
    assert all("this world (started by torchrun) has 2 ranks" in t["note"] for t in skipped)
    assert "N = 1 not profiled" in " ".join(r.stderr.split())
    assert prof["launcher"] == "env"


def test_sigint_to_srun_ranks_exits_130_on_every_rank_and_the_resume_command_finishes_exactly(tiny_spec_dict, tmp_path):
    d = dict(tiny_spec_dict, epochs=200)
    d["train"] = {"warmup_epochs": 0}
    spec = write_spec(tmp_path, d)
    out = tmp_path / "run"
    args = ["train", str(spec), "--cluster", "env", "--method", "lbt", "--batch", "64", "--out", str(out)]
    procs = _srun_like(args, tmp_path, free_port())
    deadline = time.monotonic() + 240
    while not (out / METRICS).exists() or not read_jsonl(out / METRICS):
        assert all(p.poll() is None for p in procs), procs[0].stderr.read()[-3000:]
        assert time.monotonic() < deadline, "no epoch finished"
        time.sleep(0.05)
    for p in procs:  # Ctrl-C under srun reaches every task
        p.send_signal(signal.SIGINT)
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [130, 130], outs[0][1][-3000:]
    driver_err, worker_err = " ".join(outs[0][1].split()), outs[1][1]
    assert "training stopped by SIGINT" in driver_err and "Traceback" not in driver_err
    assert worker_err.strip() == "", worker_err  # rank 1 serves: rank 0 speaks for the world
    kept = checkpoint_meta(out)["epoch"]
    assert 1 <= kept < 200
    assert [r["epoch"] for r in read_jsonl(out / METRICS)] == list(range(1, kept + 1))
    hint = driver_err.split("continue with: ")[1].split(" (on every rank")[0].split()
    assert hint[:2] == ["tula", "train"] and "--resume" in hint and hint[-2:] == ["--cluster", "env"]
    assert "started by srun as before" in driver_err

    # the printed command, on every rank again, finishes the run (fewer epochs, to be quick)
    d["epochs"] = kept + 2
    write_spec(tmp_path, d)
    procs = _srun_like(hint[1:], tmp_path, free_port())
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-3000:]
    rec = json.loads((out / "train.json").read_text())
    assert rec["resumed_from_epoch"] == kept
    assert [h["epoch"] for h in rec["history"]] == list(range(1, kept + 3))
    # exactly as an uninterrupted run of the same epochs on the local launcher
    ref = tmp_path / "ref"
    r = tula_in_process(*train_args(spec, ref))
    assert r.returncode == 0, r.stderr
    assert [h["train_loss"] for h in rec["history"]] == [h["train_loss"] for h in _history(ref)]


def test_bad_input_is_one_sentence_and_exit_2_on_every_rank(tiny_spec_dict, tmp_path, monkeypatch):
    """The refusals before any world (in this process, through the command's entry point), and
    a world of two real processes that refuses on every rank."""
    spec = write_spec(tmp_path, tiny_spec_dict)
    # no launcher's variables at all
    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    r = tula_in_process("train", spec, "--cluster", "env", "--batch", "64", "--out", tmp_path / "a")
    assert_refused(r, "--cluster env runs inside a world started by torchrun, srun or mpirun")
    # srun's variables without MASTER_ADDR
    with monkeypatch.context() as m:
        m.setenv("SLURM_PROCID", "0")
        m.setenv("SLURM_NTASKS", "2")
        r = tula_in_process("train", spec, "--cluster", "env", "--batch", "64", "--out", tmp_path / "b")
    assert_refused(r, "MASTER_ADDR is not")
    # a worker count the world does not have: rank 0 says so, both ranks end with 2
    procs = _srun_like(
        ["train", str(spec), "--cluster", "env", "--workers", "1", "--batch", "64", "--out", str(tmp_path / "c")],
        tmp_path,
        free_port(),
    )
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [2, 2], outs[0][1][-2000:]
    text = " ".join(outs[0][1].split())
    assert "this world (started by srun) has 2 ranks; train on 2 workers" in text and "Traceback" not in text
    assert not (tmp_path / "c" / "checkpoint.pt").exists()
