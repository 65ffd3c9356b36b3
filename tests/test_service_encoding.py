"""How the service encodes records (app.RecordResponse): orjson for records whose numbers are
all finite, the standard library's JSON, which keeps ``Infinity`` and ``NaN``, for the rest.
Either way a client reads back exactly the record the pipeline made."""

import json
import math

from helpers import models_record

from tula.core.perfmodel import PerfModel
from tula.core.plan import make_plan
from tula.service.app import RecordResponse, _all_finite

PERF = PerfModel("ring", grad_bytes=10**6, c0=0.01, c1=0.001, beta=0.01 / 10**6)  # test_plan's curves


def _render(record) -> bytes:
    return RecordResponse(None).render(record)


def test_a_plan_reads_back_equal_to_the_record():
    plan = make_plan(models_record(PERF, sizes=(1, 2, 4), full=True), "knee", {"deadline": "30s"}).to_json_dict()
    body = _render(plan)
    assert json.loads(body) == plan
    assert b"Infinity" not in body and b"NaN" not in body


def test_measurements_that_are_not_finite_stay_what_they_are():
    record = {
        "kind": "tula.train",
        "epochs": [{"b_simple": math.inf, "top1": math.nan, "loss": 0.5}],
        "pair": (1.0, -math.inf),
    }
    assert not _all_finite(record)
    body = _render(record)
    assert b"Infinity" in body and b"NaN" in body and b"null" not in body
    back = json.loads(body)
    assert back["epochs"][0]["b_simple"] == math.inf and math.isnan(back["epochs"][0]["top1"])
    assert back["pair"] == [1.0, -math.inf]


def test_finite_records_with_nulls_nested_lists_and_integers_are_finite():
    assert _all_finite({"a": None, "b": [1, 2.5, [3.0, {"c": True}]], "d": "inf"})
    assert not _all_finite({"a": [[{"b": [float("nan")]}]]})
