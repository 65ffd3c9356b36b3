"""The input path that overlaps the step (#25 item 1), on CPU: the prefetching thread and the
device-resident path give exactly the synchronous path's batches (in-memory and
loader-backed sets, augmentation, evaluation), a 2-rank run trained with prefetching resumes
to the model of an uninterrupted synchronous run bit for bit, an error in the thread is the
same exception at the rank's ``next()`` (one sentence, exit 2 through the CLI, no thread or
process left), and SIGINT with a prefetch in flight stops at a step boundary with 130.

On CUDA the same thread also copies on a side stream (not run here: no GPU)."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import (
    assert_same_model,
    env_with_tests,
    local_launcher,
    popen_tula,
    run_tula,
    train_args,
    train_in_two,
    write_spec,
)
from PIL import Image

from tula.core.memory_model import MemoryModel
from tula.core.spec import spec_from_dict
from tula.engine.checkpoint import CHECKPOINT
from tula.engine.data import DataPath, epoch_order, resident_fits
from tula.engine.train import steps_per_epoch, train
from tula.engine.workloads import load_dataset

HERE = Path(__file__).resolve().parent


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("tula-prefetch")]


@pytest.fixture(scope="module")
def image_root(tmp_path_factory) -> Path:
    """2 classes x 12 JPEGs of 16x16."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(1)
    for c in range(2):
        (root / f"class{c}").mkdir()
        for i in range(12):
            Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(root / f"class{c}" / f"{i}.png")
    return root


def _all_batches(path: DataPath, n: int, global_batch: int = 8) -> list:
    """Two epochs of a 2-rank run as each rank takes them, a profiling stream's first batches,
    and the test split's evaluation batches."""
    out = []
    for e in (0, 1):
        perm = epoch_order(0, e, n)
        for rank in range(2):
            out += list(
                path.epoch_batches(e, perm, global_batch, rank, global_batch // 2, steps_per_epoch(n, global_batch))
            )
    stream = path.random_batches(4, torch.Generator().manual_seed(5))
    out += [next(stream) for _ in range(3)]
    out += list(path.eval_batches(1, 2, 3))
    return out


def _equal(a: list, b: list) -> bool:
    return len(a) == len(b) and all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(a, b))


def test_prefetched_and_resident_batches_are_the_synchronous_ones(image_root):
    digits = load_dataset(spec_from_dict({"data": {"name": "digits"}}).data)
    sync = _all_batches(DataPath(digits, "cpu", prefetch=False), digits.train_size)
    with DataPath(digits, "cpu", prefetch=True) as path:
        assert path.prefetch and path.resident_bytes == 0
        assert _equal(_all_batches(path, digits.train_size), sync)
        assert path.prefetch_thread is not None
    with DataPath(digits, "cpu", resident=True) as path:  # indexed where the tensors are, no thread
        assert not path.prefetch and path.resident_bytes == digits.tensor_bytes > 0
        assert _equal(_all_batches(path, digits.train_size), sync)
        assert path.prefetch_thread is None
    for workers in (0, 2):
        spec = spec_from_dict(
            {
                "data": {
                    "name": "imagefolder",
                    "root": str(image_root),
                    "image_size": 16,
                    "augment": True,
                    "loader_workers": workers,
                }
            }  # fmt: skip
        )
        data = load_dataset(spec.data, 0)
        sync = _all_batches(DataPath(data, "cpu", prefetch=False), data.train_size)
        with DataPath(data, "cpu", prefetch=True) as path:
            assert _equal(_all_batches(path, data.train_size), sync), f"loader_workers={workers}"
        data.close()
    time.sleep(0.1)
    assert not _prefetch_threads(), "a prefetching thread outlived its path"


def test_a_new_stream_ends_the_old_thread_and_the_spec_decides_the_path():
    data = load_dataset(spec_from_dict({"data": {"name": "digits", "prefetch": "on"}}).data)
    path = DataPath(data, "cpu")
    assert path.prefetch  # 'on' also on a CPU; 'auto' is off there
    assert not DataPath(load_dataset(spec_from_dict({"data": {"name": "digits"}}).data), "cpu").prefetch
    endless = path.random_batches(16, torch.Generator().manual_seed(0))
    next(endless)
    old = path.prefetch_thread
    assert old is not None and old.is_alive()
    list(path.eval_batches(0, 1, 100))  # a new stream: the endless one's thread ends
    assert not old.is_alive()
    with pytest.raises(RuntimeError, match="replaced"):
        next(endless)
    path.close()
    assert not _prefetch_threads()


def test_an_error_in_the_prefetching_thread_is_the_same_exception_at_next(tests_on_path):
    spec = spec_from_dict(
        {
            "data": {
                "factory": "factories:corrupt_sample",
                "kwargs": {"n": 40, "bad": 5},
                "loader_workers": 0,
                "prefetch": "on",
            }
        }  # fmt: skip
    )
    data = load_dataset(spec.data, 0)
    perm = torch.arange(40)
    batches = DataPath(data, "cpu").epoch_batches(0, perm, 4, 0, 4, 10)
    next(batches)  # samples 0-3
    with pytest.raises(OSError, match="sample 5 is corrupt"):
        next(batches)
    with pytest.raises(RuntimeError, match="replaced"):  # the stream has ended; it does not hang
        next(batches)
    time.sleep(0.1)
    assert not _prefetch_threads()


def test_resident_rule_and_the_memory_model_count_the_data_set():
    assert resident_fits(100, 1000, 0.25) and not resident_fits(300, 1000, 0.25)
    assert not resident_fits(100, None, 0.25) and not resident_fits(100, 1000, 0.0)
    base = dict(
        param_bytes=1000, grad_bytes=1000, optimizer_state_bytes=0, buffer_bytes=0, other_static_bytes=0,
        activation_bytes_per_sample=90, batch_bytes_per_sample=10, probe_local_batches=(2, 4),
        probe_peak_bytes=(2200, 2400), device="cuda",
    )  # fmt: skip
    plain, resident = MemoryModel(**base), MemoryModel(**base, resident_data_bytes=5000)
    assert resident.predict_peak_bytes(8) - plain.predict_peak_bytes(8) == 5000
    assert plain.max_local_batch(20_000, 0.0) == 180 and resident.max_local_batch(20_000, 0.0) == 130
    assert "kept on the device" in resident.shortfall(6000, 0.0)
    # a refit keeps the resident bytes apart from the workspaces
    again = resident.refit([8, 16], [2000 + 5000 + 800, 2000 + 5000 + 1600])
    assert again.resident_data_bytes == 5000 and abs(again.other_static_bytes) <= 1
    assert MemoryModel.from_dict(resident.to_dict()) == resident


def _factory_spec(**data) -> dict:
    return {
        "name": "seg",
        "seed": 2,
        "model": {"name": "factories:tiny_fcn", "kwargs": {"width": 4}},
        "data": {"factory": "factories:make_segmentation", "kwargs": {"n": 96}, "loader_workers": 1, **data},
        "epochs": 2,
        "optimizer": {"name": "sgd", "lr": 0.2},
        "train": {"loss": "factories:PixelBCE", "warmup_epochs": 0, "eval_batch": 16},
    }


@pytest.mark.slow
def test_training_with_prefetching_resumes_to_the_synchronous_model_bit_for_bit(tmp_path, tests_on_path):
    """2 ranks: 2 epochs without prefetching, against 1 epoch with it and a resumed second
    (a loader-backed set, one loader worker per rank, read by the prefetching thread)."""
    launcher = local_launcher()
    sync = _factory_spec(prefetch="off")
    whole = train(spec_from_dict(sync), "lbt", 2, 16, tmp_path / "whole", launcher=launcher)
    ahead = _factory_spec(prefetch="on")
    resumed = train_in_two(ahead, "lbt", 2, 16, tmp_path / "split", launcher)
    assert resumed.resumed_from_epoch == 1 and resumed.replicas_identical
    assert_same_model(tmp_path / "whole", tmp_path / "split")
    assert whole.history[-1].test_loss == resumed.history[-1].test_loss


@pytest.mark.slow
def test_a_corrupt_sample_read_by_the_prefetching_thread_is_one_sentence_and_exit_2(tmp_path):
    d = _factory_spec(prefetch="on", loader_workers=0)
    d["data"]["factory"], d["data"]["kwargs"] = "factories:corrupt_sample", {"n": 96, "bad": 37}
    spec = write_spec(tmp_path, d)
    t0 = time.monotonic()
    r = run_tula(*train_args(spec, tmp_path / "run", batch=16), timeout=240, env=env_with_tests())
    assert r.returncode == 2, r.stderr
    assert time.monotonic() - t0 < 120
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "OSError: sample 37 is corrupt: [bold]bad[/bold] header" in lines[0], r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_sigint_with_a_prefetch_in_flight_stops_at_a_step_with_130(tmp_path):
    """A slow set (every sample takes 4 ms to read): the prefetching thread is mid-batch most
    of the time; Ctrl-C after the first checkpoint stops at the next step."""
    d = _factory_spec(prefetch="on", loader_workers=0)
    d["epochs"] = 100
    d["data"]["factory"], d["data"]["kwargs"] = "factories:corrupt_sample", {"n": 96, "bad": None, "delay_s": 0.004}
    spec = write_spec(tmp_path, d)
    out = tmp_path / "run"
    proc = popen_tula(*train_args(spec, out, batch=16), stdout=subprocess.PIPE, env=env_with_tests())
    deadline = time.monotonic() + 180
    while not (out / CHECKPOINT).exists():
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "no checkpoint"
        time.sleep(0.05)
    time.sleep(0.3)  # into the next epoch
    t_signal = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal reaches the group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert time.monotonic() - t_signal < 30
    assert "training stopped by SIGINT" in " ".join(err.split()) and "Traceback" not in err


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
