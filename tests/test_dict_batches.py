"""Hugging Face-style batches (#44 item 4): a data factory's dict samples (``input_ids``,
``attention_mask``, ``labels``) flow where tensors did -- the step's micro-batches, AGS's small
batch, the data path, evaluation -- and with ``train.loss: model`` the model's own ``.loss`` (or
``["loss"]``) is trained; evaluation reports the test loss and perplexity.  The user's code is
tests/user_hf.py."""

import math
import tempfile

import pytest
import torch
from helpers import assert_refused, local_launcher, tula_in_process, write_spec

from tula.core.spec import spec_from_dict
from tula.engine.batch import ModelLoss, batch_loss, batch_size, slice_batch, to_device
from tula.engine.ddp import OneRank
from tula.engine.launch import WorkerContext
from tula.engine.precision import Precision
from tula.engine.rank_loop import _RankTrainer
from tula.engine.step import TrainStep
from tula.engine.train import train
from tula.engine.workloads import build_loss, check_workload, load_dataset

LOCAL_BATCH = 16


def _spec(model: str = "user_hf:TinyLM", loss: str = "model", **data_kwargs) -> dict:
    return {
        "name": "hf",
        "model": {"name": model},
        "data": {"name": "factory", "factory": "user_hf:make_tokens", "kwargs": data_kwargs},
        "epochs": 2,
        "optimizer": {"name": "sgd", "lr": 0.5, "momentum": 0.9},
        "train": {"loss": loss, "noise_scale": False, "warmup_epochs": 0},
        "search": {"cluster_sizes": [1, 2], "min_batch": 16, "max_batch": 64},
        "profile": {"warmup_steps": 1, "timed_steps": 3, "threads_per_worker": 1, "min_timed_s": 0},
    }


def _dict_batch(n: int = LOCAL_BATCH, seed: int = 3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 16, (n, 8), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": (ids + 1) % 16}


def test_a_dict_batch_is_sliced_sized_and_moved_as_a_tensor_is():
    b = _dict_batch()
    assert batch_size(b) == LOCAL_BATCH and batch_size(b["input_ids"]) == LOCAL_BATCH and batch_size(None) == 0
    part = slice_batch(b, 4, 10)
    assert set(part) == set(b) and all(torch.equal(part[k], b[k][4:10]) for k in b)
    assert slice_batch(None, 0, 2) is None
    pair = slice_batch((b["input_ids"], b["labels"]), 0, 3)
    assert isinstance(pair, tuple) and torch.equal(pair[1], b["labels"][:3])
    assert to_device(b, torch.device("cpu")) is b


def test_the_data_path_gives_a_dict_batch_and_no_targets(tests_on_path):
    data = load_dataset(spec_from_dict(_spec()).data)
    try:
        x, y = data.batch(4, torch.Generator().manual_seed(0))
        assert y is None and set(x) == {"input_ids", "attention_mask", "labels"} and x["input_ids"].shape == (4, 8)
        assert data.sample_shape == (8,)
        from tula.engine.data import data_path

        batches = data_path(data, "cpu").epoch_batches(0, torch.arange(data.train_size), 32, 1, 16, 2)
        x, y = next(batches)
        assert y is None and torch.equal(x["input_ids"], data.take(torch.arange(16, 32))[0]["input_ids"])
    finally:
        data.close()


@pytest.mark.parametrize("model", ["user_hf:TinyLM", "user_hf:DictLM"])
def test_the_model_loss_is_its_output_s_loss_or_its_dict_s(tests_on_path, model):
    spec = spec_from_dict(_spec(model))
    net, _ = check_workload(spec)
    loss = batch_loss(net, build_loss("model"), _dict_batch(), None)
    assert loss.ndim == 0 and loss.requires_grad and math.isfinite(float(loss.detach()))


def _params_after_one_step(k: int) -> list[torch.Tensor]:
    import user_hf

    torch.manual_seed(0)
    model = user_hf.TinyLM()
    step = TrainStep(
        OneRank(model, torch.device("cpu")),
        ModelLoss(),
        Precision("fp32", torch.device("cpu")),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        accumulation_steps=k,
    )
    step.train_step((_dict_batch(), None))
    return [p.detach().clone() for p in model.parameters()]


def test_two_micro_batches_of_a_dict_batch_give_the_parameters_of_one(tests_on_path):
    one, two = _params_after_one_step(1), _params_after_one_step(2)
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(one, two))
    torch.manual_seed(0)
    import user_hf

    start = [p.detach() for p in user_hf.TinyLM().parameters()]
    assert not all(torch.allclose(a, b) for a, b in zip(start, one))  # the step did move them


def test_ags_measures_its_factors_on_a_dict_batch(tests_on_path):
    """AGS (the default method) on dict batches: its small batch (the first samples of every key)
    gives factors, and the steps lower the loss."""
    d = _spec()
    d["train"]["ags"] = {"update_every": 1, "b_small": 4}
    spec = spec_from_dict(d)
    ctx = WorkerContext(rank=0, world_size=1, device=torch.device("cpu"), backend="gloo")
    batches = [(_dict_batch(seed=s), None) for s in range(6)]
    with tempfile.TemporaryDirectory() as out:
        rt = _RankTrainer(ctx, spec, "ags", out, [], None, 1)
        try:
            rt.start_at(LOCAL_BATCH, None)
            rt.model.train()
            with torch.no_grad():
                first = float(batch_loss(rt.model, rt.loss_fn, *batches[0]))
            ran = rt.stepper.run_epoch(iter(batches), len(batches))
            with torch.no_grad():
                last = float(batch_loss(rt.model, rt.loss_fn, *batches[0]))
            summary = rt.method.optimizer.factor_summary()
        finally:
            rt.data.close()
    assert ran.steps == len(batches) and last < first
    assert summary is not None and math.isfinite(summary["mean"])
    assert rt.method.step_norms_batches == (4, LOCAL_BATCH)


@pytest.mark.slow  # a real 2-rank world
def test_two_ranks_train_a_model_with_its_own_loss_and_report_perplexity(tests_on_path, tmp_path):
    spec = spec_from_dict(_spec())
    run = train(spec, "ags", 2, 64, tmp_path, launcher=local_launcher())
    h = run.history
    assert run.replicas_identical and [e.epoch for e in h] == [1, 2]
    assert h[-1].train_loss < h[0].train_loss
    assert h[-1].test_loss < math.log(16)  # below a uniform guess over the vocabulary
    assert h[-1].test_perplexity == pytest.approx(math.exp(h[-1].test_loss))
    assert not h[-1].given("test_top1")


@pytest.mark.slow  # real worlds of 1 and 2 ranks
def test_the_profile_times_dict_batches_and_measures_their_noise_scale(tests_on_path):
    from tula.engine.profile import profile

    d = _spec()
    d["train"]["noise_scale"] = True
    d["search"] = {"cluster_sizes": [1, 2], "min_batch": 16, "max_batch": 32}
    rec = profile(spec_from_dict(d), launcher=local_launcher())
    timed = {(t.n_workers, t.local_batch) for t in rec.trials if t.status == "ok" and t.t_step_s > 0}
    assert timed >= {(1, 16), (2, 16)}
    noise = [t.noise for t in rec.trials if t.noise]  # the gradient noise scale's pairs
    assert noise and all(len(n.g2) == n.steps for n in noise)


def test_tiny_gpt_gives_its_own_loss_given_labels_and_the_text_set_its_perplexity():
    from tula.engine.tiny_gpt import TinyGPT

    torch.manual_seed(0)
    model = TinyGPT(vocab_size=32, n_layers=1, d_model=16, n_heads=2, max_positions=8)
    tokens = torch.randint(0, 32, (3, 8))
    targets = torch.randint(0, 32, (3, 8))
    logits = model(tokens)
    out = batch_loss(model, ModelLoss(), tokens, targets)
    assert torch.allclose(out, torch.nn.functional.cross_entropy(logits, targets))
    assert torch.equal(model(tokens, labels=targets).logits, logits)
    text = {"name": "text", "sequence_length": 16, "num_samples": 64}
    spec = spec_from_dict({"name": "t", "model": {"name": "tiny_gpt"}, "data": text, "train": {"loss": "model"}})
    _, data = check_workload(spec)  # called as model(tokens, labels=targets): its own loss
    data.close()


def test_evaluation_of_a_sequence_model_reports_perplexity():
    from tula.engine.evaluation import evaluate
    from tula.engine.tiny_gpt import TinyGPT

    d = {"name": "text", "sequence_length": 16, "num_samples": 64}
    data = load_dataset(spec_from_dict({"name": "t", "model": {"name": "tiny_gpt"}, "data": d}).data)
    model = TinyGPT(n_layers=1, d_model=16, n_heads=2, max_positions=16)
    try:
        ce = evaluate(model, data, 0, 1, 32, torch.device("cpu"), "cross_entropy")
        own = evaluate(model, data, 0, 1, 32, torch.device("cpu"), "model", ModelLoss())
    finally:
        data.close()
    assert ce["test_perplexity"] == pytest.approx(math.exp(ce["test_loss"]))
    assert own["test_loss"] == pytest.approx(ce["test_loss"], rel=1e-5) and "test_top1" not in own
    assert own["test_perplexity"] == pytest.approx(ce["test_perplexity"], rel=1e-5)


@pytest.mark.parametrize(
    "spec, sentence",
    [
        (
            _spec(keys=["input_ids", "labels"]),
            "model 'user_hf:TinyLM' cannot take user_hf:make_tokens batches of keys input_ids, labels "
            "(TypeError: TinyLM.forward() missing 1 required positional argument: 'attention_mask')",
        ),
        (
            _spec(keys=["input_ids", "attention_mask"]),
            "train.loss is 'model', but model 'user_hf:TinyLM' returned LMOutput with no loss",
        ),
        (
            _spec("user_hf:NoLossLM"),
            "train.loss is 'model', but model 'user_hf:NoLossLM' returned Tensor with no loss",
        ),
        (
            _spec(loss="cross_entropy"),
            "data set 'user_hf:make_tokens' gives dict batches (keys input_ids, attention_mask, labels) with the "
            "targets inside, so the model must give its own loss: set train.loss to 'model', not 'cross_entropy'",
        ),
    ],
    ids=["missing-key", "no-labels", "no-loss", "not-model-loss"],
)
def test_a_dict_batch_the_model_cannot_take_is_one_sentence_in_tula_check(tmp_path, spec, sentence):
    path = write_spec(tmp_path, spec)
    assert_refused(tula_in_process("check", path), sentence)


def test_tula_check_accepts_dict_batches_and_a_model_with_its_own_loss(tmp_path):
    r = tula_in_process("check", write_spec(tmp_path, _spec()))
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "Traceback" not in r.stdout + r.stderr


def test_train_loss_model_is_a_loss_of_the_spec():
    from tula.core.errors import SpecError

    assert spec_from_dict(_spec()).train.loss == "model"
    with pytest.raises(SpecError, match="'models' is not a loss; use cross_entropy, mse or model"):
        spec_from_dict(_spec(loss="models"))
