"""The service client reads the API's JSON once, into JobView and JobPage (tula submit/status/replan use
their attributes); an answer that is not a Tula service's is one sentence naming the field."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tula import examples
from tula.core.spec import load_spec
from tula.service.app import create_app
from tula.service.client import Client, JobPage, JobView, ServiceError, _parsed, job_detail, jobs_table
from tula.service.settings import settings_from


def test_the_client_reads_a_submitted_job_a_page_and_a_job_as_typed_views(tmp_path):
    app = create_app(settings_from({}, home=str(tmp_path / "home"), run_jobs=False), dispatch=False)
    with TestClient(app) as http:
        c = Client("http://testserver")
        c.http = http  # the real application, in this process
        spec = load_spec(examples.path("digits")).to_dict()
        submitted = c.submit(spec, search="partial", train=False)
        assert isinstance(submitted, JobView) and submitted.state == "queued"
        assert submitted.url == f"/v1/jobs/{submitted.id}"
        page = c.jobs()
        assert isinstance(page, JobPage) and page.total == 1 and [j.id for j in page.jobs] == [submitted.id]
        job = c.job(submitted.id)
        assert (job.name, job.state, job.ended, job.spec["name"]) == ("digits-small-cnn", "queued", False, spec["name"])
        assert job.created_at.startswith("20")
        assert jobs_table(page).row_count == 1
        assert f"job {job.id} (digits-small-cnn): queued, 0%" in str(job_detail(job, {"plan": None, "train": None})[0])
        with pytest.raises(ServiceError, match="the service answered 404: there is no job 'nosuchjob'"):
            c.job("nosuchjob")


@pytest.mark.parametrize(
    "body, sentence",
    [
        ({"state": "done"}, "the service answered GET /v1/jobs/x without the field 'id'; is --server a Tula service?"),
        (["a"], "the service answered GET /v1/jobs/x with list, not a job; is --server a Tula service?"),
        (
            {"id": "x", "state": "done", "progress": "half"},
            "with field 'progress' wrong (input should be a valid number",
        ),
    ],
)
def test_an_answer_that_is_not_a_job_is_one_sentence_naming_the_field(body, sentence):
    with pytest.raises(ServiceError) as err:
        _parsed(JobView, body, "GET /v1/jobs/x")
    assert sentence in str(err.value)


def test_a_page_s_jobs_are_views_and_fields_the_client_does_not_name_are_left_out():
    page = _parsed(
        JobPage, {"jobs": [{"id": "a", "state": "failed", "error": "boom", "attempts": 2}], "total": 7}, "GET"
    )
    assert page == JobPage(jobs=[JobView(id="a", state="failed", error="boom")], total=7)
    assert page.jobs[0].ended and page.jobs[0].name == ""
