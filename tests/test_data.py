"""The data path (tula.engine.data) on a real ImageFolder of JPEGs written here: the DataLoader
path gives exactly the per-sample path's batches, augmentation is drawn from (seed,
epoch, sample) alone, the loader leaves the global RNG and no process behind, and 2-rank
training on it resumes exactly."""

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import assert_same_model, comm, descendants, local_launcher, process_tree, train_in_two
from PIL import Image

from tula.core.errors import SpecError
from tula.core.spec import spec_from_dict
from tula.engine.data import DataPath, augment_image, data_path, epoch_order, sample_key
from tula.engine.train import steps_per_epoch, train
from tula.engine.workloads import load_dataset

CLASSES, PER_CLASS, SIZE = 3, 20, 32


@pytest.fixture(scope="module")
def image_root(tmp_path_factory) -> Path:
    """3 classes x 20 JPEGs of 32x32: a coloured square on noise, its corner by class."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for c in range(CLASSES):
        (root / f"class{c}").mkdir()
        for i in range(PER_CLASS):
            img = rng.integers(0, 96, (SIZE, SIZE, 3), dtype=np.uint8)
            img[4 + 8 * c : 14 + 8 * c, 4:14, c] = 255
            Image.fromarray(img).save(root / f"class{c}" / f"{i:03d}.jpg", quality=90)
    return root


def _data(root, augment=False, workers=2, seed=0, **extra):
    spec = spec_from_dict(
        {
            "seed": seed,
            "data": {
                "name": "imagefolder",
                "root": str(root),
                "augment": augment,
                "loader_workers": workers,
                "image_size": SIZE,
                **extra,
            },
        }
    )
    return load_dataset(spec.data, seed)


def _epochs(path: DataPath, n: int, epochs=(0, 1), global_batch=16, seed=0):
    """Every (epoch, step, rank) batch of a 2-rank run, as one rank after the other takes it."""
    out = {}
    for e in epochs:
        perm = epoch_order(seed, e, n)
        for rank in range(2):
            for i, b in enumerate(
                path.epoch_batches(e, perm, global_batch, rank, global_batch // 2, steps_per_epoch(n, global_batch))
            ):
                out[e, i, rank] = b
    return out


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k][0], b[k][0]) and torch.equal(a[k][1], b[k][1]) for k in a)


def test_loader_batches_are_the_per_sample_batches(image_root):
    data = _data(image_root)
    assert not data.in_memory and data.train_size == 48 and data.sample_shape == (3, SIZE, SIZE)
    n = data.train_size
    with DataPath(data, "cpu", workers=2) as path:
        got = _epochs(path, n)
        evals = list(path.eval_batches(1, 2, 4))
        assert len(path.worker_pids) == 2
    assert len(got) == 2 * 3 * 2
    for (e, i, rank), (x, y) in got.items():  # the per-sample path: Dataset.take of the rank's slice
        start = i * 16 + rank * 8
        xr, yr = data.take(epoch_order(0, e, n)[start : start + 8])
        assert torch.equal(x, xr) and torch.equal(y, yr) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert not torch.equal(got[0, 0, 0][0], got[1, 0, 0][0])  # epochs are different permutations
    xe, ye = data.take(torch.arange(1, data.test_size, 2)[:4], "test")
    assert torch.equal(evals[0][0], xe) and torch.equal(evals[0][1], ye)
    assert sum(len(y) for _, y in evals) == len(range(1, data.test_size, 2))
    # normalised with ImageNet's statistics: not in [0, 1] any more
    assert got[0, 0, 0][0].min() < -0.5


def test_augmented_batches_depend_only_on_seed_epoch_and_sample(image_root):
    n = 48
    with DataPath(_data(image_root, augment=True), "cpu", workers=0) as path:
        in_process = _epochs(path, n)
    with DataPath(_data(image_root, augment=True), "cpu", workers=2) as path:
        two_workers = _epochs(path, n)
    with DataPath(_data(image_root, augment=True), "cpu", workers=1) as path:
        again = _epochs(path, n)
    with DataPath(_data(image_root, augment=False), "cpu", workers=0) as path:
        plain = _epochs(path, n)
    with DataPath(_data(image_root, augment=True, seed=1), "cpu", workers=0) as path:
        other_seed = _epochs(path, n, seed=0)  # same order, other augmentation seed
    assert _same(in_process, two_workers) and _same(in_process, again)
    assert not _same(in_process, other_seed)
    for k in in_process:  # labels untouched, images changed
        assert torch.equal(in_process[k][1], plain[k][1])
    changed = sum(not torch.equal(in_process[k][0], plain[k][0]) for k in in_process)
    assert changed == len(in_process)
    # the same sample is augmented differently in another epoch
    data = _data(image_root, augment=True)
    e0, e1, e0_again = data.train[(0, 5)][0], data.train[(1, 5)][0], data.train[(0, 5)][0]
    assert torch.equal(e0, e0_again) and not torch.equal(e0, e1)
    assert torch.equal(data.train[5][0], _data(image_root).train[5][0])  # a bare index: not augmented
    # evaluation is never augmented
    with DataPath(data, "cpu", workers=0) as path:
        xe, _ = next(path.eval_batches(0, 1, 12))
    assert torch.equal(xe, data.take(torch.arange(12), "test")[0])


def test_augment_image_is_a_padded_crop_and_flip():
    x = torch.arange(2 * 6 * 5, dtype=torch.float32).reshape(2, 6, 5) + 1
    span = 9
    centre = 4 | 4 << 16  # top = left = 4 (no shift), flip bit 0
    assert torch.equal(augment_image(x, centre), x)
    assert torch.equal(augment_image(x, centre | (1 << 40)), x.flip(-1))
    assert torch.equal(augment_image(x, centre | (1 << 40), flip=False), x)
    shifted = augment_image(x, 0)  # top = left = 0: 4 rows and columns of zero padding come in
    assert shifted.shape == x.shape and torch.equal(shifted[:, 4:, 4:], x[:, :2, :1])
    assert float(shifted[:, :4].abs().sum()) == 0.0
    draws = {
        ((k & 0xFFFF) % span, ((k >> 16) & 0xFFFF) % span, (k >> 40) & 1)
        for k in (sample_key(0, 0, i) for i in range(2000))
    }
    assert len(draws) == span * span * 2  # every offset and flip occurs
    assert sample_key(0, 1, 2) != sample_key(0, 2, 1) and sample_key(3, 0, 0) == sample_key(3, 0, 0)


def test_loader_keeps_the_global_rng_and_ends_its_workers(image_root):
    me = os.getpid()
    before = set(descendants(me))
    data = _data(image_root, augment=True)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    path = data_path(data, "cpu")
    assert path is data_path(data, "cpu")  # one path per data set and device
    list(path.epoch_batches(0, epoch_order(0, 0, 48), 16, 0, 8, 3))
    pids = path.worker_pids
    assert len(pids) == 2 and set(pids) <= set(descendants(me))
    list(path.eval_batches(0, 1, 5))  # the same workers serve evaluation ...
    stream = path.random_batches(8, torch.Generator().manual_seed(0))
    assert [len(next(stream)[1]) for _ in range(10)] == [8] * 10  # ... and profiling's endless stream
    assert path.worker_pids == pids
    list(path.epoch_batches(1, epoch_order(0, 1, 48), 16, 0, 8, 3))  # a new stream replaces that one
    with pytest.raises(RuntimeError, match="replaced"):
        next(stream)
    assert torch.equal(torch.get_rng_state(), state)
    data.close()
    assert set(descendants(me)) <= before


def test_random_batches_draw_with_replacement_past_the_set(image_root):
    data = _data(image_root)
    path = DataPath(data, "cpu", workers=0)
    x, y = next(path.random_batches(100, torch.Generator().manual_seed(0)))
    assert x.shape == (100, 3, SIZE, SIZE) and y.shape == (100,)
    # every drawn sample is one of the set's, with its own label; 100 draws from a set of 48
    # repeat some samples (with replacement) and still see many different ones (random draws)
    samples = [data.train[i] for i in range(data.train_size)]
    rows = {tuple(s[0].flatten().tolist()): s[1] for s in samples}
    assert len(rows) == data.train_size == 48  # the set's samples are distinct images
    drawn = [tuple(r.tolist()) for r in x.flatten(1)]
    assert all(r in rows for r in drawn), "a drawn sample is not one of the set's"
    assert [rows[r] for r in drawn] == y.tolist()
    assert 20 < len(set(drawn)) < 100  # repeats: drawn with replacement, not a fixed subset


def test_in_memory_sets_keep_the_tensor_path():
    before = set(descendants(os.getpid()))
    spec = spec_from_dict({"data": {"name": "digits", "loader_workers": 2}})
    data = load_dataset(spec.data, 0)
    assert data.in_memory and data.loader_workers == 0
    path = DataPath(data, "cpu", workers=3)
    assert path.workers == 0
    perm = epoch_order(0, 0, data.train_size)
    batches = list(path.epoch_batches(0, perm, 64, 1, 32, 4))
    x_all, y_all = data.train.tensors
    for i, (x, y) in enumerate(batches):
        idx = perm[i * 64 + 32 : i * 64 + 64]
        assert torch.equal(x, x_all[idx]) and torch.equal(y, y_all[idx])
    assert path.worker_pids == [] and set(descendants(os.getpid())) <= before
    with pytest.raises(SpecError, match="augment"):
        spec_from_dict({"data": {"name": "digits", "augment": True}})
    with pytest.raises(SpecError, match="loader_workers"):
        spec_from_dict({"data": {"name": "imagefolder", "root": "/x", "loader_workers": -1}})


@pytest.mark.slow
def test_two_rank_training_with_loader_workers_resumes_exactly_and_leaves_no_process(image_root, tmp_path):
    """2 ranks x 2 loader workers, augmentation on: 2 epochs in one run end with the same
    model as 1 epoch and a resumed second; the workers run inside the ranks; none is left."""
    me = os.getpid()
    before = set(descendants(me))
    d = {
        "name": "imgs",
        "seed": 3,
        "epochs": 2,
        "model": {"name": "small_cnn", "kwargs": {"in_channels": 3, "num_classes": CLASSES, "width": 4}},
        "data": {"name": "imagefolder", "root": str(image_root), "augment": True, "loader_workers": 2},
        "train": {"warmup_epochs": 0, "eval_batch": 8},
    }
    launcher = local_launcher()
    seen = {"loader_workers": 0}
    done = threading.Event()

    def watch() -> None:  # the ranks' own children: their loader workers
        while not done.is_set():
            tree = process_tree()
            below = descendants(me)
            named = [p for p in below if comm(p).startswith("tula-rank-")]  # ranks and their forks
            ranks = [r for r in named if not any(r in tree.get(q, []) for q in named)]
            seen["loader_workers"] = max(seen["loader_workers"], sum(len(tree.get(r, [])) for r in ranks))
            time.sleep(0.05)

    t = threading.Thread(target=watch)
    t.start()
    try:
        whole = train(spec_from_dict(d), "lbt", 2, 16, tmp_path / "whole", launcher=launcher)
    finally:
        done.set()
        t.join()
    assert seen["loader_workers"] >= 4, "the ranks did not start their DataLoader workers"
    assert whole.replicas_identical and [h.epoch for h in whole.history] == [1, 2]
    resumed = train_in_two(d, "lbt", 2, 16, tmp_path / "split", launcher)
    assert resumed.resumed_from_epoch == 1 and resumed.replicas_identical
    assert_same_model(tmp_path / "whole", tmp_path / "split")
    assert whole.history[-1].test_top1 == resumed.history[-1].test_top1
    time.sleep(0.5)
    assert set(descendants(me)) <= before, "processes were left behind"


@pytest.mark.slow
def test_profile_times_the_step_with_its_batch_through_the_loader(image_root):
    from tula.engine.profile import profile

    spec = spec_from_dict(
        {
            "name": "imgs",
            "model": {"name": "small_cnn", "kwargs": {"in_channels": 3, "num_classes": CLASSES, "width": 4}},
            "data": {"name": "imagefolder", "root": str(image_root), "augment": True, "loader_workers": 2},
            "search": {"cluster_sizes": [1], "min_batch": 8, "max_batch": 16},
            "profile": {"warmup_steps": 1, "timed_steps": 3, "threads_per_worker": 1, "min_timed_s": 0},
        }
    )
    before = set(descendants(os.getpid()))
    rec = profile(spec, launcher=local_launcher())
    ok = [t for t in rec.trials if t.status == "ok"]
    assert ok and all(0 <= t.t_data_s < t.t_step_s for t in ok)
    assert set(descendants(os.getpid())) <= before


def test_merged_trial_names_the_loader_when_it_is_the_bottleneck():
    from tula.engine.profile import _merge_trials

    def rank(t_data, steps):
        return {
            "n_workers": 2,
            "local_batch": 8,
            "global_batch": 16,
            "status": "ok",
            "note": "",
            "t_data_s": t_data,
            "step_times_s": steps,
            "compute_times_s": [s / 2 for s in steps],
            "peak_mem_bytes": 1,
        }

    (slow,) = _merge_trials([[rank(0.02, [0.1] * 4)], [rank(0.04, [0.1, 0.1, 0.1, 0.2])]])
    assert slow["t_data_s"] == 0.04 and slow["note"].startswith("data loading is 40 % of the step")
    (fast,) = _merge_trials([[rank(0.001, [0.1] * 4)], [rank(0.002, [0.1] * 4)]])
    assert fast["t_data_s"] == 0.002 and fast["note"] == ""
    legacy = {k: v for k, v in rank(0, [0.1] * 4).items() if k != "t_data_s"}  # a record from before the field
    (old,) = _merge_trials([[legacy], [dict(legacy)]])
    assert old.get("t_data_s") is None and old["t_step_s"] == 0.1


def test_mnist1d_is_made_once_then_read_from_the_cache_and_a_damaged_file_is_made_again(tmp_path, monkeypatch):
    """MNIST-1D is generated once per (size, split, seed) and kept in TULA_CACHE_DIR: a later
    load reads the file (a file with other values under that name gives those values), and a
    file that cannot be read is made again, the same as the first."""
    from tula.engine.workloads import data_cache_dir

    monkeypatch.setenv("TULA_CACHE_DIR", str(tmp_path / "cache"))
    spec = spec_from_dict({"data": {"name": "mnist1d", "num_samples": 200}}).data
    first = load_dataset(spec, 3)
    (path,) = data_cache_dir().glob("mnist1d-*-n200-train*-seed3.npz")
    assert list(data_cache_dir().iterdir()) == [path]  # no temporary file left
    x_first = first.train.tensors[0].clone()
    again = load_dataset(spec, 3)
    assert torch.equal(again.train.tensors[0], x_first) and torch.equal(again.test.tensors[1], first.test.tensors[1])
    # the cache is what is read: the same name with other values gives those values
    with np.load(path) as z:
        shifted = {k: z[k] for k in z.files}
    shifted["x"] = shifted["x"] + 1.0
    with open(path, "wb") as f:
        np.savez(f, **shifted)
    shifted_x = load_dataset(spec, 3).train.tensors[0]
    assert torch.allclose(shifted_x, x_first + 1.0, atol=1e-6)  # float32 of x + 1 against float32 x, + 1
    # a damaged file is made again, as it was first made
    path.write_bytes(b"PK\x03\x04 not a whole archive")
    assert torch.equal(load_dataset(spec, 3).train.tensors[0], x_first)
    assert np.load(path)["x"].shape[0] == x_first.shape[0]
    # another seed is another file
    load_dataset(spec, 4)
    assert len(list(data_cache_dir().glob("mnist1d-*.npz"))) == 2
