"""The typed messages a training world's ranks return to the supervisor
(:mod:`tula.engine.rank_messages`): each pickles and comes back equal, and each kind comes from
a real 2-rank world on the local launcher (a real out-of-memory under an address-space cap, a
schedule's change of the worker count, a stop signal, a rank that dies) and is dispatched by
:meth:`tula.engine.train.TrainSupervisor.dispatch`."""

import json
import os
import pickle
import signal
from dataclasses import FrozenInstanceError

import pytest
from helpers import local_launcher

from tula.core.config import Config
from tula.core.errors import Interrupted as Stopped
from tula.core.events import EpochFinished, Event, FellBack, Resized, WorldStarted
from tula.core.records import TrainRecord
from tula.core.spec import spec_from_dict
from tula.engine import interrupts
from tula.engine.rank_messages import Failed, Finished, Interrupted, OutOfMemory, Resize
from tula.engine.train import TrainFailed, TrainSupervisor, _rank_results

DIGITS_TRAIN = 1438  # scikit-learn's 1797 digits less the 359 (20 %) held out for testing
AT = Config(n_workers=2, global_batch=64, accumulation_steps=2)
SEGMENT = {"global_batch": 64, "n_workers": 2, "accumulation_steps": 2, "from_epoch": 1, "wall_s": None}
MESSAGES = [
    Finished(
        AT,
        [SEGMENT],
        steps_per_epoch=22,
        steps_done=44,
        history=[{"epoch": 1, "train_loss": 1.5}, {"epoch": 2, "train_loss": 0.5}],
        traces={"delta": [0.1, 0.2]},
        param_digest="ab12",
    ),
    Resize(AT, [SEGMENT], epochs_done=1, steps_done=22, next=Config(n_workers=1, global_batch=128)),
    OutOfMemory(AT, [], note="OutOfMemoryError: the probe step at a micro-batch of 16 does not fit"),
    Interrupted(AT, [SEGMENT], epochs_done=1, steps_done=22, signum=int(signal.SIGTERM)),
    Failed("worker rank 1 died (was killed by SIGKILL)", rank=1, cause="lost_worker", details="Traceback ..."),
]


@pytest.fixture(autouse=True)
def _stop_requests_of_this_test_only():
    """SIGINT/SIGTERM as the training command takes them (a stop request, forwarded to the
    ranks); a request of an earlier test is forgotten on entry."""
    with interrupts.graceful_signals():
        yield


def _spec(tiny_spec_dict, epochs=1, **over):
    d = dict(tiny_spec_dict, epochs=epochs, **over)
    d["train"] = {"warmup_epochs": 0, **d.get("train", {})}
    return spec_from_dict(d)


def _supervisor(spec, n_workers, global_batch, out, events=None, method="lbt"):
    return TrainSupervisor(
        spec,
        method,
        n_workers=n_workers,
        global_batch=global_batch,
        out=out,
        launcher=local_launcher(),
        on_event=None if events is None else events.append,
        train_size=DIGITS_TRAIN,
    )


# --------------------------------------------------------------------------- the messages
@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_each_message_pickles_and_comes_back_equal_and_frozen(message):
    back = pickle.loads(pickle.dumps(message))
    assert back == message and type(back) is type(message) and back is not message
    cloudpickle = pytest.importorskip("cloudpickle")  # what Dask sends a rank's result with
    assert cloudpickle.loads(cloudpickle.dumps(message)) == message
    with pytest.raises(FrozenInstanceError):
        message.note = "changed"  # type: ignore[misc]


def test_a_result_that_is_no_rank_message_is_failed_with_a_sentence():
    finished = MESSAGES[0]
    assert _rank_results([finished, finished], 2) == [finished, finished]
    (none,) = _rank_results([finished, None], 2)
    assert none == Failed("worker rank 1 of the 2-worker world returned no result", rank=1)
    (a_dict,) = _rank_results([{"status": "ok"}, finished], 2)
    assert a_dict.note == "worker rank 0 of the 2-worker world returned a dict, not a rank's message"
    (mixed,) = _rank_results([finished, MESSAGES[2]], 2)
    assert mixed.note == "worker rank 1 ended its world with OutOfMemory where rank 0 ended it with Finished"
    (short,) = _rank_results([finished], 2)
    assert short.note == "the 2-worker world returned 1 result(s), not one per worker"


def test_failed_is_train_failed_with_its_sentence(tiny_spec_dict, tmp_path):
    sup = _supervisor(_spec(tiny_spec_dict), 2, 64, tmp_path)
    with pytest.raises(TrainFailed, match="^worker rank 1 died") as e:
        sup.dispatch([MESSAGES[4]])
    assert (e.value.rank, e.value.cause, e.value.details) == (1, "lost_worker", "Traceback ...")


# --------------------------------------------------------------------------- from real worlds
@pytest.mark.slow
def test_a_world_that_trains_every_epoch_returns_finished_and_the_record_is_json(tiny_spec_dict, tmp_path):
    sup = _supervisor(_spec(tiny_spec_dict), 2, 256, tmp_path)
    results = sup.generation()
    assert [type(r) for r in results] == [Finished, Finished]
    rank0, rank1 = results
    assert rank0.config == rank1.config == Config(n_workers=2, global_batch=256, accumulation_steps=1)
    assert rank0.param_digest == rank1.param_digest and rank0.steps_done == rank0.steps_per_epoch == 5
    assert [h["epoch"] for h in rank0.history] == [1] and rank1.traces == {}
    record = sup.dispatch(results)  # the typed record; to_json_dict its file's values
    assert isinstance(record, TrainRecord) and record.steps_done == 5 and [h.epoch for h in record.history] == [1]
    as_json = json.loads(json.dumps(record.to_json_dict()))
    assert as_json["steps_done"] == 5 and TrainRecord.from_dict(as_json).history == record.history
    assert as_json["history"] == json.loads(json.dumps(rank0.history)) == [as_json["final"]]  # as the ranks wrote it
    assert list(as_json)[:4] == ["kind", "version", "spec", "method"]  # the file's order
    assert as_json["replicas_identical"] and as_json["generations"][0]["new_world"] is True


@pytest.mark.slow
def test_a_real_out_of_memory_under_a_cap_is_out_of_memory_from_the_ranks(tiny_spec_dict, tmp_path):
    """A local batch of 512 digits through a width-32 CNN does not fit in a rank's address
    space capped 8 MiB above its size (tests/test_train.py's capped fallback): the ranks'
    probe agrees, every rank says :class:`OutOfMemory`, and the supervisor falls back to
    twice the accumulation steps."""
    d = dict(tiny_spec_dict, model={"name": "small_cnn", "kwargs": {"width": 32}})
    d["search"] = {**d["search"], "memory_budget_bytes": 8 * 2**20, "enforce_memory_cap": True}
    events: list[Event] = []
    sup = _supervisor(_spec(d), 2, 1024, tmp_path, events)
    results = sup.generation()
    assert results and all(isinstance(r, OutOfMemory) for r in results), results
    assert len(results) == 2, "the probe's agreed verdict, not a rank's failure mid-epoch"
    assert results[0].config == Config(n_workers=2, global_batch=1024, accumulation_steps=1)
    assert results[0].segments == [] and results[0].note
    assert sup.dispatch(results) is None
    assert (sup.global_batch, sup.accum) == (1024, 2)
    assert sup.fallbacks[0].reason == results[0].note[:300]
    assert [type(e) for e in events] == [WorldStarted, FellBack]


@pytest.mark.slow
def test_a_schedules_new_worker_count_ends_the_world_with_resize(tiny_spec_dict, tmp_path):
    train = {
        "batch_schedule": {"kind": "geometric", "factor": 2, "delay": 1},
        "workers": {"min": 1, "max": 2, "batch_per_worker": 64},
    }
    events: list[Event] = []
    sup = _supervisor(_spec(tiny_spec_dict, epochs=2, train=train), 1, 64, tmp_path, events, method="ags")
    sup.first_schedule()
    results = sup.generation()
    assert [type(r) for r in results] == [Resize]
    (resize,) = results
    assert resize.config == Config(n_workers=1, global_batch=64) and resize.next == Config(
        n_workers=2, global_batch=128
    )
    assert (resize.epochs_done, resize.steps_done) == (1, 22)
    assert sup.dispatch(results) is None
    assert (sup.n_workers, sup.global_batch, sup.accum, sup.at_epoch) == (2, 128, 1, 1)
    assert events[-1] == Resized(at_epoch=1, global_batch=128, n_workers=2, accumulation_steps=1, new_world=True)


@pytest.mark.slow
def test_a_stop_signal_ends_the_world_with_interrupted_and_the_run_as_stopped(tiny_spec_dict, tmp_path):
    """SIGINT to this process once the first epoch is written: forwarded to the ranks, which
    agree to stop at the next step boundary (or the epoch's end) and say :class:`Interrupted`."""
    sent: list[int] = []

    def on_event(ev: Event) -> None:
        if isinstance(ev, EpochFinished) and not sent:
            sent.append(ev.record.epoch)
            os.kill(os.getpid(), signal.SIGINT)

    sup = _supervisor(_spec(tiny_spec_dict, epochs=4), 2, 64, tmp_path)
    sup.emit = on_event
    results = sup.generation()
    assert sent == [1]
    assert [type(r) for r in results] == [Interrupted, Interrupted], results
    assert results[0].signum == signal.SIGINT and results[0].epochs_done in (1, 2)
    assert results[0].config == Config(n_workers=2, global_batch=64)
    with pytest.raises(Stopped, match=f"training stopped by SIGINT: epochs 1-{results[0].epochs_done} of 4 are kept"):
        sup.dispatch(results)


@pytest.mark.slow
def test_a_rank_that_dies_is_failed_and_the_run_fails_with_its_sentence(tiny_spec_dict, tmp_path):
    spec = _spec(tiny_spec_dict, model={"name": "workers:dies_on_rank_one", "kwargs": {"die_at_batch": 100}})
    sup = _supervisor(spec, 2, 256, tmp_path)
    (failed,) = sup.generation()
    assert isinstance(failed, Failed) and failed.rank == 1 and failed.cause == "lost_worker", failed
    assert "rank 1" in failed.note
    with pytest.raises(TrainFailed) as e:
        sup.dispatch([failed])
    assert str(e.value) == failed.note and e.value.rank == 1
