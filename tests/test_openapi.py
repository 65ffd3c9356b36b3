"""Schemathesis against the service's OpenAPI schema, a bounded number of examples per
operation: whatever the client sends, no 5xx.  The service runs with run_jobs false (jobs
are queued, never started), so random submissions cost nothing."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from service_helpers import Service

pytestmark = pytest.mark.slow

EXAMPLES_PER_OPERATION = 25


def test_no_request_makes_the_service_fail(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    svc = Service(home, env={"TULA_RUN_JOBS": "false"}).start()
    try:
        # one real job id, so that the job paths are reached with an id that exists too
        job_id = svc.client().post("/v1/jobs", json={"spec": {"name": "x"}}).json()["id"]
        schema = schemathesis.openapi.from_url(f"{svc.url}/openapi.json")
        operations = [op.ok() for op in schema.get_all_operations()]
        assert {f"{o.method.upper()} {o.path}" for o in operations} >= {
            "POST /v1/jobs",
            "GET /v1/jobs",
            "GET /v1/jobs/{job_id}",
            "POST /v1/jobs/{job_id}/cancel",
            "GET /v1/jobs/{job_id}/plan",
            "POST /v1/jobs/{job_id}/replan",
            "POST /v1/plans",
            "GET /v1/health",
        }
        for op in operations:

            @given(case=op.as_strategy())
            @settings(
                max_examples=EXAMPLES_PER_OPERATION,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                database=None,
            )
            def no_server_error(case):
                if case.path_parameters and "job_id" in case.path_parameters and case.path_parameters["job_id"] == "":
                    case.path_parameters["job_id"] = job_id
                case.call_and_validate(base_url=svc.url, checks=[not_a_server_error])

            no_server_error()
        assert svc.client().get("/v1/health").json()["status"] == "ok"
    finally:
        svc.stop()
