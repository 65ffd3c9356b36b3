"""The dashboard in a real headless Chromium (Debian's `chromium`) against a real `tula serve`:
the jobs table lists the job (and its script keeps it current), the job page draws the plan
chart with the choice marked and the training curves, and the re-plan form answers.  The
screenshots are kept in the test's directory.  The job is the session's finished run of the
tiny spec (``tiny_pipeline``), stored as the service's runner stores a job it ran: the
dashboard reads a finished job, not how it was run (test_service runs jobs)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from service_helpers import Service, seed_finished_job, wait_for

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _chromium(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    if CHROMIUM is None:
        pytest.fail("headless Chromium is needed for the dashboard tests: apt-get install chromium")
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def dom(url: str, wait_ms: int = 0) -> str:
    """The page's DOM after its scripts ran (``wait_ms`` of virtual time lets timers fire)."""
    r = _chromium(*([f"--virtual-time-budget={wait_ms}"] if wait_ms else []), "--dump-dom", url)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def screenshot(url: str, path, height: int = 2400) -> None:
    r = _chromium(f"--screenshot={path}", f"--window-size=1280,{height}", url)
    assert r.returncode == 0 and path.stat().st_size > 10_000, r.stderr[-2000:]
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_dashboard_lists_the_job_and_draws_its_plan_and_training(tmp_path, tiny_pipeline):
    home = tmp_path / "home"
    home.mkdir()
    job_id = seed_finished_job(home, tiny_pipeline.dir)
    svc = Service(home).start()
    try:
        c = svc.client()
        job = wait_for(c, job_id, timeout_s=400)
        assert job["state"] == "done", job
        plan = c.get(f"/v1/jobs/{job_id}/plan").json()

        # the jobs table: server-rendered, then refreshed by its script from /v1/jobs
        page = dom(f"{svc.url}/", wait_ms=5000)
        row = re.search(rf"<tr data-id=\"{job_id}\">(.*?)</tr>", page, re.S)
        assert row, page[:3000]
        assert tiny_pipeline.spec["name"] in row.group(1) and ">done<" in row.group(1) and "100%" in row.group(1)
        assert re.search(r'id="jobs-total">1<', page)
        where = c.get("/cluster")  # where the jobs run: this host's processes
        assert where.status_code == 200 and "jobs run as processes on the service&#x27;s host" in where.text, where.text
        screenshot(f"{svc.url}/", tmp_path / "jobs.png", height=600)

        # the job page: both plan charts, a predicted line per cluster size, measured points,
        # the knee lines and the chosen configuration starred with its values on hover
        page = dom(f"{svc.url}/jobs/{job_id}")
        charts = page.split('id="plan-charts"')[1].split('id="plan-table"')[0]
        assert charts.count("<svg") == 2
        for n in plan["curves"]:
            assert charts.count(f'data-label="N={n} predicted"') == 2, n
        assert 'data-label="N=1 measured"' in charts
        ch = plan["choice"]
        star = f'data-label="chosen: N={ch["n_workers"]}, B={ch["global_batch"]}"'
        assert charts.count(star) == 2
        assert f"chosen: N={ch['n_workers']}, B={ch['global_batch']}: {ch['total_time_s']:.4g} s" in charts
        assert "knee of N=" in charts
        assert plan["reason"].split(":")[0] in page
        train_part = page.split('id="train-charts"')[1]
        assert "test top-1" in train_part and "B_simple" in train_part
        screenshot(f"{svc.url}/jobs/{job_id}", tmp_path / "job.png")

        # the re-plan form: another objective answered on the page, the stored plan unchanged
        r = c.post(f"/jobs/{job_id}/replan", data={"objective": "cost", "cluster_sizes": "1,2,4"})
        assert r.status_code == 200 and "Re-planned (not saved): objective cost" in r.text
        assert "data-label='N=4 predicted'" in r.text
        bad = c.post(f"/jobs/{job_id}/replan", data={"objective": "time", "deadline": "1ms"})
        assert bad.status_code == 422 and "cannot re-plan: no configuration finishes within" in bad.text
        assert c.get(f"/v1/jobs/{job_id}/plan").json() == plan
        assert c.get("/jobs/nosuchjob").status_code == 404
    finally:
        svc.stop()
