"""The service paths no other test tries (issue #27, item 3): ``/login`` and its cookie, 415
for a body of another content type, ``limit``/``offset`` of the jobs list, re-planning with
pricing, a deadline and a budget through the API, and ``max_concurrent_jobs`` above 1.

The HTTP answers are checked in this process: the service's own application
(:func:`tula.service.app.create_app`, its token guard and handlers) through Starlette's test
client, on a store that holds the session's finished tiny job (``tiny_pipeline``) and runs
nothing.  Only ``max_concurrent_jobs`` needs real runners: it starts a real ``tula serve``."""

from __future__ import annotations

import time

import pytest
from service_helpers import Service, seed_finished_job, wait_for

TOKEN = "paths-token"


@pytest.fixture(scope="module")
def api(tmp_path_factory, tiny_pipeline):
    """The service's application with a token, no dispatcher (a submitted job stays queued),
    its store holding the finished tiny job (``api.seeded``); a test client without the token."""
    from fastapi.testclient import TestClient

    from tula.service.app import create_app
    from tula.service.settings import ServiceSettings

    home = tmp_path_factory.mktemp("service-paths") / "home"
    home.mkdir()
    seeded = seed_finished_job(home, tiny_pipeline.dir)
    with TestClient(create_app(ServiceSettings(home=home, token=TOKEN), dispatch=False)) as client:
        client.seeded = seeded
        yield client


@pytest.fixture
def c(api):
    """The module's client, carrying the token; no cookie left from an earlier test."""
    api.cookies.clear()
    api.headers["Authorization"] = f"Bearer {TOKEN}"
    yield api
    api.headers.pop("Authorization", None)
    api.cookies.clear()


def _assert_one_sentence(r, status: int, words: str) -> str:
    assert r.status_code == status, r.text
    detail = r.json()["detail"]
    assert words in detail and "\n" not in detail, detail
    return detail


# --------------------------------------------------------------------------- /login
def test_login_sets_the_cookie_the_dashboard_and_api_accept(api):
    api.cookies.clear()
    api.headers.pop("Authorization", None)
    _assert_one_sentence(api.get("/v1/jobs"), 401, "this service needs 'Authorization: Bearer <token>'")
    for query in ({"token": "wrong"}, {}):
        r = api.get("/login", params=query, follow_redirects=False)
        _assert_one_sentence(r, 401, "wrong or missing token")
        assert "set-cookie" not in r.headers
    r = api.get("/login", params={"token": TOKEN}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/"
    cookie = r.headers["set-cookie"].lower()
    assert cookie.startswith(f"tula_token={TOKEN}") and "httponly" in cookie and "samesite=strict" in cookie
    # the cookie alone (no Authorization header) gets the browser through
    assert api.cookies.get("tula_token") == TOKEN
    assert api.get("/v1/jobs").status_code == 200
    assert api.get("/").status_code == 200
    api.cookies.clear()
    stale = api.get("/v1/jobs", headers={"Cookie": "tula_token=stale"})
    _assert_one_sentence(stale, 401, "the request had no token or a wrong one")


def test_login_without_a_service_token_is_refused(tmp_path):
    from fastapi.testclient import TestClient

    from tula.service.app import create_app
    from tula.service.settings import ServiceSettings

    with TestClient(create_app(ServiceSettings(home=tmp_path / "home"), dispatch=False)) as client:
        r = client.get("/login", params={"token": "anything"}, follow_redirects=False)
        _assert_one_sentence(r, 401, "wrong or missing token")
        assert "set-cookie" not in r.headers


# --------------------------------------------------------------------------- 415
@pytest.mark.parametrize("ctype", ["text/csv", "multipart/form-data; boundary=x", "application/xml"])
def test_a_body_of_another_content_type_is_415_and_makes_no_job(c, tiny_spec_dict, ctype):
    import json

    total = c.get("/v1/jobs").json()["total"]
    r = c.post("/v1/jobs", content=json.dumps({"spec": tiny_spec_dict}), headers={"content-type": ctype})
    plain_type = ctype.split(";")[0]
    _assert_one_sentence(
        r, 415, f"send the job as application/json (a submission) or application/yaml (a spec), not {plain_type}"
    )
    assert c.get("/v1/jobs").json()["total"] == total


# --------------------------------------------------------------------------- pathological bodies
DEEP_BODIES = {
    "a list 100,000 deep": "[" * 100_000 + "]" * 100_000,
    "objects 5,000 deep": '{"a":' * 5_000 + "1" + "}" * 5_000,
    "a spec 70 deep": '{"spec": {"model": {"kwargs": ' + '{"a":' * 70 + "1" + "}" * 70 + "}}}",
}


@pytest.mark.parametrize("what", DEEP_BODIES)
@pytest.mark.parametrize("ctype", ["application/json", "application/yaml"])
def test_a_deeply_nested_body_is_one_422_sentence_and_makes_no_job(c, what, ctype):
    from tula.service.admission import MAX_BODY_DEPTH

    total = c.get("/v1/jobs").json()["total"]
    r = c.post("/v1/jobs", content=DEEP_BODIES[what], headers={"content-type": ctype})
    _assert_one_sentence(r, 422, f"nests lists and objects more than {MAX_BODY_DEPTH} levels deep")
    assert c.get("/v1/jobs").json()["total"] == total
    r = c.post(f"/v1/jobs/{c.seeded}/replan", content=DEEP_BODIES[what], headers={"content-type": "application/json"})
    if what == "a spec 70 deep":  # the re-plan's body model refuses it by its fields: it has no 'spec'
        _assert_one_sentence(r, 422, "spec")
    else:
        _assert_one_sentence(r, 422, f"nests lists and objects more than {MAX_BODY_DEPTH} levels deep")


def test_a_data_set_above_the_services_memory_limit_is_refused_at_admission(c, tiny_spec_dict):
    """A synthetic set of 3 x 4096 x 4096 floats x 10^7 samples (about 2 PB) is refused with one
    sentence before any job exists; one within the limit is accepted."""
    total = c.get("/v1/jobs").json()["total"]
    data = {"name": "synthetic", "sample_shape": [3, 4096, 4096], "num_samples": 10_000_000}
    r = c.post("/v1/jobs", json={"spec": {**tiny_spec_dict, "data": data}})
    _assert_one_sentence(r, 422, "spec field 'data' describes a synthetic set of")
    assert "above this service's limit of" in r.json()["detail"] and "TULA_MAX_DATA_BYTES" in r.json()["detail"]
    assert c.get("/v1/jobs").json()["total"] == total
    small = {"name": "synthetic", "sample_shape": [1, 8, 8], "num_samples": 256}
    assert c.post("/v1/jobs", json={"spec": {**tiny_spec_dict, "data": small}}).status_code == 202


# --------------------------------------------------------------------------- limit and offset
def test_limit_and_offset_page_through_the_jobs_newest_first(c, tiny_spec_dict):
    for i in range(4):
        assert c.post("/v1/jobs", json={"spec": dict(tiny_spec_dict, name=f"page{i}")}).status_code == 202
    every = c.get("/v1/jobs", params={"limit": 500}).json()
    ids = [j["id"] for j in every["jobs"]]
    assert every["total"] == len(ids) >= 5 and c.seeded in ids
    names = [j["spec"]["name"] for j in every["jobs"]]
    assert names.index("page3") < names.index("page0")  # newest first

    page = c.get("/v1/jobs", params={"limit": 2, "offset": 1}).json()
    assert [j["id"] for j in page["jobs"]] == ids[1:3]
    assert (page["total"], page["limit"], page["offset"]) == (len(ids), 2, 1)
    pages = [c.get("/v1/jobs", params={"limit": 2, "offset": o}).json()["jobs"] for o in range(0, len(ids), 2)]
    assert [j["id"] for p in pages for j in p] == ids  # every job once, in order
    past = c.get("/v1/jobs", params={"limit": 2, "offset": len(ids)}).json()
    assert past["jobs"] == [] and past["total"] == len(ids)
    # with a state: the page and the total count that state only
    queued = [j["id"] for j in every["jobs"] if j["state"] == "queued"]
    page = c.get("/v1/jobs", params={"state": "queued", "limit": 1, "offset": 1}).json()
    assert [j["id"] for j in page["jobs"]] == queued[1:2] and page["total"] == len(queued)


@pytest.mark.parametrize(
    "params, words",
    [
        ({"limit": 0}, "field 'limit': input should be greater than or equal to 1"),
        ({"limit": 501}, "field 'limit': input should be less than or equal to 500"),
        ({"offset": -1}, "field 'offset': input should be greater than or equal to 0"),
        ({"limit": "ten"}, "field 'limit': input should be a valid integer"),
        ({"state": "finished"}, "field 'state'"),
    ],
)
def test_bad_paging_is_422_in_assert_one_sentence(c, params, words):
    _assert_one_sentence(c.get("/v1/jobs", params=params), 422, words)


# --------------------------------------------------------------------------- re-planning through the API
def _replan(c, **body):
    return c.post(f"/v1/jobs/{c.seeded}/replan", json=body)


def test_replan_with_pricing_prices_every_configuration(c):
    base = _replan(c, objective="time").json()
    price = base["spec"]["pricing"]["price_per_node_hour"]
    r = _replan(c, objective="time", pricing={"kind": "fixed", "price_per_node_hour": price * 10})
    assert r.status_code == 200, r.text
    plan = r.json()
    assert plan["spec"]["pricing"]["price_per_node_hour"] == price * 10
    pairs = [(a, b) for a, b in zip(base["configurations"], plan["configurations"], strict=True) if a["feasible"]]
    assert pairs
    for a, b in pairs:
        assert (a["n_workers"], a["global_batch"], a["total_time_s"]) == (
            b["n_workers"],
            b["global_batch"],
            b["total_time_s"],
        )
        assert b["cost"] == pytest.approx(10 * a["cost"], rel=1e-9)
    assert c.get(f"/v1/jobs/{c.seeded}/plan").json()["spec"]["pricing"]["price_per_node_hour"] == price  # unchanged
    bad = _replan(c, pricing={"kind": "fixed", "price_per_node_hour": -1})
    _assert_one_sentence(bad, 422, "spec field 'pricing.price_per_node_hour'")


def _feasible(plan):
    return [r for r in plan["configurations"] if r["feasible"]]


def test_replan_with_a_deadline_chooses_among_the_configurations_that_meet_it(c):
    free = _replan(c, objective="cost").json()
    times = sorted(r["total_time_s"] for r in _feasible(free))
    deadline_s = (times[0] + times[-1]) / 2  # some meet it, some do not
    r = _replan(c, objective="cost", deadline=deadline_s)
    assert r.status_code == 200, r.text
    plan = r.json()
    cons = plan["constraints"]
    assert cons["deadline_s"] == pytest.approx(deadline_s)
    meeting = [x for x in _feasible(plan) if x["total_time_s"] <= deadline_s]
    assert 0 < cons["n_meeting"] == len(meeting) < cons["n_feasible"] == len(_feasible(plan))
    for x in _feasible(plan):
        assert x["meets_constraints"] == (x["total_time_s"] <= deadline_s), x
    assert plan["choice"]["cost"] == min(x["cost"] for x in meeting)
    assert plan["choice"]["total_time_s"] <= deadline_s
    # a deadline nothing meets: one sentence naming it and the fastest
    _assert_one_sentence(
        _replan(c, objective="cost", deadline="1ms"), 422, "no configuration finishes within the 1 ms deadline"
    )
    _assert_one_sentence(_replan(c, deadline="soon"), 422, "deadline")


def test_replan_with_a_budget_chooses_among_the_configurations_within_it(c):
    free = _replan(c, objective="time").json()
    costs = sorted(r["cost"] for r in _feasible(free))
    budget = (costs[0] + costs[-1]) / 2
    r = _replan(c, objective="time", budget=budget)
    assert r.status_code == 200, r.text
    plan = r.json()
    cons = plan["constraints"]
    assert cons["budget"] == pytest.approx(budget) and cons.get("deadline_s") is None
    within = [x for x in _feasible(plan) if x["cost"] <= budget]
    assert 0 < cons["n_meeting"] == len(within) < cons["n_feasible"]
    assert plan["choice"]["total_time_s"] == min(x["total_time_s"] for x in within)
    assert plan["choice"]["cost"] <= budget
    _assert_one_sentence(
        _replan(c, objective="time", budget=1e-12), 422, "no configuration stays within the 1e-12 $ budget"
    )
    _assert_one_sentence(_replan(c, budget=-1), 422, "field 'budget'")
    # both at once, with another price: the budget is in that pricing's money
    both = _replan(
        c,
        objective="time",
        pricing={"kind": "fixed", "price_per_node_hour": free["spec"]["pricing"]["price_per_node_hour"] * 2},
        deadline=max(x["total_time_s"] for x in _feasible(free)) * 2,
        budget=budget,
    ).json()
    assert both["constraints"]["deadline_s"] is not None and both["constraints"]["budget"] == pytest.approx(budget)
    assert all(x["cost"] <= budget for x in _feasible(both) if x["meets_constraints"])
    assert both["constraints"]["n_meeting"] < cons["n_meeting"]  # twice the price: fewer fit the budget


# --------------------------------------------------------------------------- max_concurrent_jobs
@pytest.mark.slow  # a real service whose runners start worlds
def test_max_concurrent_jobs_two_runs_two_jobs_at_once_and_queues_the_third(tmp_path, tiny_pipeline):
    """With ``--max-concurrent-jobs 2`` the dispatcher claims a second job while the first
    runs, and a third waits queued (with 1 the second would wait)."""
    from tula.service.store import RUNNING_STATES

    home = tmp_path / "home"
    home.mkdir()
    seed_finished_job(home, tiny_pipeline.dir)  # the jobs plan from its models: no profiling
    svc = Service(home, "--max-concurrent-jobs", "2").start()
    try:
        c = svc.client()
        spec = tiny_pipeline.spec_dict(epochs=400)  # long: none ends while the test looks
        ids = [c.post("/v1/jobs", json={"spec": dict(spec, name=f"c{i}")}).json()["id"] for i in range(3)]

        def two_running(_job) -> bool:
            return all(c.get(f"/v1/jobs/{j}").json()["state"] in RUNNING_STATES for j in ids[:2])

        wait_for(c, ids[0], states=(), check=two_running, timeout_s=120)
        assert c.get("/v1/health").json()["running_jobs"] == 2
        third = c.get(f"/v1/jobs/{ids[2]}").json()
        assert third["state"] == "queued" and third["attempts"] == 0, third
        time.sleep(1.0)  # a few of the dispatcher's polls (0.2 s): still not claimed
        assert c.get(f"/v1/jobs/{ids[2]}").json()["state"] == "queued"
        assert c.get("/v1/health").json()["running_jobs"] == 2
    finally:
        svc.kill9()  # the service, its runners and their ranks at once: nothing of this test trains on


def test_replan_with_use_measured_scales_the_epochs_by_the_finished_runs_ratio(c, tiny_pipeline):
    """The seeded job's training run measured its epochs against the plan's prediction: a
    re-plan with use_measured scales every configuration's time by that median ratio, and
    says so in its reason and its record; without it the plan is the models' own."""
    import json

    from tula.core.records import TrainRecord
    from tula.core.run_costs import measured_ratio

    models = json.loads((tiny_pipeline.dir / "models.json").read_text())
    run = json.loads((tiny_pipeline.dir / "train" / "train.json").read_text())
    expected = measured_ratio(TrainRecord.from_dict(run), models)
    assert expected is not None and expected.ratio > 0
    base = _replan(c, objective="time").json()
    r = _replan(c, objective="time", use_measured=True)
    assert r.status_code == 200, r.text
    plan = r.json()
    assert base["measured_ratio"] is None
    assert plan["measured_ratio"] == {**expected.to_json_dict(), "applied": True}
    for a, b in zip(base["configurations"], plan["configurations"], strict=True):
        if a["feasible"]:
            assert b["total_time_s"] == pytest.approx(a["total_time_s"] * expected.ratio)
    assert f"epochs scaled by {expected.ratio:.2f}" in plan["reason"]
    bad = _replan(c, objective="time", use_measured="sometimes")
    assert bad.status_code == 422
