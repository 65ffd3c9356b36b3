"""The typed progress events (tula.core.events): they pickle (a launcher's queue carries them
across processes) and their JSON is the dict each was before they were typed."""

import pickle

import pytest

from tula.core.events import (
    Checked,
    EpochFinished,
    FellBack,
    Note,
    RankTrialFinished,
    RecordSaved,
    Resized,
    StageDone,
    StageStarted,
    StepDone,
    TrialFinished,
    TrialsPlanned,
    WorldStarted,
)
from tula.core.records import Fallback, Trial, as_epoch

EPOCH_LINE = {
    "epoch": 2,
    "steps": 22,
    "steps_done": 44,
    "global_batch": 64,
    "n_workers": 1,
    "lr": 0.05,
    "train_loss": 0.2797,
    "epoch_time_s": 0.09,
    "test_loss": 0.2897,
    "test_top1": 0.8997,
    "test_top5": 1.0,
    "scaled_fraction": 0.86,
    "a_figure_of_a_newer_writer": 3,
}

# each event and the dict the engine sent for it before the events were typed
EVENTS = [
    (Checked(), {"type": "checked"}),
    (Note("N = 4 not profiled"), {"type": "note", "message": "N = 4 not profiled"}),
    (TrialsPlanned(total=6, done=2), {"type": "plan", "total": 6, "done": 2}),
    (
        TrialsPlanned(total=2, memory={"a": 1.0}, max_local_batch=128, configs=((1, 16), (2, 32, 64))),
        {
            "type": "plan",
            "total": 2,
            "done": 0,
            "memory": {"a": 1.0},
            "max_local_batch": 128,
            "configs": [[1, 16], [2, 32, 64]],
        },
    ),  # fmt: skip
    (
        TrialFinished(n_workers=2, global_batch=32, status="ok", index=3),
        {"type": "trial", "n_workers": 2, "global_batch": 32, "status": "ok", "index": 3},
    ),
    (
        TrialFinished(n_workers=2, global_batch=32, status="skipped"),
        {"type": "trial", "n_workers": 2, "global_batch": 32, "status": "skipped"},
    ),
    (
        WorldStarted(global_batch=64, n_workers=2, accumulation_steps=2, micro_batch=16, steps_per_epoch=22, epochs=3),
        {
            "type": "start",
            "global_batch": 64,
            "n_workers": 2,
            "accumulation_steps": 2,
            "micro_batch": 16,
            "steps_per_epoch": 22,
            "epochs": 3,
        },
    ),  # fmt: skip
    (StepDone(epoch=1, step=5, steps_per_epoch=22), {"type": "step", "epoch": 1, "step": 5, "steps_per_epoch": 22}),
    (EpochFinished(as_epoch(EPOCH_LINE)), {"type": "epoch", **EPOCH_LINE}),
    (
        Resized(at_epoch=1, global_batch=128, n_workers=2, accumulation_steps=1, new_world=False),
        {
            "type": "resize",
            "at_epoch": 1,
            "global_batch": 128,
            "n_workers": 2,
            "accumulation_steps": 1,
            "new_world": False,
        },
    ),  # fmt: skip
    (
        FellBack(Fallback(from_global_batch=64, to_global_batch=32, at_epoch=1, reason="CUDA out of memory")),
        {
            "type": "fallback",
            "from_global_batch": 64,
            "to_global_batch": 32,
            "at_epoch": 1,
            "reason": "CUDA out of memory",
        },
    ),  # fmt: skip
    (StageStarted({"method": "ags", "n_workers": 1}), {"type": "stage", "method": "ags", "n_workers": 1}),
    (StageDone(), {"type": "done"}),
    (
        RecordSaved(record_kind="profile", path="out/profile.json"),
        {"type": "saved", "kind": "profile", "path": "out/profile.json"},
    ),  # fmt: skip
]


@pytest.mark.parametrize(("event", "as_dict"), EVENTS, ids=[type(e).__name__ for e, _ in EVENTS])
def test_an_event_pickles_and_its_json_is_the_dict_it_was(event, as_dict):
    back = pickle.loads(pickle.dumps(event))
    assert back == event and type(back) is type(event)
    assert event.to_json_dict() == as_dict
    # the dict-style read (ev["type"], ev.get(key)) is gone: a callback matches on the class
    assert not hasattr(event, "get") and not hasattr(event, "__getitem__")


def test_a_rank_trial_pickles_with_its_trial_and_is_json_as_it_was():
    trial = Trial(2, 16, 32, "ok", t_step_s=0.01, hosts=["h"])
    ev = RankTrialFinished(rank=1, trial=trial)
    back = pickle.loads(pickle.dumps(ev))
    assert back.trial == trial and back.rank == 1
    assert ev.to_json_dict()["trial"]["t_step_s"] == 0.01 and ev.to_json_dict()["type"] == "rank_trial"


def test_an_event_is_frozen():
    ev = StepDone(epoch=0, step=1, steps_per_epoch=2)
    with pytest.raises(AttributeError):
        ev.step = 2  # type: ignore[misc]  # the assignment the test expects to fail
