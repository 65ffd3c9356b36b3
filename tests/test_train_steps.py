"""The training supervisor's steps, one at a time and without a world
(:class:`tula.engine.train.TrainSupervisor`): the resume state from a checkpoint's header,
the first configuration of a batch schedule, a failed world mapped to a message,
the resize to the next generation, the out-of-memory fallback and the record."""

import math
from dataclasses import replace

import pytest

from tula.core.config import Config
from tula.core.errors import InfeasibleError, RunDirError, SpecError, WorkerError
from tula.core.events import FellBack, Note, Resized
from tula.core.records import CHECKPOINT_KIND, TRAIN_KIND, CheckpointMeta, Fallback, HostFacts
from tula.core.spec import spec_from_dict
from tula.engine.rank_messages import Failed, Finished, OutOfMemory, Resize, Segment
from tula.engine.train import TrainSupervisor

TRAIN_SIZE = 1000


class _Launcher:
    """Stands in for a launcher: its facts, and ``provide`` giving at most ``have`` workers."""

    world_size = None

    def __init__(self, have: int | None = None):
        self.have = have

    def facts(self) -> HostFacts:
        return HostFacts(device="cpu")

    def provide(self, n: int) -> int:
        return n if self.have is None else min(n, self.have)

    def run(self, *args, **kw):  # a step that launches a world is not under test here
        raise AssertionError("no world in these tests")


def _supervisor(tmp_path, train=None, n_workers=2, global_batch=64, method="lbt", launcher=None, **over):
    spec = spec_from_dict(
        {
            "name": "steps",
            "model": {"name": "small_cnn", "kwargs": {"in_channels": 1, "num_classes": 10, "width": 8}},
            "data": {"name": "digits"},
            "epochs": 3,
            "train": train or {},
            **over,
        }
    )
    events: list[dict] = []
    sup = TrainSupervisor(
        spec,
        method,
        n_workers=n_workers,
        global_batch=global_batch,
        out=tmp_path,
        launcher=launcher or _Launcher(),
        on_event=events.append,
        train_size=TRAIN_SIZE,
    )
    return sup, events


SCHEDULE = {
    "warmup_epochs": 0,
    "batch_schedule": {"kind": "piecewise", "batches": [64, 128, 192]},
    "workers": {"min": 1, "max": 2, "batch_per_worker": 96},
}


def _epoch(epoch: int, global_batch: int, n_workers: int, **figures: float) -> dict:
    """One metrics.jsonl line as the ranks write it (the figures a test does not look at: 1.0)."""
    line = {"epoch": epoch, "steps": 1, "steps_done": epoch, "global_batch": global_batch, "n_workers": n_workers}
    return {**line, "lr": 0.1, "train_loss": 1.0, "epoch_time_s": 1.0, "test_loss": 1.0, **figures}


def _meta(**over) -> CheckpointMeta:
    """A checkpoint's header after epoch 2 (as tula.engine.checkpoint.checkpoint_header reads it)."""
    meta = {
        "kind": CHECKPOINT_KIND,
        "version": 1,
        "epoch": 2,
        "steps_done": 2,
        "method": "lbt",
        "global_batch": 64,
        "n_workers": 2,
        "accumulation_steps": 1,
        "fallbacks": [],
        "history": [_epoch(1, 32, 1), _epoch(2, 64, 2)],
    }
    return CheckpointMeta.model_validate({**meta, **over})


# --------------------------------------------------------------------------- the resume state
def test_resume_from_takes_the_checkpoints_batch_k_and_fallbacks(tmp_path):
    fb = [{"from_global_batch": 128, "to_global_batch": 64, "at_epoch": 1, "reason": "OutOfMemoryError"}]  # before k
    sup, _ = _supervisor(tmp_path, global_batch=128)
    meta = _meta(global_batch=64, accumulation_steps=2, fallbacks=fb)
    sup.resume_from(meta)
    assert (sup.global_batch, sup.n_workers, sup.accum) == (64, 2, 2)
    assert sup.fallbacks == [Fallback(from_global_batch=128, to_global_batch=64, at_epoch=1, reason="OutOfMemoryError")]
    assert sup.fallbacks is not meta.fallbacks  # a copy: the run appends to its own
    assert [f.to_json_dict() for f in sup.fallbacks] == fb  # written back as it was read: no k added
    assert sup.resumed_from_epoch == 2
    first = sup.first_trained
    assert first is not None and (first.epoch, first.global_batch, first.n_workers) == (1, 32, 1)
    # the spec asked for k = 1: a note says the checkpoint's 2 is kept
    assert len(sup.notes) == 1 and "checkpoint's 2 accumulation step(s), not train.accumulation_steps 1" in sup.notes[0]


def test_resume_from_with_a_schedule_goes_on_at_the_configuration_it_chose(tmp_path):
    sup, _ = _supervisor(tmp_path, train=SCHEDULE, n_workers=1)
    sup.resume_from(_meta(next_global_batch=192, next_n_workers=2, next_accumulation_steps=3, accumulation_steps=2))
    assert (sup.global_batch, sup.n_workers, sup.accum) == (192, 2, 3)
    assert sup.notes == []  # a schedule chooses its own k: no note


def test_resume_from_refuses_another_method_or_worker_count(tmp_path):
    sup, _ = _supervisor(tmp_path, n_workers=1)
    with pytest.raises(SpecError, match="trained with method 'lbt' on 2 worker\\(s\\), not 'lbt' on 1"):
        sup.resume_from(_meta())
    sup, _ = _supervisor(tmp_path, method="ags")
    with pytest.raises(SpecError, match="not 'ags' on 2"):
        sup.resume_from(_meta())
    sup, _ = _supervisor(tmp_path)
    with pytest.raises(SpecError, match="trained in fp16, not train.precision fp32"):
        sup.resume_from(_meta(precision={"name": "fp16"}))


def test_resume_state_without_a_checkpoint(tmp_path):
    sup, _ = _supervisor(tmp_path)
    sup.resume_state(False)
    assert sup.resumed_from_epoch is None and sup.global_batch == 64
    with pytest.raises(RunDirError, match="there is no checkpoint in .* to resume"):
        sup.resume_state(True)


# --------------------------------------------------------------------------- the first schedule
def test_first_schedule_starts_at_epoch_0s_configuration(tmp_path):
    sup, events = _supervisor(tmp_path, train=SCHEDULE, n_workers=2, global_batch=64)
    sup.first_schedule()
    # 64 samples at 96 per worker: ceil(64 / 96) = 1 worker
    assert (sup.global_batch, sup.n_workers, sup.accum) == (64, 1, 1)
    caps = sup.schedule.caps
    assert (caps.min_workers, caps.max_workers, caps.batch_per_worker, caps.dataset_size) == (1, 2, 96, TRAIN_SIZE)
    assert sup.schedule.lr_multiplier == 1.0 and sup.schedule.state is not None
    assert events == []


def test_first_schedule_of_a_resumed_run_takes_its_state_from_the_checkpoint(tmp_path):
    sup, _ = _supervisor(tmp_path, train={**SCHEDULE, "workers": {"min": 1, "max": 2}})
    sup.resume_from(_meta(next_global_batch=192, next_n_workers=2))
    sup.first_schedule()
    assert sup.schedule.state is None and sup.schedule.lr_multiplier == 1.0
    # batch_per_worker defaults to the run's first local batch: epoch 1's 32 on 1 worker
    assert sup.schedule.caps.batch_per_worker == 32
    assert (sup.global_batch, sup.n_workers) == (192, 2)


def test_first_schedule_goes_on_with_the_workers_the_cluster_gives(tmp_path):
    train = {**SCHEDULE, "batch_schedule": {"kind": "piecewise", "batches": [192]}}
    sup, events = _supervisor(tmp_path, train=train, launcher=_Launcher(have=1))
    sup.first_schedule()
    assert (sup.global_batch, sup.n_workers) == (192, 1)
    assert (sup.schedule.caps.min_workers, sup.schedule.caps.max_workers) == (1, 1)
    assert events == [
        Note("the cluster gave 1 of the 2 workers asked for; going on with 1 worker(s) at global batch 192")
    ]


# --------------------------------------------------------------------------- a failed world
def test_a_failed_world_is_failed_unless_it_ran_out_of_memory(tmp_path):
    sup, _ = _supervisor(tmp_path)
    failed = sup.world_failed(WorkerError("rank 1 died", rank=1, cause="crash"))
    assert isinstance(failed, Failed) and failed.note == "rank 1 died"
    assert failed.rank == 1 and failed.cause == "crash"
    oom = sup.world_failed(WorkerError("CUDA out of memory", cause="oom"))
    assert isinstance(oom, OutOfMemory) and oom.segments == [] and "CUDA out of memory" in oom.note
    assert oom.config == Config(n_workers=2, global_batch=64, accumulation_steps=1)


def test_add_segments_numbers_the_worlds(tmp_path):
    sup, _ = _supervisor(tmp_path)
    seg = Segment(global_batch=64, n_workers=2, accumulation_steps=1, from_epoch=1)
    sup.add_segments([replace(seg, wall_s=3.0), replace(seg, global_batch=128, from_epoch=2, wall_s=1.0)], 0.0)
    sup.add_segments([], 0.0)  # a world that trained no epoch adds nothing
    sup.add_segments([replace(seg, from_epoch=3, wall_s=2.0)], 0.0)
    assert [(g.global_batch, g.from_epoch, g.world, g.new_world) for g in sup.generations] == [
        (64, 1, 1, True),
        (128, 2, 1, False),
        (64, 3, 2, True),
    ]


# --------------------------------------------------------------------------- resize
def test_resize_moves_to_the_configuration_the_world_ended_for(tmp_path):
    sup, events = _supervisor(tmp_path, train=SCHEDULE, n_workers=1)
    sup.first_schedule()
    result = Resize(
        config=Config(n_workers=1, global_batch=64),
        segments=[],
        epochs_done=1,
        steps_done=15,
        next=Config(n_workers=2, global_batch=128, accumulation_steps=1),
    )
    assert sup.next_configuration(result) == Config(n_workers=2, global_batch=128, accumulation_steps=1)
    sup.resize(result)
    assert (sup.at_epoch, sup.global_batch, sup.n_workers, sup.accum) == (1, 128, 2, 1)
    assert events == [Resized(at_epoch=1, global_batch=128, n_workers=2, accumulation_steps=1, new_world=True)]


def test_resize_with_fewer_workers_than_asked_rounds_the_batch(tmp_path):
    sup, events = _supervisor(tmp_path, train=SCHEDULE, n_workers=1, launcher=_Launcher(have=1))
    sup.first_schedule()
    sup.resize(
        Resize(
            config=Config(n_workers=1, global_batch=64),
            segments=[],
            epochs_done=2,
            steps_done=30,
            next=Config(n_workers=2, global_batch=130),
        )
    )
    assert (sup.global_batch, sup.n_workers, sup.accum) == (130, 1, 1)  # k stays when the world gives none
    assert [type(e) for e in events] == [Note, Resized]


# --------------------------------------------------------------------------- out-of-memory fallback
def test_fall_back_doubles_k_while_the_micro_batch_is_even(tmp_path):
    sup, events = _supervisor(tmp_path, global_batch=128)
    sup.fall_back("OutOfMemoryError: " + "x" * 400)
    assert (sup.global_batch, sup.accum) == (128, 2)  # micro-batch 64 -> 32, the same updates
    fallback = {
        "from_global_batch": 128,
        "to_global_batch": 128,
        "from_accumulation_steps": 1,
        "to_accumulation_steps": 2,
        "at_epoch": 0,
        "reason": ("OutOfMemoryError: " + "x" * 400)[:300],
    }
    assert sup.fallbacks == [Fallback(**fallback)]
    assert events == [FellBack(Fallback(**fallback))]


def test_fall_back_under_a_schedule_halves_the_batch_and_caps_the_micro_batch(tmp_path):
    sup, _ = _supervisor(tmp_path, train=SCHEDULE, n_workers=1)
    sup.first_schedule()  # search.max_accumulation_steps 1: k cannot grow
    sup.global_batch, sup.n_workers = 128, 2
    sup.fall_back("oom")
    assert (sup.global_batch, sup.accum) == (64, 1)
    assert sup.schedule.caps.max_local_batch == 63  # below the micro-batch of 64 that ran out


def test_fall_back_with_nothing_smaller_left_is_infeasible(tmp_path):
    sup, events = _supervisor(tmp_path, global_batch=2)  # one sample per worker
    with pytest.raises(
        InfeasibleError,
        match="global batch 2 on 2 worker\\(s\\) ran out of memory at a micro-batch of 1 sample\\(s\\) per worker "
        "and no smaller batch is left",
    ):
        sup.fall_back("oom")
    assert events == []  # no fallback to a batch that cannot train is announced


# --------------------------------------------------------------------------- the record
def test_record_from_the_last_worlds_results(tmp_path):
    sup, _ = _supervisor(tmp_path, global_batch=128)
    sup.accum = 2
    hist = [_epoch(1, 128, 2, test_top1=0.5), _epoch(2, 128, 2, test_top1=0.75), _epoch(3, 128, 2)]
    at = Config(n_workers=2, global_batch=128, accumulation_steps=2)
    ranks = [
        Finished(at, [], steps_per_epoch=7, steps_done=21, history=hist, traces={"a": [1]}, param_digest="d"),
        Finished(at, [], steps_per_epoch=7, steps_done=21, history=[], traces={}, param_digest="d"),
    ]
    typed = sup.record(ranks)
    assert typed.kind == TRAIN_KIND and typed.method == "lbt" and [h.epoch for h in typed.history] == [1, 2, 3]
    rec = typed.to_json_dict()  # as train.json has it
    assert (rec["global_batch"], rec["local_batch"], rec["micro_batch"], rec["accumulation_steps"]) == (128, 64, 32, 2)
    assert (rec["steps_per_epoch"], rec["steps_done"], rec["epochs"]) == (7, 21, 3)
    assert rec["final"] == hist[-1] and rec["best_test_top1"] == 0.75
    assert rec["replicas_identical"] is True and rec["traces"] == {"a": [1]}
    assert rec["resumed_from_epoch"] is None and rec["batch_schedule"] is None and rec["generations"] == []
    rec = sup.record([replace(ranks[0], history=[]), replace(ranks[1], param_digest="e")]).to_json_dict()
    assert rec["replicas_identical"] is False and rec["final"] == {} and math.isnan(rec["best_test_top1"])
