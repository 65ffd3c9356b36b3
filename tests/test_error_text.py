"""Every error message is printed as text (#19, item 2): whatever a library, a user or a rank
puts in a message -- gloo's ``[/path/pair.cc:152]`` (a closing tag to rich), ``[bold]``,
braces, percent signs, emoji codes, undecodable bytes, NUL, a very long line -- reaches the
terminal, the service's JSON and the dashboard as it is, and reporting it never raises.

Real processes throughout: the CLI on a spec whose model fails with that text (in this
process's check, in a rank), a usage error, SIGINT while profiling into a directory named
with it, the CLI's observer on records holding it, and a real `tula serve` whose job fails
with it (its error bodies, dashboard pages, and `tula submit --wait` / `tula status`)."""

from __future__ import annotations

import html
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import env_with_tests, popen_tula, run_tula
from service_helpers import Service, wait_for, with_group_gone

HERE = Path(__file__).resolve().parent
HOSTILE = "[/tmp/gloo/pair.cc:152] Connection refused [bold]x[/] {0} %s \\[ ] :thumbs_up: [link=x]y[/link] <b>&amp;"
LONG = " ".join(["very-long-line"] * 400)  # ~6000 characters, printed unwrapped on one line
#: what the model's forward raises: the text, the long line, a byte that is not UTF-8 (a
#: surrogate escape) and NUL, then a second line (a sentence quotes the first)
RAISED = f"{HOSTILE} {LONG} \udcff\x00\nsecond line of the traceback"
#: the first line of it as printed: the undecodable byte and NUL spelled out
SHOWN = f"{HOSTILE} {LONG} \\xff\\x00"


# --------------------------------------------------------------------------- a model that fails with it
def hostile(mode: str = "always", marker: str = ""):
    """A model factory (``test_error_text:hostile``): ``always`` raises RAISED in every forward
    (the CLI's check of the workload), ``ranks`` only in a rank of a launched world,
    ``slow`` marks ``marker`` and sleeps in every forward in a rank (to be interrupted)."""
    import torch
    import torch.distributed as dist

    class Hostile(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))

        def forward(self, x):
            in_rank = dist.is_available() and dist.is_initialized()
            if mode == "always" or (mode == "ranks" and in_rank):
                raise RuntimeError(RAISED)
            if mode == "slow" and in_rank:
                Path(marker).touch()
                time.sleep(0.05)
            return self.net(x)

    return Hostile()


def _spec(tmp_path: Path, **kwargs) -> Path:
    d = {
        "name": "hostile",
        "model": {"name": "test_error_text:hostile", "kwargs": kwargs},
        "data": {"name": "digits"},
        "epochs": 1,
        "search": {"cluster_sizes": [1], "min_batch": 16, "max_batch": 32},
        "profile": {"warmup_steps": 1, "timed_steps": 2, "threads_per_worker": 1, "min_timed_s": 0},
    }
    p = tmp_path / "hostile.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def _clean(r: subprocess.CompletedProcess | tuple, code: int) -> str:
    rc, err = (r.returncode, r.stderr) if isinstance(r, subprocess.CompletedProcess) else r
    assert rc == code, (rc, err)
    assert "Traceback" not in err and "MarkupError" not in err, err
    return err


# --------------------------------------------------------------------------- the CLI
def test_a_tula_error_quoting_foreign_text_prints_it_as_it_is(tmp_path):
    """A TulaError (the workload check) whose sentence quotes the model's exception: exit 2,
    the first line verbatim on one line (undecodable byte and NUL spelled out), the second line not."""
    r = run_tula("profile", _spec(tmp_path), "--out", tmp_path / "p.json", timeout=300, env=env_with_tests())
    err = _clean(r, 2)
    line = next(ln for ln in err.splitlines() if ln.startswith("error: "))
    assert line == (
        f"error: model 'test_error_text:hostile' cannot take digits samples of shape (1, 8, 8) (RuntimeError: {SHOWN})"
    ), line[:300]
    assert "second line" not in err


@pytest.mark.slow  # a real rank or runner process
def test_a_worker_error_from_a_rank_prints_its_message_as_it_is(tmp_path):
    """A rank raises it: the WorkerError's sentence (which keeps 300 characters of it) as it is."""
    spec = _spec(tmp_path, mode="ranks")
    r = run_tula("profile", spec, "--out", tmp_path / "p.json", timeout=300, env=env_with_tests())
    err = _clean(r, 2)
    line = next(ln for ln in err.splitlines() if ln.startswith("error: "))
    assert f"failed: RuntimeError: {SHOWN[:300]}" in line, line[:400]


def test_a_usage_error_prints_the_option_as_typed(tmp_path):
    option = "--" + HOSTILE.replace("=", ":")  # click reads --NAME=VALUE
    r = run_tula("plan", _spec(tmp_path), option, timeout=300, env=env_with_tests())
    err = _clean(r, 2)
    assert f"error: No such option: {option} (see --help)" in err.splitlines(), err


@pytest.mark.slow  # a real rank or runner process
def test_sigint_prints_the_continue_command_with_a_hostile_path(tmp_path):
    """Interrupted (SIGINT while profiling into a directory whose name holds the text): exit
    130 and the command that continues, with that path as it is."""
    marker = tmp_path / "forward-ran"
    spec = _spec(tmp_path, mode="slow", marker=str(marker))
    out = tmp_path / "runs" / HOSTILE / "profile.json"  # its slashes make folders; the path reads as the text
    assert HOSTILE in str(out)
    proc = popen_tula("profile", spec, "--out", out, stdout=subprocess.PIPE, env=env_with_tests())
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no rank ran a forward pass within 120 s"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        with_group_gone(proc.pid)
    err = _clean((proc.returncode, err), 130)
    line = next(ln for ln in err.splitlines() if ln.startswith("interrupted: "))
    assert "profiling stopped by SIGINT" in line
    assert line.endswith(f"; continue with: tula profile {spec} --search partial --resume '{out.parent}'"), line


DRIVER = r"""
import json
import sys
from pathlib import Path
from helpers import HERE, profile_record, tiny_spec
from tula import cli_console
from tula.core.events import FellBack, Note, TrialFinished, TrialsPlanned, WorldStarted
from tula.core.records import PLAN_KIND, PROFILE_KIND, Fallback, PlanRecord, ProfileRecord

h = sys.argv[1] + "\x00"
c = cli_console.ConsoleObserver()
c.note(h)
cli_console.stale_note({"pid": 1, "command": h})
c.stage("profiling")
c.event("profiling", TrialsPlanned(total=1))
c.event("profiling", TrialFinished(n_workers=1, global_batch=16, status=h))
c.done("profiling")
trial = {"n_workers": 1, "global_batch": 16, "local_batch": 16, "t_step_s": 0.001, "t_compute_s": 0.001,
         "t_sync_s": 0.0, "t_step_spread": 0.0, "peak_mem_bytes": 1000, "status": "error", "note": h}
profile = profile_record(tiny_spec(), [trial], search="partial", device=h, threads_per_worker=1, profiling_s=1.0)
c.saved(PROFILE_KIND, ProfileRecord.from_dict(profile), Path("profile.json"))
plan = json.loads((HERE / "data" / "records" / "plan.json").read_text())
c.saved(PLAN_KIND, PlanRecord.from_dict({**plan, "reason": h}), Path("plan.json"))
c.stage("training", method=h)
c.event("training", WorldStarted(epochs=1, steps_per_epoch=2, n_workers=1, global_batch=16, accumulation_steps=1,
                                  micro_batch=16))
c.event("training", Note(h))
c.event("training", FellBack(Fallback(from_global_batch=32, at_epoch=1, to_global_batch=16)))
c.done("training")
"""


def test_the_observer_prints_notes_events_and_records_as_they_are(tmp_path):
    """The CLI's observer (notes, a stale lock's command, trial and training events, the
    profile and plan tables and the plan's reason) on text holding markup, a byte that is not
    UTF-8 (through argv) and NUL: UTF-8 output with the text in it, on stdout and stderr."""
    r = subprocess.run(
        [sys.executable, "-c", DRIVER, HOSTILE + " \udcff"],
        capture_output=True,
        timeout=120,
        env={**env_with_tests(), "COLUMNS": "1000"},
        cwd=tmp_path,
    )
    out, err = r.stdout.decode("utf-8"), r.stderr.decode("utf-8")  # strict: the output is UTF-8
    _clean((r.returncode, err), 0)
    shown = HOSTILE + " \\xff\\x00"
    lines = out.splitlines()
    assert shown in lines  # the note
    assert f"choice: {shown}" in lines
    assert any(f"Profile (partial search, {shown}, 1 thread(s)/worker, 1 s)" in ln for ln in lines)
    assert any(f"error ({shown})" in ln for ln in lines)  # a trial's note in the table
    assert "Plan (objective: knee" in out  # a whole plan's objective is one of the objectives
    err_lines = err.splitlines()
    assert f"trial N=1 B=16: {shown}" in err_lines
    assert f"note: {shown}" in err_lines  # a training note
    assert f"note: taking over the lock left by a run that is no longer alive (pid 1, `{shown}`)" in err_lines
    assert "out of memory at global batch 32: resuming from epoch 1 at global batch 16" in err_lines
    assert any(ln.startswith(f"training {shown} N=1 B=16") for ln in err_lines)  # the bar's description


# --------------------------------------------------------------------------- the service
@pytest.mark.slow  # a real rank or runner process
def test_the_service_reports_a_failed_job_s_text_as_it_is(tmp_path):
    """A job whose model fails with the text: the runner stores its error, `tula submit --wait`
    exits 2 with it, `tula status` shows it, the API's error bodies carry it, the dashboard
    shows it HTML-escaped; bad submissions quoting it are 422 with it in the detail."""
    home = tmp_path / "home"
    home.mkdir()
    svc = Service(home, env={"TULA_IMPORT_ALLOWLIST": "test_error_text", "PYTHONPATH": str(HERE)}).start()
    try:
        c = svc.client()
        spec = _spec(tmp_path)
        sub = run_tula("submit", spec, "--wait", "--server", svc.url, timeout=300, env=env_with_tests())
        err = _clean(sub, 2)
        job_id = sub.stdout.split("submitted job ")[1].split()[0]
        job = wait_for(c, job_id)
        expected = (
            f"model 'test_error_text:hostile' cannot take digits samples of shape (1, 8, 8) (RuntimeError: {SHOWN})"
        )
        assert job["state"] == "failed" and job["error"] == expected, job
        assert f"error: job {job_id} failed: {expected}" in err.splitlines()

        st = run_tula("status", job_id, "--server", svc.url, timeout=300, env=env_with_tests())
        _clean(st, 0)
        assert f"error: {expected}" in " ".join(st.stdout.split()), st.stdout  # wrapped at 120 columns
        table = run_tula("status", "--server", svc.url, timeout=300, env=env_with_tests())
        _clean(table, 0)
        assert job_id in table.stdout

        # the API: a record the failed job does not have names its error
        r = c.get(f"/v1/jobs/{job_id}/plan")
        assert (
            r.status_code == 404
            and r.json()["detail"] == f"job {job_id!r} has no plan record (it is failed: {expected})"
        )
        r = c.post(f"/v1/jobs/{job_id}/replan", json={"objective": "cost"})
        assert r.status_code == 404 and expected in r.json()["detail"]
        # bad submissions quoting the text
        r = c.post("/v1/jobs", json={"spec": yaml.safe_load(spec.read_text()), HOSTILE: 1})
        assert r.status_code == 422 and repr(HOSTILE) in r.json()["detail"], r.text
        raw = json.dumps({"spec": {**yaml.safe_load(spec.read_text()), "name": HOSTILE + "\udcff"}})
        r = c.post("/v1/jobs", content=raw.encode(), headers={"content-type": "application/json"})
        assert r.status_code == 422 and "not text" in r.json()["detail"], r.text
        assert c.get("/v1/jobs").status_code == 200  # the listing still answers

        # the dashboard: the job's page and the jobs page, escaped
        page = c.get(f"/jobs/{job_id}")
        assert page.status_code == 200
        assert f"<p class='err' id='job-error'>{html.escape(expected, quote=True)}</p>" in page.text
        assert "<b>&amp;" not in page.text
        jobs = c.get("/")
        assert jobs.status_code == 200 and f"<td>{html.escape(expected[:100], quote=True)}</td>" in jobs.text
    finally:
        svc.stop()
