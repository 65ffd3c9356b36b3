"""One training step for the profile and training (:class:`tula.engine.step.TrainStep`): the
profiler's steps and the trainer's run the same code, to the bit; a user's subclass named in
``train.step`` is the one both run; a ``train.step`` that is not one is one sentence and exit 2
before any worker starts.  The user's steps are tests/user_steps.py."""

import os
import tempfile
from pathlib import Path

import pytest
import torch
from helpers import assert_refused, local_launcher, tiny_spec, tula_in_process, write_spec
from user_steps import COUNT_FILE_ENV

from tula.core.schedules import steps_per_epoch
from tula.core.spec import spec_from_dict
from tula.engine.launch import WorkerContext
from tula.engine.profile import _Worker, profile
from tula.engine.rank_loop import _RankTrainer
from tula.engine.step import TrainStep, step_class
from tula.engine.train import train
from tula.engine.workloads import load_dataset

HERE = Path(__file__).resolve().parent
STEPS = 3  # the steps compared
LOCAL_BATCH = 16


def _spec(step: str | None = None, **train) -> dict:
    d = tiny_spec()
    d["optimizer"] = {"name": "sgd", "lr": 0.05, "momentum": 0.9}
    d["train"] = {"noise_scale": False, **train, **({"step": step} if step else {})}
    return d


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``STEPS`` random batches of the digits' shape (1x8x8, 10 classes), from a fixed seed."""
    g = torch.Generator().manual_seed(3)
    return [
        (torch.randn(LOCAL_BATCH, 1, 8, 8, generator=g), torch.randint(0, 10, (LOCAL_BATCH,), generator=g))
        for _ in range(STEPS)
    ]


def _params_after_steps(d: dict, k: int) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """The parameters, on one rank and the CPU, before any step, after ``STEPS`` steps of the
    profile's worker (:class:`tula.engine.profile._Worker`, ``k`` micro-batches a step), and
    after as many of training's (:class:`tula.engine.rank_loop._RankTrainer`, method lbt, its
    epoch loop), on the same batches."""
    spec = spec_from_dict(d)
    ctx = WorkerContext(rank=0, world_size=1, device=torch.device("cpu"), backend="gloo")
    batches = _batches()
    w = _Worker(ctx, spec)
    start = [p.detach().clone() for p in w.ddp.module.parameters()]
    for x, y in batches:
        w.x, w.y = x, y
        if k == 1:
            w.step(True)
        else:
            w.accumulated_step(k)
    w.data.close()
    with tempfile.TemporaryDirectory() as out:
        rt = _RankTrainer(ctx, spec, "lbt", out, [], None, k)
        try:
            rt.start_at(LOCAL_BATCH, None)
            rt.model.train()
            ran = rt.stepper.run_epoch(iter(batches), STEPS)
        finally:
            rt.data.close()
    assert ran.steps == STEPS and not ran.stopped
    return start, [p.detach() for p in w.ddp.module.parameters()], [p.detach() for p in rt.model.parameters()]


@pytest.mark.parametrize("k, precision", [(1, "fp32"), (2, "fp32"), (2, "bf16"), (2, "fp16")])
def test_a_profile_step_and_a_training_step_give_the_same_parameters_bit_for_bit(k, precision, monkeypatch):
    monkeypatch.setenv("TULA_FP16_ON_CPU", "1")  # fp16's gradient scaler on the CPU (tula.engine.precision)
    start, profiled, trained = _params_after_steps(_spec(precision=precision), k)
    assert all(torch.equal(a, b) for a, b in zip(profiled, trained))
    assert not all(torch.equal(a, b) for a, b in zip(start, trained))  # the steps did move them


def test_the_subclass_named_in_the_spec_is_the_step_of_both():
    start, profiled, trained = _params_after_steps(_spec("user_steps:HalvedLossStep"), 1)
    assert all(torch.equal(a, b) for a, b in zip(profiled, trained))
    _, _, built_in = _params_after_steps(_spec(), 1)
    assert not all(torch.equal(a, b) for a, b in zip(built_in, trained))  # half the loss: other parameters


def test_step_class_is_the_built_in_one_by_default_and_the_named_one_otherwise():
    import user_steps

    assert step_class(spec_from_dict(_spec())) is TrainStep
    assert step_class(spec_from_dict(_spec("user_steps:CountingStep"))) is user_steps.CountingStep


@pytest.mark.slow  # real worlds: a profile and a training run of one rank
def test_the_ranks_of_a_profile_and_of_training_run_the_named_step(tmp_path, monkeypatch):
    counts = tmp_path / "steps.txt"
    monkeypatch.setenv(COUNT_FILE_ENV, str(counts))
    d = _spec("user_steps:CountingStep")
    d["search"] = {"cluster_sizes": [1], "min_batch": 32, "max_batch": 32}
    d["epochs"] = 1
    spec = spec_from_dict(d)
    profile(spec, launcher=local_launcher())
    profiled = counts.read_text().splitlines()
    assert len(profiled) > 0  # the trial's probe, peak, warm-up and timed steps, and the run trial's
    counts.unlink()
    train(spec, "lbt", 1, 32, tmp_path / "train", launcher=local_launcher())
    trained = counts.read_text().splitlines()
    n_steps = steps_per_epoch(load_dataset(spec.data, spec.seed).train_size, 32)
    assert len(trained) == n_steps, (len(trained), n_steps)  # every training step, and nothing else
    assert set(trained).isdisjoint(profiled)  # in the ranks (other processes than the profile's)


@pytest.mark.slow  # a real world of two ranks, two epochs
def test_the_ranks_run_training_s_epochs_through_an_overridden_run_epoch(tmp_path, monkeypatch):
    """``run_epoch`` overridden in the spec's ``train.step`` subclass (tests/user_steps.py's
    EpochCountingStep) is the epoch training runs: each rank calls it once per epoch, with the
    epoch's steps, in the ranks' processes (not this one)."""
    counts = tmp_path / "epochs.txt"
    monkeypatch.setenv(COUNT_FILE_ENV, str(counts))
    d = _spec("user_steps:EpochCountingStep")
    d["epochs"] = 2
    spec = spec_from_dict(d)
    run = train(spec, "lbt", 2, 64, tmp_path / "train", launcher=local_launcher())
    lines = [line.split() for line in counts.read_text().splitlines()]
    n_steps = steps_per_epoch(load_dataset(spec.data, spec.seed).train_size, 64)
    assert len(lines) == 2 * 2, lines  # two epochs on each of two ranks
    assert len({pid for pid, _ in lines}) == 2 and str(os.getpid()) not in {pid for pid, _ in lines}
    assert [int(steps) for _, steps in lines] == [n_steps] * 4
    assert [h.steps for h in run.history] == [n_steps, n_steps] and run.steps_done == 2 * n_steps


@pytest.mark.slow  # two real worlds of two ranks, one epoch each
def test_an_overridden_train_step_keeps_the_gradient_noise_measurement(tmp_path):
    """Training feeds the gradient noise scale from inside the step (:meth:`TrainStep.optimizer_step`
    calls its ``on_gradients`` hook between the backward and the update), so a user's ``train_step``
    (tests/user_steps.py's CountingStep, which runs the built-in one) measures the same B_simple, to
    the bit, as the built-in step on the same seed."""
    runs = []
    for step in (None, "user_steps:CountingStep"):
        d = _spec(step, noise_scale=True)
        d["epochs"] = 1
        runs.append(train(spec_from_dict(d), "lbt", 2, 64, tmp_path / f"run{len(runs)}", launcher=local_launcher()))
    built_in, overridden = ([(h.b_simple, h.train_loss) for h in run.history] for run in runs)
    assert built_in[0][0] is not None and built_in[0][0] > 0, built_in  # measured on the two ranks
    assert overridden == built_in


@pytest.mark.parametrize(
    "step, sentence",
    [
        ("user_steps:NotAStep", "train.step 'user_steps:NotAStep' is not a subclass of tula.engine.step.TrainStep"),
        ("user_steps:COUNT_FILE_ENV", "train.step 'user_steps:COUNT_FILE_ENV' is not a subclass"),
        ("user_steps:Missing", "train.step 'user_steps:Missing' cannot be imported"),
        ("no_such_module_here:Step", "train.step 'no_such_module_here:Step' cannot be imported"),
    ],
)
@pytest.mark.parametrize("command", ["profile", "train"])
def test_a_bad_train_step_is_one_sentence_before_any_worker(tmp_path, step, sentence, command):
    spec = write_spec(tmp_path, _spec(step), "spec.yaml")
    more = ["--method", "lbt", "--workers", "1", "--batch", "32"] if command == "train" else []
    r = tula_in_process(command, spec, "--out", str(tmp_path / "out"), *more, path=(HERE,))
    assert_refused(r, sentence)


def test_a_train_step_that_is_not_an_import_path_is_refused_by_the_spec():
    from tula.core.errors import SpecError

    with pytest.raises(SpecError, match="'ClippedStep' is not an import path; give the step class as"):
        spec_from_dict(_spec("ClippedStep"))
