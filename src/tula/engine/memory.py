"""Memory model (Eq. 3, §III-A1): peak memory of one training step as a function of the
local batch, and the largest local batch that fits a budget.

    M_total(b) = M_param + M_grad + M_opt + M_buffers + M_other  +  b * (m_act + m_batch)

The static part is read from the model and optimiser; the per-sample part is measured
from real training steps at two small local batches (after a first step, so that the
lazily created optimiser state exists).  Measured peaks come from torch's MemTracker on
CPU and ``torch.cuda.max_memory_allocated`` on CUDA, the same measure the profiler uses.

Under ``search.enforce_memory_cap`` (CPU) the budget is enforced on a worker's *address
space* (RLIMIT_AS) beyond its size after set-up, and address space holds more than
tensors: oneDNN's JIT-compiled kernels and primitives for every batch shape the process
has run (several MiB per shape), the allocator's retained heap, thread stacks.  Tensor
accounting never sees them, so the probe measures them apart
(``address_space_overhead_bytes``) and :meth:`MemoryModel.max_local_batch` keeps room
for them.  Out-of-memory is recognised from structured evidence (:func:`failure_cause`,
:func:`run_probe_step`), never from an error message.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import gc
import math
import resource
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Literal

import torch
from torch import nn

from tula.core.memory_model import MemoryModel  # noqa: F401 (the model lives apart, without torch)


def is_out_of_memory(err: BaseException) -> bool:
    """True for CUDA OOM, the CPU allocator's failure under an address-space cap, and MemoryError.

    Kept for callers that only hold an error (or its text): the structured evidence of
    :func:`failure_cause` (this process's cap read from its rlimit), and failing that the
    CPU allocator's words.  New code should call :func:`failure_cause` where the exception
    is caught, or run the step through :func:`run_probe_step`."""
    if failure_cause(err, memory_capped=address_space_capped()) == "oom":
        return True
    msg = str(err).lower()
    return isinstance(err, RuntimeError) and (
        "can't allocate memory" in msg or "out of memory" in msg or "cannot allocate memory" in msg
    )


# --------------------------------------------------------------------------- out-of-memory evidence
CUDA_ERROR_MEMORY_ALLOCATION = 2  # cudaErrorMemoryAllocation, carried by torch.AcceleratorError.error_code
#: how torch reports oneDNN failing to create a primitive (its JIT kernel or scratchpad); under an
#: address-space cap that is oneDNN's out-of-memory, whose errno it does not always leave behind
ONEDNN_PRIMITIVE_FAILED = "could not create a primitive"
#: how torch reports a Python exception raised in a future's callback (a DDP communication hook's,
#: run on gloo's thread): a RuntimeError whose text begins so and then names the exception's type
FUTURE_CALLBACK_FAILED = "Got the following error when running the callback: "


@functools.lru_cache(maxsize=1)
def _errno_location() -> Callable[[], ctypes._Pointer[ctypes.c_int]] | None:
    """libc's per-thread errno cell (glibc ``__errno_location``), or None elsewhere."""
    try:
        fn = ctypes.CDLL(None).__errno_location
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.POINTER(ctypes.c_int), []
    return fn


def _errno() -> int | None:
    loc = _errno_location()
    return None if loc is None else int(loc()[0])


def clear_errno() -> None:
    """Set this thread's C ``errno`` to 0, so that an ENOMEM read later comes from what ran since."""
    loc = _errno_location()
    if loc is not None:
        loc()[0] = 0


#: the attribute :func:`errno_evidence` sets on an exception: the C ``errno`` read as it surfaced
ERRNO_AT_FAILURE = "tula_errno_at_failure"


@contextlib.contextmanager
def errno_evidence() -> Iterator[None]:
    """Around work whose failure :func:`failure_cause` may judge later, after the exception has
    run through ``finally`` blocks, context managers and a launcher's reporting, any of which may
    set the C ``errno`` again (a ``stat`` of a missing file, a lazy import): errno is cleared
    first, and an exception leaving the block carries errno as it was when it surfaced
    (:data:`ERRNO_AT_FAILURE`), which :func:`failure_cause` reads before the current errno."""
    clear_errno()
    try:
        yield
    except Exception as err:
        if getattr(err, ERRNO_AT_FAILURE, None) is None:
            with contextlib.suppress(AttributeError, TypeError):  # an exception that takes no attributes
                setattr(err, ERRNO_AT_FAILURE, _errno())
        raise


def failure_cause(err: BaseException, *, memory_capped: bool) -> str | None:
    """``"oom"`` when ``err`` is a failure for lack of memory, else None.

    The evidence is structured, never the message: the exception's type
    (``torch.OutOfMemoryError`` -- CUDA's caching allocator --, ``MemoryError``, a
    ``torch.AcceleratorError`` carrying ``cudaErrorMemoryAllocation``); and, with
    ``memory_capped`` (an address-space cap is in force), the kernel's own reason: this
    thread's C ``errno`` is ENOMEM.  Under RLIMIT_AS every native allocation path fails
    that way -- the CPU allocator's ``posix_memalign`` ("can't allocate memory"), oneDNN's
    ``mmap`` of JIT code and scratchpads ("could not create a primitive"), ``std::bad_alloc``,
    thread stacks ("can't start new thread") -- whatever the message says.  errno is the one
    ``err`` carries from :func:`errno_evidence` (the training step runs in it), else errno
    now: then call this in the ``except`` clause that caught ``err``, with errno cleared
    (:func:`clear_errno`) before the work that failed; :func:`run_probe_step` does both,
    and where a failure under the cap carries no evidence it tries the step again with the
    cap lifted.

    One message is evidence, under a cap only: oneDNN's :data:`ONEDNN_PRIMITIVE_FAILED`
    (a ``RuntimeError``).  oneDNN does not always leave ENOMEM behind (it reads the
    machine's files as it goes), and a poisoned thread fails the same way with the cap
    lifted: a 2-rank Dask world under a 28 MiB cap had one rank fail so, in a probe or in a
    training step after its probe, raised as a crash while the other waited out the
    process group's timeout: 1 run in 35 of tests/test_dask.py's capped fallback once the
    probe's buffer broadcast was gone (2026-11-26).  And one more, under a cap only: a
    ``MemoryError`` raised in a future's callback (a communication hook's, on gloo's thread, whose
    errno is not this thread's), which torch re-raises as a ``RuntimeError`` whose text begins
    with :data:`FUTURE_CALLBACK_FAILED` and the type's name: tests/test_train.py's capped
    fallback under an 8 MiB cap was reported as a crash so, once, on two busy cores
    (2026-11-29).  Without a cap a message is a crash, as any other."""
    if isinstance(err, (torch.OutOfMemoryError, MemoryError)):
        return "oom"
    accel = getattr(torch, "AcceleratorError", None)
    if (
        accel is not None
        and isinstance(err, accel)
        and getattr(err, "error_code", None) == CUDA_ERROR_MEMORY_ALLOCATION
    ):
        return "oom"
    if memory_capped:
        code = getattr(err, ERRNO_AT_FAILURE, None)
        if (_errno() if code is None else code) == errno.ENOMEM:
            return "oom"
        if isinstance(err, RuntimeError) and str(err).startswith(ONEDNN_PRIMITIVE_FAILED):
            return "oom"
        if isinstance(err, RuntimeError) and str(err).startswith(FUTURE_CALLBACK_FAILED + "MemoryError"):
            return "oom"
    return None


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:200] if text else ''}"


def run_probe_step(step: Callable[[], None], *, memory_capped: bool | None = None) -> tuple[bool, str]:
    """Run one probe step (no collective inside); ``(True, "")`` when it ran, ``(False, note)``
    when it failed for lack of memory (the note: the error's type and first line); any
    other failure is raised.

    ``memory_capped``: whether an address-space cap is in force (None: read this process's
    RLIMIT_AS).  errno is cleared first, so :func:`failure_cause` judges by what this step
    did: the exception's type, or under a cap the kernel's ENOMEM -- which covers oneDNN's
    "could not create a primitive" as well as the CPU allocator's error.  Under a cap, a
    failure with neither is put to a real test: the soft RLIMIT_AS is lifted (to the hard
    limit, or this process's size plus half the memory the machine has available, whichever
    is lower), the same step runs again, and the cap is restored; the step ran out of
    memory if it now runs or fails again for lack of memory, else its first error is raised.
    (The retry cannot replace errno: once oneDNN fails to map a JIT kernel, it fails to
    create new kernels on that thread even with memory to spare.)"""
    capped = address_space_capped() if memory_capped is None else memory_capped
    clear_errno()
    try:
        step()
        return True, ""
    except Exception as err:  # noqa: BLE001 - classified below, raised when not memory
        cause = failure_cause(err, memory_capped=capped)
        if cause == "oom":
            return False, _first_line(err)
        if not capped:
            raise
        first, note = err, _first_line(err)
        traceback.clear_frames(err.__traceback__)  # let the failed step's tensors go
    # under the cap with no evidence either way (a library may have clobbered errno):
    # does the same step run with the cap lifted?
    gc.collect()
    with _lifted_address_space_cap():
        clear_errno()
        try:
            step()
        except Exception as again:  # noqa: BLE001
            if failure_cause(again, memory_capped=True) != "oom":
                raise first from None
            return False, f"{note} (and again with the address-space cap lifted to what this machine has free)"
        finally:
            gc.collect()
    return False, f"{note} (the same step runs with the address-space cap lifted)"


# --------------------------------------------------------------------------- address space
def _meminfo_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None


@dataclass(frozen=True)
class AddressSpace:
    """This process's mappings (Linux ``/proc/self/maps``).  ``total_bytes`` is what
    RLIMIT_AS counts; ``reserved_bytes`` the inaccessible (PROT_NONE) part of it:
    reservations such as glibc's per-thread malloc arenas, which the allocator does
    without when a cap refuses them, so a budget is charged only ``used_bytes``."""

    total_bytes: int
    reserved_bytes: int

    @property
    def used_bytes(self) -> int:
        return self.total_bytes - self.reserved_bytes

    @classmethod
    def now(cls) -> AddressSpace:
        total = reserved = 0
        with open("/proc/self/maps") as fh:
            for line in fh:
                span, perms = line.split(maxsplit=2)[:2]
                lo, hi = span.split("-")
                size = int(hi, 16) - int(lo, 16)
                total += size
                if perms.startswith("---"):
                    reserved += size
        return cls(total, reserved)


def address_space_capped() -> bool:
    """Whether this process runs under a soft address-space limit (RLIMIT_AS)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return soft != resource.RLIM_INFINITY


class _lifted_address_space_cap:
    """Raise the soft RLIMIT_AS for a while (to the hard limit, or this process's size plus
    half the machine's available memory, whichever is lower), then put it back -- never
    below what the process maps by then, so that it can go on to report."""

    def __enter__(self) -> _lifted_address_space_cap:
        self.soft, self.hard = resource.getrlimit(resource.RLIMIT_AS)
        room = _meminfo_available_bytes()
        lifted = self.hard if room is None else AddressSpace.now().total_bytes + room // 2
        if self.hard != resource.RLIM_INFINITY:
            lifted = min(lifted, self.hard)
        resource.setrlimit(resource.RLIMIT_AS, (max(lifted, self.soft), self.hard))
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        if self.soft != resource.RLIM_INFINITY:
            restored = max(self.soft, AddressSpace.now().total_bytes)
            resource.setrlimit(resource.RLIMIT_AS, (restored, self.hard))
        else:
            resource.setrlimit(resource.RLIMIT_AS, (self.soft, self.hard))
        return False


M_ARENA_MAX = -8  # glibc mallopt parameters
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: heap kept free for the process's other threads under a cap (:func:`reserve_heap`)
OTHER_THREADS_HEAP_BYTES = 16 * 2**20
#: allocations of this size or more are mapped on their own, below it they come from the heap
MMAP_THRESHOLD_BYTES = 2**20


def reserve_heap(reserve_bytes: int = OTHER_THREADS_HEAP_BYTES) -> None:
    """Grow the heap by ``reserve_bytes`` and keep it free (glibc; elsewhere a no-op), for the
    threads that share the process with a capped rank.  On a Dask worker they are the worker's
    own: its heartbeat packs each message into a fresh 256 KiB buffer, and when a rank's step
    had filled the cap that allocation failed and the worker closed itself -- losing the world
    instead of reporting the step's out-of-memory.  Allocations under
    :data:`MMAP_THRESHOLD_BYTES` are served from the heap (the kept free part first) and freed
    heap is not returned, so the reserve is there under the cap; a tensor of a MiB or more is
    mapped on its own as before."""
    try:
        libc = ctypes.CDLL(None)
        libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
        libc.free.restype, libc.free.argtypes = None, [ctypes.c_void_p]
        libc.mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(MMAP_THRESHOLD_BYTES))
        libc.mallopt(ctypes.c_int(M_TRIM_THRESHOLD), ctypes.c_int(4 * reserve_bytes))
        chunk = MMAP_THRESHOLD_BYTES // 4
        blocks = [libc.malloc(chunk) for _ in range(max(reserve_bytes // chunk, 1))]
        for block in blocks:
            libc.free(block)
    except (OSError, AttributeError):
        pass


#: a rank's heap outside a cap (:func:`steady_heap`): glibc's own ceiling for the threshold it
#: raises by itself, and the trim threshold it pairs with it
STEADY_MMAP_THRESHOLD_BYTES = 32 * 2**20
STEADY_TRIM_THRESHOLD_BYTES = 2 * STEADY_MMAP_THRESHOLD_BYTES


def steady_heap() -> bool:
    """Serve blocks under 32 MiB from the heap and keep up to 64 MiB of it free (glibc; True
    when set, elsewhere a no-op and False), in a fresh rank process, from its start.

    glibc maps each block above its threshold (128 KiB at first) afresh and unmaps it when it
    is freed, so every use of a large buffer pays its page faults; it raises the threshold by
    itself only once such a block has been freed.  A step's time then depended on what the
    process had run before: a 1-rank world that had run steps at b = 1024 evaluated the
    same model on MNIST-1D's 800 test samples (one batch of 1024) in 12-14 ms, a fresh
    training process at B = 128 in 20-37 ms, every epoch (2026-11-26, the 2-core VM; #26: the
    profile's run trial measured evaluation at half of what training spent).  This starts
    every rank where glibc would settle after its first large buffer.  A capped world sets
    its own (:func:`reserve_heap`); a Dask worker, which lives on between worlds, is left to
    glibc's own adjustment."""
    try:
        libc = ctypes.CDLL(None)
        ok = libc.mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(STEADY_MMAP_THRESHOLD_BYTES)) == 1
        return ok and libc.mallopt(ctypes.c_int(M_TRIM_THRESHOLD), ctypes.c_int(STEADY_TRIM_THRESHOLD_BYTES)) == 1
    except (OSError, AttributeError):
        return False


def limit_malloc_arenas() -> None:
    """No more glibc malloc arenas (glibc; elsewhere a no-op).  Each new arena reserves 64 MiB
    of address space the first time another thread allocates -- e.g. gloo's thread at the
    first collective on a new group -- which RLIMIT_AS counts in full: under a cap of 64 MiB
    that one reservation took the whole budget.  With one arena, every thread allocates
    from the main heap."""
    try:
        ctypes.CDLL(None).mallopt(ctypes.c_int(M_ARENA_MAX), ctypes.c_int(1))
    except (OSError, AttributeError):
        pass


def start_thread_pools() -> None:
    """Start torch's intra-op (OpenMP) threads now.  They are created at the first parallel
    region, and OpenMP aborts the whole process when it cannot create one, so under an
    address-space cap they must exist before the cap (each reserves a stack: 8 MiB here)."""
    if torch.get_num_threads() > 1:
        x = torch.ones(1 << 17)
        (x * 2).sum()


def measure_step_peak_bytes(
    run_step: Callable[[], None], model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device
) -> int:
    """Peak bytes of tensors alive during ``run_step()`` (parameters and optimiser state included)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        run_step()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device))
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        run_step()
    peaks = tracker.get_tracker_snapshot("peak")
    return int(sum(v["Total"] for v in peaks.values()))


def measure_phase_peaks(
    forward_backward: Callable[[], None],
    update: Callable[[], None],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
) -> tuple[int, int]:
    """Peak bytes of live tensors during ``forward_backward()`` and, separately, during
    ``update()`` (the optimiser step).  They are different curves: the first grows with the
    batch (activations), the second does not (gradients, optimiser state and the update's
    temporaries), and at small batches the second can be the higher one -- a line through
    two whole-step peaks there would miss the activations' growth."""
    return (
        measure_step_peak_bytes(forward_backward, model, optimizer, device),
        measure_step_peak_bytes(update, model, optimizer, device),
    )


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    return int(sum(t.numel() * t.element_size() for t in tensors))


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return tensor_bytes(v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v))


def fit_memory_model(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    sample_bytes: int,
    local_batches: tuple[int, int],
    peaks: tuple[int, int],
    device: torch.device,
    update_peak_bytes: int = 0,
    resident_data_bytes: int = 0,
) -> MemoryModel:
    """Build the model from two measured forward/backward peaks (after the optimiser state
    exists) and the optimiser step's peak; ``resident_data_bytes``: a data set kept on the
    device, inside the measured peaks, counted apart from the workspaces."""
    (b1, b2), (p1, p2) = local_batches, peaks
    if b2 <= b1:
        raise ValueError("memory probe batches must be increasing")
    slope = max((p2 - p1) / (b2 - b1), 0.0)
    intercept = p1 - slope * b1
    params = [p for p in model.parameters()]
    param_bytes = tensor_bytes(params)
    grad_bytes = tensor_bytes(p for p in params if p.requires_grad)
    opt_bytes = optimizer_state_bytes(optimizer)
    buffer_bytes = tensor_bytes(model.buffers())
    static_known = param_bytes + grad_bytes + opt_bytes + buffer_bytes + resident_data_bytes
    per_sample = int(math.ceil(slope))
    return MemoryModel(
        param_bytes=param_bytes,
        grad_bytes=grad_bytes,
        optimizer_state_bytes=opt_bytes,
        buffer_bytes=buffer_bytes,
        other_static_bytes=int(round(intercept)) - static_known,
        activation_bytes_per_sample=per_sample - sample_bytes,
        batch_bytes_per_sample=sample_bytes,
        probe_local_batches=(b1, b2),
        probe_peak_bytes=(int(p1), int(p2)),
        device=device.type,
        update_peak_bytes=int(update_peak_bytes),
        resident_data_bytes=int(resident_data_bytes),
    )


def probe_memory_model(
    measure: Callable[[int], tuple[int, int]],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    sample_bytes: int,
    local_batches: tuple[int, int],
    device: torch.device,
    max_batch: int,
    max_extra_probes: int = 4,
    min_growth: float = 0.02,
    resident_data_bytes: int = 0,
) -> MemoryModel:
    """Fit the memory model from probe steps.  ``measure(b)`` runs one step at local batch
    ``b`` and returns its (forward/backward peak, optimiser-update peak), both including the
    data batch.

    Probing starts at ``local_batches``.  While the forward/backward peak has not grown by
    ``min_growth`` from one probe to the next, the activations are still hidden under a
    batch-independent peak (for a large model under DDP: gradients and their buckets at the
    end of backward), so the batch is doubled, up to ``max_extra_probes`` times and
    ``max_batch``, and once it grows one probe more is taken.  The line is fitted to the
    last two probes; the update's peak and the earlier probes' peaks are a floor under it."""
    batches = list(local_batches)
    peaks = {b: measure(b) for b in batches}
    extra = 0
    while (
        extra < max_extra_probes
        and 2 * batches[-1] <= max_batch
        and peaks[batches[-1]][0] < (1.0 + min_growth) * peaks[batches[-2]][0]
    ):
        batches.append(2 * batches[-1])
        peaks[batches[-1]] = measure(batches[-1])
        extra += 1
    if extra and 2 * batches[-1] <= max_batch:
        # the peak has just started to grow: the probe before may still sit on the floor,
        # so fit the line through this probe and one more
        batches.append(2 * batches[-1])
        peaks[batches[-1]] = measure(batches[-1])
    b1, b2 = batches[-2], batches[-1]
    floor = max([up for _, up in peaks.values()] + [peaks[b][0] for b in batches[:-2]])
    return fit_memory_model(
        model,
        optimizer,
        sample_bytes,
        (b1, b2),
        (peaks[b1][0], peaks[b2][0]),
        device,
        update_peak_bytes=floor,
        resident_data_bytes=resident_data_bytes,
    )


def with_address_space_overhead(mm: MemoryModel, since: AddressSpace) -> MemoryModel:
    """``mm`` with its address-space overhead measured, for a budget enforced as an
    address-space cap: what this process has mapped since ``since`` (the end of set-up,
    before the probe's first step) beyond the probe's largest tensor peak -- oneDNN's
    one-time set-up and its kernels for each batch shape the probe ran (they stay cached:
    several MiB per shape), the heap the allocator kept, threads started -- plus one more
    batch shape's kernels (a trial or a training run at a new batch), estimated as half of
    it, as the probe runs at least two shapes.  Inaccessible reservations (malloc arenas)
    are not counted: under a cap the allocator does without them."""
    grown = AddressSpace.now().used_bytes - since.used_bytes
    tensors = max(*mm.probe_peak_bytes, mm.update_peak_bytes)
    probed = max(int(grown - tensors), 0)
    return replace(mm, address_space_overhead_bytes=probed + probed // 2)


def cap_address_space(budget_bytes: int, since: AddressSpace | None = None) -> int:
    """Cap this process's address space (RLIMIT_AS, Linux) so that it may use ``budget_bytes``
    more than it used at ``since`` (default: now), and exceeding that fails for real in the
    allocator; returns the cap.

    Pass the :class:`AddressSpace` taken at the end of set-up to charge the budget with
    everything mapped since (the memory probe's kernels and heap), so that every world is
    capped alike.  First torch's threads are started (:func:`start_thread_pools`), malloc
    is kept from reserving new arenas (:func:`limit_malloc_arenas`), and heap is kept free
    for the process's other threads (:func:`reserve_heap`)."""
    limit_malloc_arenas()
    start_thread_pools()
    reserve_heap()
    now = AddressSpace.now()
    spent = 0 if since is None else max(now.used_bytes - since.used_bytes, 0)
    cap = now.total_bytes + max(budget_bytes - spent, 0)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    return cap
