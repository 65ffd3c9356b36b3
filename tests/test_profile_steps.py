"""The profiling session's steps, one at a time and without a world
(:class:`tula.engine.profile.ProfileSession`): the sizes a launcher can run, a partial
record resumed, the configurations still to run, a failed world mapped to trials or a
sentence, and the record."""

import dataclasses
import json
import signal
from pathlib import Path

import pytest

from tula.core.errors import InfeasibleError, PlacementError, SpecError, WorkerError
from tula.core.events import Checked, Note, TrialFinished, TrialsPlanned
from tula.core.memory_model import MemoryModel
from tula.core.records import PROFILE_KIND, AccumulationTrial, HostFacts, ProfileRecord, RunTrial, Trial
from tula.core.space import Config
from tula.core.spec import spec_from_dict
from tula.engine.profile import MemoryProbe, ProfileFailed, ProfileSession

#: a real profile record (tests/data/records): its memory model is one the record's checks accept
STORED = json.loads((Path(__file__).parent / "data" / "records" / "profile.json").read_text())
MEMORY = ProfileRecord.from_dict(STORED).memory


class _Launcher:
    """Stands in for a launcher: its facts and placement; ``run`` is not called."""

    name = "fake"
    threads_per_worker = 1

    def __init__(self, world_size: int | None = None, gpus_per_host: int | None = None):
        self.world_size, self.gpus_per_host = world_size, gpus_per_host

    def facts(self) -> HostFacts:
        return HostFacts(device="cpu")

    def run(self, *args, **kw):
        raise AssertionError("no world in these tests")


def _session(sizes=(1, 2), **launcher) -> tuple[ProfileSession, list[dict]]:
    spec = spec_from_dict(
        {
            "name": "steps",
            "model": {"name": "small_cnn", "kwargs": {"in_channels": 1, "num_classes": 10, "width": 8}},
            "data": {"name": "digits"},
            "search": {"cluster_sizes": list(sizes), "min_batch": 16, "max_batch": 256},
        }
    )
    events: list[dict] = []
    return ProfileSession(spec, "full", _Launcher(**launcher), events.append), events


def _probed(session: ProfileSession, configs) -> None:
    session.probe = MemoryProbe(MEMORY, 128, tuple(tuple(c) for c in configs))


def _trial(n: int, big_b: int, status: str = "ok") -> Trial:
    """A trial of N = ``n`` at B = ``big_b``; an ``ok`` one with its measurements."""
    if status != "ok":
        return Trial(n, big_b // n, big_b, status)
    return Trial(n, big_b // n, big_b, "ok", t_step_s=0.2, t_compute_s=0.1, peak_mem_bytes=1000, timed_steps=3)


# --------------------------------------------------------------------------- before any world
def test_check_knows_the_workload_and_runs_every_size():
    s, events = _session()
    s.check()
    assert s.sizes == [1, 2] and s.not_measured == {} and s.fixed is None
    assert (s.device, s.threads, s.cap, s.dataset_size, s.sample_shape) == (
        "cpu",
        1,
        None,
        1438,
        [1, 8, 8],
    )  # digits: 1797 samples, 359 held out
    assert s.param_count > 0 and s.grad_bytes == 4 * s.param_count  # float32, every parameter trained
    assert events == [Checked()]


def test_a_launched_world_runs_only_its_own_size():
    s, events = _session(sizes=(1, 2, 4), world_size=2)
    assert s.sizes_to_run([1, 2, 4]) == [2]
    assert events == [
        Note(
            "N = 1, 4 not profiled: this world (started by its launcher) has 2 ranks, "
            "and every trial here uses all of them"
        )
    ]
    s, _ = _session(world_size=3)
    with pytest.raises(SpecError, match="has 3 ranks, and search.cluster_sizes \\[1, 2\\] has no 3"):
        s.sizes_to_run([1, 2])


def test_sizes_with_more_ranks_than_gpus_are_not_measured():
    s, events = _session(gpus_per_host=1)
    assert s.sizes_to_run([1, 2]) == [1]
    assert list(s.not_measured) == ["2"]
    assert events == [Note(f"{s.not_measured['2']}: their trials are skipped, and the plan does not rank them")]
    with pytest.raises(PlacementError):
        s.sizes_to_run([2, 4])


def test_resume_from_keeps_the_finished_trials():
    s, events = _session()
    trials = [_trial(1, 16), _trial(1, 32, "error"), _trial(2, 32, "oom")]
    accumulated = {"local_batch": 16, "micro_batch": 8, "accumulation_steps": 2, "step_times_s": [0.3, 0.5],
                   "n_workers": 1, "t_step_s": 0.4}  # fmt: skip
    skipped = {"n_workers": 2, "method": "ags", "status": "skipped", "note": "too small"}
    previous = ProfileRecord.from_dict(
        {
            **STORED,
            "max_local_batch": 64,
            "configs": [[1, 16], [1, 32], [2, 32]],
            "trials": [dataclasses.asdict(t) for t in trials],
            "accumulation_trials": [accumulated],
            "run_trials": [skipped],
            "profiling_s": 12.5,
            "interrupted": "SIGINT",
        }
    )
    s.resume_from(previous)
    assert s.probe == MemoryProbe(MEMORY, 64, ((1, 16), (1, 32), (2, 32))) and isinstance(s.probe.memory, MemoryModel)
    assert s.trials == [trials[0], trials[2]] and all(isinstance(t, Trial) for t in s.trials)
    assert s.accumulation == [AccumulationTrial(**accumulated)] and s.run_trials == [RunTrial(**skipped)]
    assert s.spent_before == 12.5
    assert events == [TrialsPlanned(total=3, done=2)]
    # the resumed record writes its parts back as the partial file had them
    s.check()
    rec = s.record().to_json_dict()
    assert (rec["accumulation_trials"], rec["run_trials"]) == ([accumulated], [skipped])
    assert rec["memory"] == MEMORY.to_dict() and json.loads(json.dumps(rec["memory"])) == STORED["memory"]


# --------------------------------------------------------------------------- the configurations
def test_configs_to_run_records_what_a_launched_world_cannot_run():
    s, events = _session(world_size=2)
    s.check()
    _probed(s, [(1, 16), (1, 32), (2, 32)])
    s.trials = [_trial(1, 32)]  # already measured: not skipped again
    assert s.configs_to_run() == [Config(2, 32)]
    assert [(t.n_workers, t.global_batch, t.status) for t in s.trials[1:]] == [(1, 16, "skipped")]
    assert s.trials[1].note == "not run: this world (started by its launcher) has 2 ranks"
    assert events[-1] == TrialFinished(n_workers=1, global_batch=16, status="skipped")


def test_no_configuration_left_is_infeasible():
    s, _ = _session()
    s.check()
    _probed(s, [])
    with pytest.raises(InfeasibleError, match="local batch of at most 128 within the budget of None bytes"):
        s.configs_to_run()


# --------------------------------------------------------------------------- a failed world
def test_an_out_of_memory_after_the_probe_is_that_trials_result():
    s, _ = _session()
    s.check()
    _probed(s, [(2, 32), (2, 64), (2, 128)])
    s.world_failed(WorkerError("OutOfMemoryError on rank 1", rank=1, cause="oom"), 2, [(2, 64), (2, 32), (2, 128)])
    # the smallest batch not finished ran out of memory: every larger local batch is skipped
    assert [(t.global_batch, t.local_batch, t.status) for t in s.trials] == [
        (32, 16, "oom"),
        (64, 32, "skipped"),
        (128, 64, "skipped"),
    ]
    assert s.trials[1].note == "not run: local batch 16 already ran out of memory"


def test_a_crashed_world_records_its_trials_as_errors_and_raises_with_the_record():
    s, _ = _session()
    s.check()
    _probed(s, [(1, 16), (2, 32), (2, 64)])
    with pytest.raises(ProfileFailed, match="rank 1 died") as e:
        s.world_failed(WorkerError("rank 1 died", rank=1, cause="crash"), 2, None)
    rec = e.value.record  # the typed record: what the caller saves
    assert rec is not None and rec.failed == "rank 1 died" and e.value.rank == 1
    assert ProfileRecord.from_dict(rec.to_json_dict()).failed == "rank 1 died"
    assert [(t.global_batch, t.status, t.note) for t in rec.trials] == [
        (32, "error", "rank 1 died"),
        (64, "error", "not run: the world failed earlier"),
    ]


def test_a_world_that_fails_before_the_memory_probe_raises_its_error():
    s, _ = _session()
    s.check()
    err = WorkerError("no port", cause="crash")
    with pytest.raises(WorkerError) as e:
        s.world_failed(err, 1, None)
    assert e.value is err


# --------------------------------------------------------------------------- the record
def test_record_orders_the_trials_and_says_what_is_partial():
    s, _ = _session(gpus_per_host=1)
    s.check()
    _probed(s, [(1, 32), (1, 16)])
    s.trials = [_trial(1, 32), _trial(1, 16)]
    typed = s.record(extra=[_trial(1, 8)], in_progress=True)
    assert isinstance(typed, ProfileRecord) and typed.in_progress and typed.failed is None
    assert [t.global_batch for t in typed.trials] == [8, 16, 32] and typed.configs == [(1, 32), (1, 16)]
    rec = typed.to_json_dict()  # the file's values
    assert rec["kind"] == PROFILE_KIND and rec["search"] == "full" and rec["launcher"] == "fake"
    assert [t["global_batch"] for t in rec["trials"]] == [8, 16, 32]
    assert rec["configs"] == [[1, 32], [1, 16]] and rec["max_local_batch"] == 128
    assert rec["memory"] == MEMORY.to_dict() and isinstance(typed.memory, MemoryModel)
    assert rec["in_progress"] is True and "failed" not in rec and "interrupted" not in rec
    assert list(rec["not_measured"]) == ["2"] and rec["backend"] == "gloo"
    assert list(rec)[:6] == ["kind", "version", "spec", "search", "device", "backend"]  # the file's order
    assert ProfileRecord.from_dict(rec) == typed  # the file reads back as the record it was written from
    assert "in_progress" not in s.record().to_json_dict()
    assert s.record(interrupted="SIGINT").to_json_dict()["interrupted"] == "SIGINT"


def test_stopped_says_how_far_profiling_got():
    s, _ = _session()
    s.check()
    err = s.stopped(signal.SIGTERM)
    assert str(err) == "profiling stopped by SIGTERM during the memory probe; nothing was measured yet"
    assert err.record is None and err.signum == signal.SIGTERM
    _probed(s, [(1, 16), (1, 32), (2, 32)])
    s.trials = [_trial(1, 16), _trial(1, 32, "error")]
    err = s.stopped(signal.SIGINT)
    assert str(err) == "profiling stopped by SIGINT: 1 of 3 trial(s) finished"
    assert err.record is not None and err.record.interrupted == "SIGINT"
