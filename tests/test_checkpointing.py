"""Activation checkpointing (``train.checkpointing``, :mod:`tula.engine.checkpointing`): the
blocks found automatically or by name, the same parameters as without it, a lower step peak where
activations dominate, a real 2-rank DDP run with identical replicas, and a spec that checkpoints
nothing refused in one sentence before any worker starts."""

import pytest
import torch
from helpers import assert_refused, assert_same_model, local_launcher, tiny_spec, tula_in_process, write_spec
from torch import nn

from tula.core.errors import WorkloadError
from tula.core.spec import spec_from_dict
from tula.engine.checkpointing import apply_checkpointing, auto_block_classes, checkpoint_blocks
from tula.engine.ddp import OneRank
from tula.engine.memory import measure_step_peak_bytes
from tula.engine.precision import Precision
from tula.engine.step import TrainStep
from tula.engine.tiny_gpt import TinyGPT
from tula.engine.train import train
from tula.engine.workloads import build_loss, build_model, load_dataset

CPU = torch.device("cpu")


def _gpt_spec(checkpointing: str = "off", n_layers: int = 2, dropout: float = 0.1, **train: object) -> dict:
    """tiny_gpt on 256 text sequences of 32 bytes (dropout on: the recomputation must replay its masks)."""
    return {
        "name": "gpt-ckpt",
        "model": {
            "name": "tiny_gpt",
            "kwargs": {"n_layers": n_layers, "d_model": 32, "n_heads": 2, "max_positions": 32, "dropout": dropout},
        },
        "data": {"name": "text", "sequence_length": 32, "num_samples": 256},
        "epochs": 1,
        "optimizer": {"name": "adamw", "lr": 0.01},
        "train": {"checkpointing": checkpointing, **train},
        "search": {"cluster_sizes": [1, 2], "min_batch": 16, "max_batch": 64},
    }


def _step_of(d: dict) -> tuple[nn.Module, TrainStep, torch.optim.Optimizer]:
    """The job's model (checkpointed as its spec says), its plain optimiser and its training step on this CPU."""
    spec = spec_from_dict(d)
    torch.manual_seed(spec.seed)
    model = apply_checkpointing(build_model(spec.model), spec.train, spec.model.name)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    step = TrainStep(OneRank(model, CPU), build_loss(spec.train.loss), Precision("fp32", CPU), optimizer=optimizer)
    return model, step, optimizer


def _params_after_steps(checkpointing: str, n_steps: int = 3) -> list[torch.Tensor]:
    d = _gpt_spec(checkpointing)
    data = load_dataset(spec_from_dict(d).data, 0)
    model, step, _ = _step_of(d)
    torch.manual_seed(1)  # the dropout masks: the same stream for both runs
    for i in range(n_steps):
        step.train_step(data.batch(16, torch.Generator().manual_seed(i)), i)
    return [p.detach().clone() for p in model.parameters()]


def test_tiny_gpt_s_blocks_are_found_and_wrapped_once():
    model = TinyGPT(n_layers=3, d_model=32, n_heads=2)
    assert auto_block_classes(model) == {type(model.blocks[0])}
    assert checkpoint_blocks(model) == 3
    assert checkpoint_blocks(model) == 3  # a second call wraps nothing twice
    assert all("forward" in vars(b) for b in model.blocks) and "forward" not in vars(model.head)
    one = TinyGPT(n_layers=1, d_model=32, n_heads=2)  # a known block, even alone
    assert checkpoint_blocks(one) == 1


def test_the_automatic_rule_takes_repeated_blocks_and_named_classes_only_the_outermost():
    class MyBlock(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x)

    class BNBlock(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn = nn.Conv1d(8, 8, 1), nn.BatchNorm1d(8)

    net = nn.Sequential(MyBlock(), MyBlock(), BNBlock(), BNBlock(), nn.Linear(8, 8))
    assert auto_block_classes(net) == {MyBlock, nn.TransformerEncoderLayer}  # batch norm and singles left out
    assert checkpoint_blocks(net) == 2  # the layers inside the blocks are not wrapped again
    assert "forward" not in vars(net[0].inner) and "forward" not in vars(net[2])
    assert checkpoint_blocks(nn.Sequential(BNBlock(), nn.Linear(8, 8)), ["Linear"]) == 1
    assert checkpoint_blocks(nn.Sequential(nn.Linear(8, 8)), ["NoSuchBlock"]) == 0


def test_checkpointing_gives_the_parameters_of_the_plain_step_bit_for_bit():
    off, on = _params_after_steps("off"), _params_after_steps("on")
    start = [p.detach() for p in _step_of(_gpt_spec())[0].parameters()]
    assert not all(torch.equal(a, b) for a, b in zip(start, off))  # the steps did move them
    assert all(torch.equal(a, b) for a, b in zip(off, on))


def test_a_wrapped_block_runs_plain_in_evaluation_and_without_gradients():
    torch.manual_seed(0)
    plain = TinyGPT(n_layers=2, d_model=32, n_heads=2, max_positions=16).eval()
    wrapped = TinyGPT(n_layers=2, d_model=32, n_heads=2, max_positions=16).eval()
    wrapped.load_state_dict(plain.state_dict())
    checkpoint_blocks(wrapped)
    tokens = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        assert torch.equal(plain(tokens), wrapped(tokens))


def _step_peak_bytes(checkpointing: str, batch: int) -> int:
    d = _gpt_spec(checkpointing, n_layers=4, dropout=0.0)
    model, step, optimizer = _step_of(d)
    x, y = load_dataset(spec_from_dict(d).data, 0).batch(batch, torch.Generator().manual_seed(0))
    step.train_step((x, y))  # the optimiser's state made, as the profile's warm-up does
    return measure_step_peak_bytes(lambda: step.train_step((x, y)), model, optimizer, CPU)


def test_checkpointing_lowers_the_step_peak_where_activations_dominate():
    off, on = _step_peak_bytes("off", 128), _step_peak_bytes("on", 128)
    print(f"step peak at b=128, 4 blocks: off {off} bytes, on {on} bytes")
    assert on < 0.8 * off, (off, on)


@pytest.mark.slow  # a real 2-rank world
def test_two_ranks_train_with_checkpointing_and_end_with_identical_replicas(tmp_path):
    on = train(spec_from_dict(_gpt_spec("on")), "lbt", 2, 32, tmp_path / "on", launcher=local_launcher())
    assert on.replicas_identical and [e.epoch for e in on.history] == [1]
    off = train(spec_from_dict(_gpt_spec("off")), "lbt", 2, 32, tmp_path / "off", launcher=local_launcher())
    assert off.history[-1].train_loss == on.history[-1].train_loss
    assert_same_model(tmp_path / "on", tmp_path / "off")  # DDP's gradients of the recomputed blocks: the same


@pytest.mark.slow  # real one-rank worlds of the profile
def test_the_profile_measures_checkpointing_s_lower_peak():
    from tula.engine.profile import profile

    peaks = {}
    for checkpointing in ("off", "on"):
        d = _gpt_spec(checkpointing, n_layers=4, dropout=0.0)
        d["search"] = {"cluster_sizes": [1], "min_batch": 64, "max_batch": 64}
        d["profile"] = {"warmup_steps": 1, "timed_steps": 2, "threads_per_worker": 1, "min_timed_s": 0}
        rec = profile(spec_from_dict(d), launcher=local_launcher())
        ok = [t for t in rec.trials if t.status == "ok" and t.local_batch == 64]
        assert ok, rec.trials
        peaks[checkpointing] = ok[0].peak_mem_bytes
    print(f"profiled peak at b=64, 4 blocks: {peaks}")
    assert peaks["on"] < 0.8 * peaks["off"], peaks


@pytest.mark.parametrize(
    "spec, sentence",
    [
        (
            _gpt_spec("on", checkpoint_modules=["NoSuchBlock"]),
            "train.checkpointing is on, but model 'tiny_gpt' has no submodule of class 'NoSuchBlock' to checkpoint; "
            "name its repeated block class in train.checkpoint_modules, or set train.checkpointing to 'off'",
        ),
        (
            {**tiny_spec(), "train": {"checkpointing": "on"}},
            "train.checkpointing is on, but model 'small_cnn' has no submodule of nn.TransformerEncoderLayer, "
            "nn.TransformerDecoderLayer, tiny_gpt's blocks, or a class named *Block or *Layer with parameters and "
            "no batch norm that appears at least twice to checkpoint",
        ),
    ],
    ids=["no-such-class", "no-blocks"],
)
def test_checkpointing_that_matches_nothing_is_one_sentence_in_tula_check(tmp_path, spec, sentence):
    assert_refused(tula_in_process("check", write_spec(tmp_path, spec)), sentence)


def test_tula_check_accepts_checkpointing_on_tiny_gpt(tmp_path):
    r = tula_in_process("check", write_spec(tmp_path, _gpt_spec("on")))
    assert r.returncode == 0, (r.stdout, r.stderr)


def test_checkpointing_auto_wraps_nothing_until_the_plan_chooses(tmp_path):
    """auto: the planner's choice (tests/test_checkpointing_plan.py); the model as built wraps nothing."""
    spec = spec_from_dict(_gpt_spec("auto"))
    model = build_model(spec.model)
    assert apply_checkpointing(model, spec.train) is model and all("forward" not in vars(b) for b in model.blocks)


def test_checkpointing_off_wraps_nothing():
    spec = spec_from_dict(_gpt_spec("off", checkpoint_modules=["NoSuchBlock"]))
    model = build_model(spec.model)
    assert apply_checkpointing(model, spec.train) is model and all("forward" not in vars(b) for b in model.blocks)
    with pytest.raises(WorkloadError, match="has no submodule of class 'NoSuchBlock'"):
        apply_checkpointing(model, spec_from_dict(_gpt_spec("on", checkpoint_modules=["NoSuchBlock"])).train)


def test_checkpointing_on_changes_the_stored_model_key_and_off_keeps_it():
    """The profile of a checkpointed model measures another peak and step: another stored model."""
    from tula.service.model_key import key_parts_for_new_job, model_key, model_key_parts

    facts = {"device": "cpu", "cpu": "Test CPU", "gpu": None, "cores": 8, "torch": "2.14.1"}
    keys = {}
    for name, train_section in {
        "plain": {},
        "off": {"checkpointing": "off", "checkpoint_modules": ["Block"]},
        "found": {"checkpointing": "on"},
        "named": {"checkpointing": "on", "checkpoint_modules": ["Block"]},
    }.items():
        spec = {**_gpt_spec(), "train": train_section}
        parts = key_parts_for_new_job(spec, facts, 2)
        profile = {"device": "cpu", "facts": facts, "sample_shape": [32], "threads_per_worker": 2}
        assert model_key_parts(spec, profile) == parts
        keys[name] = model_key(parts)
    assert keys["plain"] == keys["off"] and len({keys["plain"], keys["found"], keys["named"]}) == 3
