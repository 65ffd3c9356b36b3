"""The data path: how one rank gets its batches, in training, profiling and evaluation.

Two paths, chosen by the data set:

* **in memory** (``digits``, ``mnist1d``, ``synthetic``: a ``TensorDataset``): a batch is
  one indexing of the stacked tensors -- no loader, no worker processes;
* **read from disk** (``mnist``, ``fashionmnist``, ``cifar10``, ``cifar100``,
  ``imagefolder``) **and the user's own sets** (``data.factory``): samples are decoded by a
  ``torch.utils.data.DataLoader`` with ``loader_workers`` worker processes per rank (kept
  alive across epochs), batches pinned on CUDA, prefetched while the step computes.
  ``loader_workers = 0`` reads every sample in the training process, one after the other
  (the per-sample path Tula had before).  Both kinds are :class:`SampleView` splits; a
  user's set is viewed ``raw`` (its samples as it gives them, batched by its own
  ``collate_fn`` when it has one).

Either way the batches are the same: training step ``i`` of epoch ``e`` takes global batch
``i`` of the epoch's permutation and rank ``r`` its ``r``-th slice of ``local_batch``
samples, so a resumed run sees exactly the batches an uninterrupted one would.

Augmentation (``data.augment``: random crop with 4 pixels of zero padding, and a horizontal
flip except for MNIST's digits) is drawn from (seed, epoch, sample index) alone -- not from a
worker's RNG -- so the batches do not depend on the number of loader workers, on which
worker loads a sample, or on whether the run was resumed.  The loader never draws from the
training process's global torch RNG (it gets its own generator).

One :class:`DataPath` per rank and data set (:func:`data_path`) serves training, profiling
and evaluation from one pool of workers; starting a new stream of batches ends the
previous one.  :meth:`DataPath.close` (or :meth:`tula.engine.workloads.Dataset.close`) ends the
workers; so does garbage collection of the path, and the exit of the rank.
"""

from __future__ import annotations

import multiprocessing
import signal
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

Batch = tuple[torch.Tensor, torch.Tensor]

ON_DISK = ("mnist", "fashionmnist", "cifar10", "cifar100", "imagefolder")
"""Data sets read from a local folder (the DataLoader path)."""

MEAN_STD: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "mnist": ((0.1307,), (0.3081,)),
    "fashionmnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "imagefolder": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),  # ImageNet's
}
"""Per-channel mean and standard deviation used by ``data.normalize``."""

CROP_PADDING = 4
# Loader workers are forked where the platform can, whatever the platform's default start
# method: a spawned worker would import torch again (seconds per worker).  The workers only
# decode samples; they never touch CUDA or the process group.
_WORKER_START = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
_MASK64 = (1 << 64) - 1


# --------------------------------------------------------------------------- samples
def sample_key(seed: int, epoch: int, index: int) -> int:
    """A 64-bit number drawn from (seed, epoch, sample index) alone (SplitMix64 rounds)."""
    h = 0
    for v in (seed, epoch, index):
        h = (h ^ (v & _MASK64)) + 0x9E3779B97F4A7C15 & _MASK64
        h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
        h = (h ^ (h >> 27)) * 0x94D049BB133111EB & _MASK64
        h ^= h >> 31
    return h


def augment_image(x: torch.Tensor, key: int, padding: int = CROP_PADDING, flip: bool = True) -> torch.Tensor:
    """Random crop of ``x`` (C x H x W) to its own size after ``padding`` zero pixels on
    each side, then a horizontal flip with probability 1/2; the draws come from ``key``."""
    _, h, w = x.shape
    span = 2 * padding + 1
    top, left, flip_bit = (key & 0xFFFF) % span, ((key >> 16) & 0xFFFF) % span, (key >> 40) & 1
    out = torch.nn.functional.pad(x, (padding, padding, padding, padding))[:, top : top + h, left : left + w]
    if flip and flip_bit:
        out = out.flip(-1)
    return out.contiguous()


@dataclass
class Dataset:
    """Training and test data of one job.

    In-memory sets hold ``TensorDataset`` splits; sets read from disk and the user's own
    sets hold :class:`tula.engine.data.SampleView` splits (normalised tensors;
    ``train[(epoch, i)]`` is augmented when the spec asks; a user's samples as they come).
    ``collate_fn`` batches a list of samples into ``(inputs, targets)`` (default: torch's
    ``default_collate``).  ``num_classes`` is 0 when a user's set does not say it.  ``take``
    and ``batch`` read samples one by one in this process (no augmentation): for a look at
    the data, not for training -- :func:`tula.engine.data.data_path` gives a rank its batches.
    """

    name: str
    train: torch.utils.data.Dataset
    test: torch.utils.data.Dataset
    sample_shape: tuple[int, ...]
    num_classes: int
    seed: int = 0
    loader_workers: int = 0  # DataLoader worker processes per rank (sets read from disk, a user's sets)
    collate_fn: Callable[[list], Any] | None = None  # a user's set's own batching (None: default_collate)
    _path: Any = field(default=None, repr=False, compare=False)  # tula.engine.data.DataPath, made on first use

    @property
    def in_memory(self) -> bool:
        """True for stacked tensors (digits, mnist1d, synthetic): batches are one indexing."""
        return isinstance(self.train, torch.utils.data.TensorDataset)

    def close(self) -> None:
        """End the loader worker processes of this data set's data path, if any started."""
        if self._path is not None:
            self._path.close()
            self._path = None

    def collate(self, samples: list) -> Any:
        """``samples`` as one batch: the set's ``collate_fn``, else torch's ``default_collate``."""
        return (self.collate_fn or torch.utils.data.default_collate)(samples)

    @property
    def train_size(self) -> int:
        return len(self.train)  # type: ignore[arg-type]

    @property
    def test_size(self) -> int:
        return len(self.test)  # type: ignore[arg-type]

    def batch(self, local_batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """A random batch of ``local_batch`` training samples (with replacement past the set's size)."""
        n = self.train_size
        idx = (
            torch.randint(0, n, (local_batch,), generator=generator)
            if local_batch > n
            else torch.randperm(n, generator=generator)[:local_batch]
        )
        return self.take(idx)

    def take(self, indices: torch.Tensor, split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
        """The samples at ``indices`` of the ``train`` or ``test`` split, stacked."""
        ds = self.train if split == "train" else self.test
        if isinstance(ds, torch.utils.data.TensorDataset):
            x, y = ds.tensors
            return x[indices], y[indices]
        return self.collate([ds[int(i)] for i in indices])


def epoch_order(seed: int, epoch: int, dataset_size: int) -> torch.Tensor:
    """The order of the training samples in ``epoch``: a permutation drawn from (``seed``,
    ``epoch``) alone, so that a resumed run, another launcher or a hand-written loop
    (``examples/own_loop.py``) sees exactly the batches of an uninterrupted run.  Step ``i``
    takes global batch ``i`` of it (``B`` samples from ``i * B``), rank ``r`` its ``r``-th slice."""
    return torch.randperm(dataset_size, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))


class SampleView(torch.utils.data.Dataset):
    """One split of an image set read from disk, as normalised tensors.

    ``view[i]`` is sample ``i`` as evaluation sees it (never augmented);
    ``view[(epoch, i)]`` is sample ``i`` as training epoch ``epoch`` sees it (augmented when
    ``augment``, from (seed, epoch, i) alone).  ``base[i]`` must give ``(C x H x W tensor in
    [0, 1], label)``; normalisation comes after augmentation, so the padding is black.

    ``raw``: a user's set (``data.factory``), whose samples are given as ``base[i]`` returns
    them, for training and evaluation alike (its own transforms, any kind of target); only
    the key is read the same way, so it goes through the same loader path.
    """

    def __init__(
        self,
        base: torch.utils.data.Dataset,
        mean: tuple[float, ...] | None = None,
        std: tuple[float, ...] | None = None,
        augment: bool = False,
        flip: bool = True,
        seed: int = 0,
        raw: bool = False,
    ):
        if raw and (augment or mean is not None):
            raise ValueError("a raw view neither augments nor normalises its samples")
        self.base, self.augment, self.flip, self.seed, self.raw = base, augment, flip, seed, raw
        self.mean = None if mean is None else torch.tensor(mean, dtype=torch.float32).reshape(-1, 1, 1)
        self.std = None if std is None else torch.tensor(std, dtype=torch.float32).reshape(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, key: int | tuple[int, int]) -> Any:
        epoch, index = key if isinstance(key, tuple) else (None, key)
        if self.raw:
            return self.base[int(index)]
        x, y = self.base[int(index)]
        if self.augment and epoch is not None:
            x = augment_image(x, sample_key(self.seed, int(epoch), int(index)), flip=self.flip)
        if self.mean is not None:
            x = (x - self.mean) / self.std
        return x, int(y)


class _Splits(torch.utils.data.Dataset):
    """Both splits behind one key ``(split, item)`` (0: train, 1: test), so one pool of
    loader workers serves training, profiling and evaluation."""

    def __init__(self, train: torch.utils.data.Dataset, test: torch.utils.data.Dataset):
        self.splits = (train, test)

    def __len__(self) -> int:
        return len(self.splits[0])  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, Any]) -> Any:
        return self.splits[key[0]][key[1]]


class _Plan(torch.utils.data.Sampler):
    """The loader's batch sampler: the key lists of the current stream, set before each
    iteration (iterated in the training process, so it can change between iterations of a
    loader with persistent workers)."""

    def __init__(self) -> None:
        self.batches: Iterable[list] = ()

    def __iter__(self) -> Iterator[list]:
        return iter(self.batches)


# --------------------------------------------------------------------------- the path
class DataPath:
    """One rank's batches of ``data`` on ``device``.

    Parameters
    ----------
    data : the job's :class:`Dataset`
    device : where batches go (``non_blocking`` copies from pinned memory on CUDA)
    workers : loader worker processes (default ``data.loader_workers``); ignored, as 0, for
        in-memory sets
    pin_memory : pin batches before the copy (default: on CUDA)
    prefetch_factor : batches each worker prepares ahead
    """

    def __init__(
        self,
        data: Dataset,
        device: torch.device | str,
        workers: int | None = None,
        pin_memory: bool | None = None,
        prefetch_factor: int = 2,
    ):
        self.device = torch.device(device)
        self.in_memory = data.in_memory
        # the splits, not the data set: the data set keeps its path, and no cycle delays the
        # workers' end until a garbage collection
        self._train, self._test = data.train, data.test
        workers = data.loader_workers if workers is None else workers
        if self.in_memory:
            workers = 0
        if workers > 0 and multiprocessing.current_process().daemon:
            warnings.warn(
                "this process is daemonic and cannot start DataLoader workers; the data is read in "
                "this process instead (same batches, slower)",
                RuntimeWarning,
                stacklevel=2,
            )
            workers = 0
        self.workers = workers
        self.pin_memory = self.device.type == "cuda" if pin_memory is None else pin_memory
        self.prefetch_factor = prefetch_factor
        self._splits = _Splits(self._train, self._test)
        self._collate = data.collate_fn or torch.utils.data.default_collate
        self._plan = _Plan()
        self._loader: torch.utils.data.DataLoader | None = None
        self._stream = 0  # number of the current stream; an older one stops

    # ------------------------------------------------------------------ streams
    def epoch_batches(
        self, epoch: int, perm: torch.Tensor, global_batch: int, rank: int, local_batch: int, n_steps: int
    ) -> Iterator[Batch]:
        """The ``n_steps`` training batches of ``epoch`` for ``rank``: step ``i`` is
        ``perm[i * global_batch + rank * local_batch:][:local_batch]``."""
        if n_steps > 0 and (n_steps - 1) * global_batch + (rank + 1) * local_batch > len(perm):
            raise ValueError(
                f"{n_steps} steps of global batch {global_batch} need more than the {len(perm)} "
                "samples of the permutation"
            )

        def chunks() -> Iterator[tuple[int, torch.Tensor]]:
            for i in range(n_steps):
                start = i * global_batch + rank * local_batch
                yield epoch, perm[start : start + local_batch]

        return self._batches(0, chunks())

    def random_batches(self, local_batch: int, generator: torch.Generator) -> Iterator[Batch]:
        """An endless stream of random training batches of ``local_batch`` (profiling):
        consecutive slices of permutations drawn from ``generator``, as an epoch takes
        them, or draws with replacement when ``local_batch`` exceeds the set.  The
        permutation's number stands for the epoch in augmentation."""
        n = len(self._train)  # type: ignore[arg-type]

        def chunks() -> Iterator[tuple[int, torch.Tensor]]:
            rounds = 0
            while True:
                if local_batch > n:
                    yield rounds, torch.randint(0, n, (local_batch,), generator=generator)
                else:
                    perm = torch.randperm(n, generator=generator)
                    for s in range(n // local_batch):
                        yield rounds, perm[s * local_batch : (s + 1) * local_batch]
                rounds += 1

        return self._batches(0, chunks())

    def eval_batches(self, rank: int, world: int, eval_batch: int) -> Iterator[Batch]:
        """The test split's samples ``rank, rank + world, ...`` in chunks of ``eval_batch``
        (never augmented)."""
        idx = torch.arange(rank, len(self._test), world)  # type: ignore[arg-type]
        return self._batches(1, ((None, c) for c in torch.split(idx, eval_batch)))

    # ------------------------------------------------------------------ machinery
    def _batches(self, split: int, chunks: Iterator[tuple[int | None, torch.Tensor]]) -> Iterator[Batch]:
        """Batches of ``split`` for chunks of (epoch or None, sample indices)."""
        self._stream += 1
        if self.in_memory:
            return self._tensor_batches(self._stream, split, chunks)
        keys = ([(split, i if e is None else (e, i)) for i in c.tolist()] for e, c in chunks)
        if self.workers == 0:
            return self._in_process(self._stream, keys)
        return self._from_loader(self._stream, keys)

    def _tensor_batches(self, stream: int, split: int, chunks: Iterator) -> Iterator[Batch]:
        x_all, y_all = (self._train if split == 0 else self._test).tensors  # type: ignore[attr-defined]
        for _, idx in chunks:
            self._check(stream)
            yield self._to_device(x_all[idx], y_all[idx])

    def _in_process(self, stream: int, keys: Iterator[list]) -> Iterator[Batch]:
        for ks in keys:
            self._check(stream)
            x, y = self._collate([self._splits[k] for k in ks])
            yield self._to_device(x, y)

    def _from_loader(self, stream: int, keys: Iterator[list]) -> Iterator[Batch]:
        self._check(stream)
        self._plan.batches = keys
        it = iter(self._ensure_loader())  # a new iteration: the loader's previous one ends here
        while True:
            self._check(stream)
            try:
                x, y = next(it)
            except StopIteration:
                return
            yield self._to_device(x, y)

    def _ensure_loader(self) -> torch.utils.data.DataLoader:
        if self._loader is None:
            self._loader = torch.utils.data.DataLoader(
                self._splits,
                batch_sampler=self._plan,
                collate_fn=self._collate,
                num_workers=self.workers,
                pin_memory=self.pin_memory,
                persistent_workers=True,
                prefetch_factor=self.prefetch_factor,
                worker_init_fn=_worker_init,
                multiprocessing_context=_WORKER_START,
                # the loader's own generator: drawing its base seed must not move the global RNG
                generator=torch.Generator().manual_seed(0),
            )
        return self._loader

    def _check(self, stream: int) -> None:
        if stream != self._stream:
            raise RuntimeError("this batch stream was replaced by a newer one on the same DataPath")

    def _to_device(self, x: torch.Tensor, y: torch.Tensor) -> Batch:
        if self.device.type == "cpu":
            return x, y
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the loader's live worker processes (empty when none started)."""
        it = getattr(self._loader, "_iterator", None)
        return [w.pid for w in getattr(it, "_workers", []) if w.is_alive()]

    def close(self) -> None:
        """End the loader's worker processes (a later stream starts new ones)."""
        self._stream += 1
        loader, self._loader = self._loader, None
        it = getattr(loader, "_iterator", None)
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
        self._plan.batches = ()

    def __enter__(self) -> DataPath:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _worker_init(worker_id: int) -> None:  # noqa: ARG001
    """A loader worker ignores SIGINT: Ctrl-C reaches the whole process group, and the rank
    decides when to stop (at a step boundary) and ends its workers itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def data_path(data: Dataset, device: torch.device | str) -> DataPath:
    """The :class:`DataPath` of ``data`` on ``device``, made once and kept on ``data``
    (so training and evaluation share one pool of loader workers)."""
    device = torch.device(device)
    path = data._path
    if path is None or path.device != device:
        if path is not None:
            path.close()
        path = data._path = DataPath(data, device)
    return path


def epoch_batches(
    data: Dataset,
    epoch: int,
    perm: torch.Tensor,
    global_batch: int,
    rank: int,
    local_batch: int,
    n_steps: int,
    device: torch.device | str,
) -> Iterator[Batch]:
    """:meth:`DataPath.epoch_batches` on ``data``'s path."""
    return data_path(data, device).epoch_batches(epoch, perm, global_batch, rank, local_batch, n_steps)


def random_batches(
    data: Dataset, local_batch: int, generator: torch.Generator, device: torch.device | str
) -> Iterator[Batch]:
    """:meth:`DataPath.random_batches` on ``data``'s path."""
    return data_path(data, device).random_batches(local_batch, generator)


def eval_batches(data: Dataset, rank: int, world: int, eval_batch: int, device: torch.device | str) -> Iterator[Batch]:
    """:meth:`DataPath.eval_batches` on ``data``'s path."""
    return data_path(data, device).eval_batches(rank, world, eval_batch)
