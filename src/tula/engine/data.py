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

**On CUDA** the batch never makes the GPU wait (``data.prefetch``, ``data.device_resident_share``):

* an in-memory set whose two splits fit within ``device_resident_share`` of the memory
  budget is copied to the device once and stays there (:func:`resident_fits`); a batch is
  then one indexing on the device (the indices are copied from pinned memory), and the
  memory model counts the resident bytes (``MemoryModel.resident_data_bytes``);
* any other set is prefetched: a thread of the rank (:class:`_Prefetch`) prepares the next
  batch while the step computes -- gathered from the tensors straight into pinned memory, or
  taken from the loader (which pins) -- and copies it on a side CUDA stream; the step's
  stream waits for the copy's event and the tensors record that stream, so the copy
  overlaps the previous step's compute and no memory is reused early.

On a CPU nothing changes unless ``data.prefetch`` is ``on`` (the thread then prepares the
next batch on the host).  The profile reads its batches through the same path, so it times
exactly what training runs.  An exception in the thread (a data factory's ``__getitem__``)
is raised again by the rank's ``next()``, as the same exception.

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

import contextlib
import multiprocessing
import queue
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from tula.engine.batch import as_pair, pin, record_stream, to_device

Batch = tuple[Any, Any]
"""(inputs, targets): tensors, or a dict batch's mapping of tensors and ``None`` (:mod:`tula.engine.batch`)."""

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
    prefetch: str = "auto"  # data.prefetch: auto (on for CUDA) | on | off
    resident_share: float = 0.25  # data.device_resident_share
    memory_budget_bytes: int | None = None  # search.memory_budget_bytes (None: the GPU's memory)
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
    def tensor_bytes(self) -> int:
        """Bytes of both splits' tensors (in-memory sets; 0 for the others)."""
        if not self.in_memory:
            return 0
        return sum(
            t.numel() * t.element_size()
            for split in (self.train, self.test)
            for t in split.tensors  # type: ignore[attr-defined]
        )

    @property
    def train_size(self) -> int:
        return len(self.train)  # type: ignore[arg-type]

    @property
    def test_size(self) -> int:
        return len(self.test)  # type: ignore[arg-type]

    def batch(self, local_batch: int, generator: torch.Generator) -> Batch:
        """A random batch of ``local_batch`` training samples (with replacement past the set's size)."""
        n = self.train_size
        idx = (
            torch.randint(0, n, (local_batch,), generator=generator)
            if local_batch > n
            else torch.randperm(n, generator=generator)[:local_batch]
        )
        return self.take(idx)

    def take(self, indices: torch.Tensor, split: str = "train") -> Batch:
        """The samples at ``indices`` of the ``train`` or ``test`` split, stacked (a set of dict
        samples: the collated dict and ``None``, :func:`tula.engine.batch.as_pair`)."""
        ds = self.train if split == "train" else self.test
        if isinstance(ds, torch.utils.data.TensorDataset):
            x, y = ds.tensors
            return x[indices], y[indices]
        return as_pair(self.collate([ds[int(i)] for i in indices]))


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
def resident_fits(data_bytes: int, budget_bytes: int | None, share: float) -> bool:
    """Whether an in-memory set of ``data_bytes`` (both splits) stays on the device: at most
    ``share`` of the memory budget.  The one rule profiling, training and the memory model
    read.  No budget (a CPU without ``search.memory_budget_bytes``): no."""
    return budget_bytes is not None and data_bytes > 0 and data_bytes <= share * budget_bytes


class DataPath:
    """One rank's batches of ``data`` on ``device``.

    Parameters
    ----------
    data : the job's :class:`Dataset`
    device : where batches go
    workers : loader worker processes (default ``data.loader_workers``); ignored, as 0, for
        in-memory sets
    pin_memory : pin batches before the copy (default: on CUDA)
    prefetch_factor : batches each loader worker prepares ahead
    prefetch : prepare the next batch in a thread (default ``data.prefetch``: ``auto`` is on
        for CUDA, off on a CPU); not used for a set resident on the device
    resident : keep an in-memory set on the device (default: :func:`resident_fits` with
        ``data.resident_share`` of ``data.memory_budget_bytes``, else of the GPU's memory;
        never on a CPU)
    """

    def __init__(
        self,
        data: Dataset,
        device: torch.device | str,
        workers: int | None = None,
        pin_memory: bool | None = None,
        prefetch_factor: int = 2,
        prefetch: bool | None = None,
        resident: bool | None = None,
    ):
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
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
        on_cuda = self.device.type == "cuda"
        self.pin_memory = on_cuda if pin_memory is None else pin_memory
        self.prefetch_factor = prefetch_factor
        if resident is None:
            budget = data.memory_budget_bytes
            if budget is None and on_cuda:
                budget = int(torch.cuda.get_device_properties(self.device).total_memory)
            resident = on_cuda and self.in_memory and resident_fits(data.tensor_bytes, budget, data.resident_share)
        self.resident_bytes = data.tensor_bytes if resident else 0
        self._resident: tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]] | None = None
        if resident:
            self._resident = tuple(  # type: ignore[assignment]
                tuple(t.to(self.device) for t in split.tensors)  # type: ignore[attr-defined]
                for split in (self._train, self._test)
            )
        if prefetch is None:
            prefetch = data.prefetch == "on" or (data.prefetch == "auto" and on_cuda)
        self.prefetch = bool(prefetch) and not resident
        self._splits = _Splits(self._train, self._test)
        self._collate = data.collate_fn or torch.utils.data.default_collate
        self._plan = _Plan()
        self._loader: torch.utils.data.DataLoader | None = None
        self._stream = 0  # number of the current stream; an older one stops
        self._ahead: _Prefetch | None = None  # the current stream's prefetching thread
        self._copy_stream = torch.cuda.Stream(self.device) if on_cuda and self.prefetch else None

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
        self._end_prefetch()
        self._stream += 1
        if self._resident is not None:
            return self._resident_batches(self._stream, split, chunks)
        if self.in_memory:
            host = self._tensor_batches(self._stream, split, chunks)
        else:
            keys = ([(split, i if e is None else (e, i)) for i in c.tolist()] for e, c in chunks)
            host = self._in_process(self._stream, keys) if self.workers == 0 else self._from_loader(self._stream, keys)
        if not self.prefetch:
            return (self._to_device(x, y) for x, y in host)
        self._ahead = _Prefetch(host, self.device, self._copy_stream, self._stream)
        return self._ahead

    def _resident_batches(self, stream: int, split: int, chunks: Iterator) -> Iterator[Batch]:
        assert self._resident is not None
        x_all, y_all = self._resident[split]
        for _, idx in chunks:
            self._check(stream)
            if self.device.type == "cuda":  # from pinned memory: a copy from pageable memory may wait for the stream
                idx = idx.pin_memory().to(self.device, non_blocking=True)
            yield x_all[idx], y_all[idx]

    def _tensor_batches(self, stream: int, split: int, chunks: Iterator) -> Iterator[Batch]:
        x_all, y_all = (self._train if split == 0 else self._test).tensors  # type: ignore[attr-defined]
        pin = self.pin_memory and self.prefetch  # gathered straight into pinned memory, for the side stream
        for _, idx in chunks:
            self._check(stream)
            if pin:
                x = torch.empty((len(idx), *x_all.shape[1:]), dtype=x_all.dtype, pin_memory=True)
                y = torch.empty((len(idx), *y_all.shape[1:]), dtype=y_all.dtype, pin_memory=True)
                yield torch.index_select(x_all, 0, idx, out=x), torch.index_select(y_all, 0, idx, out=y)
            else:
                yield x_all[idx], y_all[idx]

    def _in_process(self, stream: int, keys: Iterator[list]) -> Iterator[Batch]:
        pinned = self.pin_memory and self.prefetch  # pinned in the thread, for the side stream's copy
        for ks in keys:
            self._check(stream)
            x, y = as_pair(self._collate([self._splits[k] for k in ks]))
            yield (pin(x), pin(y)) if pinned else (x, y)

    def _from_loader(self, stream: int, keys: Iterator[list]) -> Iterator[Batch]:
        """The loader's batches of ``keys``.  Its iteration starts here, in the calling thread
        (a first one forks the worker processes: never from the prefetching thread)."""
        self._plan.batches = keys
        it = iter(self._ensure_loader())  # a new iteration: the loader's previous one ends here
        return self._loader_batches(stream, it)

    def _loader_batches(self, stream: int, it: Iterator) -> Iterator[Batch]:
        while True:
            self._check(stream)
            try:
                x, y = as_pair(next(it))
            except StopIteration:
                return
            yield x, y

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
            raise RuntimeError(REPLACED)

    def _to_device(self, x: Any, y: Any) -> Batch:
        return to_device(x, self.device), to_device(y, self.device)

    def _end_prefetch(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead.close()

    @property
    def prefetch_thread(self) -> threading.Thread | None:
        """The current stream's prefetching thread (None when batches are made on demand)."""
        return None if self._ahead is None else self._ahead.thread

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the loader's live worker processes (empty when none started)."""
        it = getattr(self._loader, "_iterator", None)
        return [w.pid for w in getattr(it, "_workers", []) if w.is_alive()]

    def close(self) -> None:
        """End the prefetching thread and the loader's worker processes (a later stream
        starts new ones)."""
        self._end_prefetch()
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


REPLACED = "this batch stream was replaced by a newer one on the same DataPath"
_END = object()


class _Failure:
    """An exception raised in the prefetching thread, carried to the rank's ``next()``."""

    def __init__(self, err: BaseException):
        self.err = err


class _Prefetch:
    """The batches of ``host`` (an iterator of host batches), one ahead: a thread takes the
    next host batch while the rank's step computes and, on CUDA, copies it to ``device`` on
    ``copy_stream``, recording an event; :meth:`__next__` makes the current stream wait for
    that event and has the tensors record the current stream (the allocator then keeps their
    memory until the step that reads them has run).  At most one batch waits in the queue
    (plus the one being prepared)."""

    JOIN_S = 10.0  # how long close() waits for the thread to leave a slow ``__getitem__``

    def __init__(
        self,
        host: Iterator[Batch],
        device: torch.device,
        copy_stream: Any,
        stream_id: int,
    ):
        self.device, self.copy_stream, self.stream_id = device, copy_stream, stream_id
        self._queue: queue.Queue = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._closed = False
        self.thread = threading.Thread(target=self._run, args=(host,), name=f"tula-prefetch-{stream_id}", daemon=True)
        self.thread.start()

    def _run(self, host: Iterator[Batch]) -> None:
        try:
            if self.copy_stream is not None:
                torch.cuda.set_device(self.device)
            for x, y in host:
                if self._stop.is_set():
                    return
                event = None
                if self.copy_stream is not None:
                    with torch.cuda.stream(self.copy_stream):
                        x, y = to_device(x, self.device), to_device(y, self.device)
                        event = torch.cuda.Event()
                        event.record(self.copy_stream)
                if not self._put((x, y, event)):
                    return
            self._put(_END)
        except BaseException as err:  # noqa: BLE001 - raised again by the rank's next()
            self._put(_Failure(err))

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> _Prefetch:
        return self

    def __next__(self) -> Batch:
        if self._closed:
            raise RuntimeError(REPLACED)
        item = self._queue.get()
        if item is _END:
            self._closed = True
            raise StopIteration
        if isinstance(item, _Failure):
            self._closed = True
            raise item.err
        x, y, event = item
        if event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            record_stream(x, current)
            record_stream(y, current)
        return x, y

    def close(self) -> None:
        """Stop the thread (after the batch it is preparing) and drop what it prepared."""
        self._closed = True
        self._stop.set()
        deadline = time.monotonic() + self.JOIN_S
        while self.thread.is_alive() and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                self._queue.get_nowait()
            self.thread.join(timeout=0.02)
        with contextlib.suppress(queue.Empty):
            self._queue.get_nowait()


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
