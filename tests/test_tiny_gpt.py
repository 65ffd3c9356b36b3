"""The built-in transformer workload: ``tiny_gpt`` (a small causal decoder) on ``text``
(bytes of Python's standard-library sources, :mod:`tula.engine.text_data`) -- deterministic
and cached data, next-character targets, causal logits of shape (B, V, L), per-token
evaluation, a real 2-rank DDP run that learns, and a sequence longer than the model's
positions refused in one sentence before any worker starts."""

import hashlib
import json

import numpy as np
import pytest
import torch
from helpers import assert_refused, run_python, tula_in_process, write_spec

from tula.core.spec import spec_from_dict
from tula.engine.evaluation import evaluate
from tula.engine.text_data import _read_corpus, corpus_cache_path, text_corpus, text_datasets
from tula.engine.tiny_gpt import TinyGPT
from tula.engine.workloads import build_model, check_workload


def _spec(sequence_length: int = 16, num_sequences: int = 256, **model: int) -> dict:
    """A tiny transformer job: 256 sequences of 16 characters, a 1-layer model of width 32."""
    return {
        "name": "tiny-gpt",
        "model": {
            "name": "tiny_gpt",
            "kwargs": {"n_layers": 1, "d_model": 32, "n_heads": 2, "max_positions": 16, **model},
        },
        "data": {"name": "text", "sequence_length": sequence_length, "num_samples": num_sequences},
        "epochs": 2,
        "optimizer": {"name": "adamw", "lr": 0.01},
        "search": {"cluster_sizes": [1, 2], "min_batch": 16, "max_batch": 64},
        "profile": {"warmup_steps": 1, "timed_steps": 3, "threads_per_worker": 1, "min_timed_s": 0},
    }


def test_text_is_deterministic_cached_and_shifted():
    a = text_datasets(sequence_length=32, num_sequences=500, seed=3)
    path = corpus_cache_path()
    assert path.is_file() and path.parent.name.startswith("data-cache")  # the tests' cache, not ~/.cache
    written = path.stat().st_mtime_ns
    b = text_datasets(sequence_length=32, num_sequences=500, seed=3)
    assert path.stat().st_mtime_ns == written  # read from the cache, not written again
    assert np.array_equal(text_corpus(), _read_corpus())  # the cache holds the sources' bytes
    for split in ("train", "test"):
        assert all(torch.equal(s, t) for s, t in zip(a[split].tensors, b[split].tensors))
    assert a["num_classes"] == 256 and len(a["train"]) == 400 and len(a["test"]) == 100
    x, y = a["train"].tensors
    assert x.shape == y.shape == (400, 32) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
    assert 0 <= int(x.min()) and int(x.max()) < 256
    c = text_datasets(sequence_length=32, num_sequences=500, seed=4)  # another seed: another split of the same
    assert not torch.equal(c["train"].tensors[0], x)
    every = torch.cat([a["train"].tensors[0], a["test"].tensors[0]])
    assert torch.equal(every.unique(dim=0), torch.cat([c["train"].tensors[0], c["test"].tensors[0]]).unique(dim=0))
    # another process (a rank) builds the same ids
    code = (
        "import hashlib; from tula.engine.text_data import text_datasets; "
        "d = text_datasets(sequence_length=32, num_sequences=500, seed=3); "
        "print(hashlib.sha256(b''.join(t.numpy().tobytes() for s in ('train', 'test') for t in d[s].tensors)).hexdigest())"
    )
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    here = hashlib.sha256(b"".join(t.numpy().tobytes() for s in ("train", "test") for t in a[s].tensors)).hexdigest()
    assert r.stdout.strip() == here
    with pytest.raises(ValueError, match="holds at most"):
        text_datasets(sequence_length=64, num_sequences=10**6)


def test_tiny_gpt_logits_are_causal_and_class_second():
    torch.manual_seed(0)
    model = TinyGPT(vocab_size=256, n_layers=2, d_model=32, n_heads=4, max_positions=16).eval()
    tokens = torch.randint(0, 256, (3, 12))
    out = model(tokens)
    assert out.shape == (3, 256, 12)
    # not a view of the head's output (FSDP2 warns of a module returning one), its layout the head's
    assert out._base is None and out.stride() == (12 * 256, 1, 256)
    assert model(tokens, labels=tokens).logits._base is None
    changed = tokens.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 256
    out2 = model(changed)
    assert torch.equal(out[:, :, :7], out2[:, :, :7])  # a later token does not change earlier logits
    assert not torch.allclose(out[:, :, 7:], out2[:, :, 7:])
    with pytest.raises(ValueError, match="sequences of 17 tokens are longer than the model's max_positions 16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_evaluation_counts_top1_and_loss_per_token():
    spec = spec_from_dict(_spec())
    model, data = check_workload(spec)
    res = evaluate(model, data, 0, 1, 20, torch.device("cpu"), "cross_entropy")
    x, y = data.take(torch.arange(data.test_size), "test")
    model.eval()
    with torch.no_grad():
        out = model(x)
    assert res["test_top1"] == pytest.approx(float((out.argmax(1) == y).double().mean()))
    assert res["test_loss"] == pytest.approx(float(torch.nn.functional.cross_entropy(out, y)), rel=1e-5)
    top5 = (out.topk(5, dim=1).indices == y.unsqueeze(1)).any(dim=1).double().mean()
    assert res["test_top5"] == pytest.approx(float(top5))
    assert build_model(spec.model).max_positions == 16


@pytest.mark.slow  # a real DDP world
def test_two_ranks_train_tiny_gpt_on_text_and_the_loss_falls(tmp_path):
    spec = write_spec(tmp_path, _spec(), "gpt.yaml")
    out = tmp_path / "run"
    r = tula_in_process("train", spec, "--method", "lbt", "--workers", "2", "--batch", "16", "--out", str(out))
    assert r.returncode == 0, r.stderr
    tr = json.loads((out / "train.json").read_text())
    loss = [h["train_loss"] for h in tr["history"]]
    assert len(loss) == 2 and loss[1] < loss[0] < 6.0, loss  # ln 256 = 5.5 at the start
    assert tr["replicas_identical"]
    assert 0 < tr["history"][-1]["test_top1"] <= 1


def test_a_sequence_longer_than_the_positions_is_one_sentence(tmp_path):
    spec = write_spec(tmp_path, _spec(sequence_length=24), "long.yaml")
    assert_refused(
        tula_in_process("check", spec),
        "sequences of 24 tokens are longer than the model's max_positions 16",
    )
