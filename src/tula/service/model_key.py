"""The key a fitted model is stored and found under: what decides its parameters.

Two jobs get the same key when profiling them would measure the same thing, so the second
is planned from the first one's fitted models without profiling again.  The key is the
SHA-256 of the canonical JSON of its parts (:func:`model_key`); the parts come either from
a finished profile -- :func:`model_key_parts`, describing where the trials were MEASURED --
or, for a job not yet profiled, from its spec and the launcher's ``facts()``
(:func:`key_parts_for_new_job`).  The two give the same parts for the same model on the
same hardware.

What is in the key, and why:

- ``model``: the model's name and constructor kwargs (they decide the network).
- ``data``: the data set's name and the sample shape the network sees; for sets read from
  disk also ``loader_workers`` and ``augment``, which change the time a step waits for data.
  The set's size, root and seed are not: they change how many steps an epoch has, which the
  planner computes, not the time or memory of one step.
- ``data.prefetch`` (when not ``auto``) and, on CUDA for in-memory sets, ``data.device_resident_share``
  (when not 0.25): they decide the path a step's batch takes.  Whether a set is resident also
  depends on the memory budget, which is not in the key; the stored memory model carries the
  resident bytes it was measured with (``resident_data_bytes``).
- ``optimizer``: its name and, for SGD, whether it keeps a momentum buffer (optimiser state
  is part of the memory model); the LR and weight decay change neither time nor memory.
- ``collective``: the sync term's form is fitted per collective.
- ``device`` and ``hardware``: the device kind, the CPU model or GPU name, and the core count,
  read where the ranks run (``tula.engine.launch.base.host_facts``).
- ``torch``: its version (kernels and DDP change between releases).
- ``cluster``: ``single-host`` for the local launcher and a Dask LocalCluster (ranks meet on
  this machine's loopback); otherwise the scheduler address or jobqueue file, since ranks on
  several hosts sync over a network.
- ``backend``: the process group's back end (gloo on CPU, nccl on GPU, unless the spec says).
- ``threads_per_worker`` (CPU only): the torch threads each rank computed with; a step's
  compute time scales with it.  On a GPU it hardly matters and is left out.
- ``precision``, only when not fp32: the arithmetic of the steps measured.
- ``channels_last``, only when set: the memory format of the model and its inputs (any device).
- ``step``, only when set (``train.step``): the user's own step class, which the profile times.
- ``checkpointing``, only when on: the block classes named (or ``found``: found automatically),
  whose recomputation changes both the peak and the step.
- ``checkpointing_auto``, only when ``auto`` (the same value): the profile measured the plain step
  and the checkpointed one besides, so its models carry the checkpointing effect that those of
  an ``off`` or ``on`` profile do not.
- ``parallelism``, only when not ``ddp`` (``train.parallelism: fsdp``): the profile measured
  sharded steps, whose peak holds a share of the state and whose collectives differ; ``auto``
  has its own value: the profile measured DDP's steps and the sharded one besides, so its models
  carry the sharding effect that those of a ``ddp`` or ``fsdp`` profile do not.
- ``sequence_lengths``, only when given (``search.sequence_lengths``, sorted): models measured
  over several lengths carry terms in B*L and B*L^2 that one length's models do not (unlike
  the rest of the search space, which only chooses which points are measured).
- ``tf32`` (when given, true or false: left out it is torch's defaults) and ``cudnn_benchmark``
  (when true), only on CUDA: they choose other CUDA kernels; on a CPU they change nothing, so
  they stay out of a CPU key.  Left out when off, these knobs
  keep every key written before they existed as it was (so ``KEY_VERSION`` stays).
- ``enforce_memory_cap`` (CPU only): with the address-space cap the memory model includes
  what tensors do not show, so the fitted memory model differs.

Profile settings that are NOT in the key: ``warmup_steps`` and ``timed_steps`` (they decide
how precisely the same quantity -- the median step time after warm-up -- is estimated, not
what is measured; a job that asks for more timed steps than a stored model had still reuses
it, and the models record's ``fit_error`` says how good the fit was),
``memory_probe_batches`` (two points on the same line), ``trial_timeout_s``, the search mode
and the search space (cluster sizes, batch range, memory budget: they choose WHICH points
are measured, not what a point measures; planning at other sizes is what the models are
for).

No torch import here: the service computes keys in its web process.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter

from tula.core.errors import RecordError
from tula.core.records import HostFacts, ProfileRecord
from tula.core.registry import cluster_kind
from tula.core.spec import DataSpec, JobSpec, spec_from_dict

#: bump when the parts change meaning, so old keys never match new ones
KEY_VERSION = 1

#: data sets read from disk (their loader settings change the time a step waits for data)
DISK_SETS = ("mnist", "fashionmnist", "cifar10", "cifar100", "imagefolder")

#: the sample shape of each data set whose shape the spec does not give (tula.engine.workloads
#: builds them so: checked against load_dataset by tests/test_store.py)
_FIXED_SHAPES = {
    "digits": (1, 8, 8),
    "mnist1d": (1, 40),
    "mnist": (1, 28, 28),
    "fashionmnist": (1, 28, 28),
    "cifar10": (3, 32, 32),
    "cifar100": (3, 32, 32),
}


def sample_shape(data: dict | DataSpec) -> list[int]:
    """The shape of one sample of the data set ``data`` (a checked data spec, or one as a dict) without
    loading it: fixed per set, the spec's ``sample_shape`` for ``synthetic``, and
    3 x ``image_size`` x ``image_size`` (default 64) for ``imagefolder`` (images are read as RGB), and
    ``sequence_length`` for ``text``."""
    d = data if isinstance(data, DataSpec) else DataSpec.model_validate(data)
    if d.name == "synthetic":
        return [int(n) for n in d.sample_shape]
    if d.name == "imagefolder":
        size = d.image_size or 64
        return [3, int(size), int(size)]
    if d.name == "text":
        return [int(d.sequence_length)]
    if d.name not in _FIXED_SHAPES:
        raise ValueError(f"unknown data set {d.name!r}")
    return list(_FIXED_SHAPES[d.name])


def _cluster(where: str) -> str:
    # the kinds whose ranks run on this host ('local', 'dask': a LocalCluster) measure the same machine
    return "single-host" if cluster_kind(where).on_this_host else where


def _json(value: Any) -> Any:
    """A spec's free-form value (a kwargs mapping) as its JSON form, as ``JobSpec.to_dict`` gives it."""
    return TypeAdapter(Any).dump_python(value, mode="json")


def _parts(spec: dict | JobSpec, *, device: str, facts: HostFacts, shape: list[int], threads: int | None) -> dict:
    job = spec if isinstance(spec, JobSpec) else spec_from_dict(spec)  # every default filled in, by the spec's rules
    data, opt, knobs = job.data, job.optimizer, job.train
    cuda = device == "cuda"
    # each optional entry is there only where it applies, so the keys of jobs without it stay as they were
    data_part = {
        "name": data.name,
        "sample_shape": [int(d) for d in shape],
        **(dict(loader_workers=data.loader_workers, augment=data.augment) if data.name in DISK_SETS else {}),
        # the user's sets: which ones, and how many loader workers read them
        **(
            dict(factory=data.factory, kwargs=_json(data.kwargs), loader_workers=data.loader_workers)
            if data.name == "factory"
            else {}
        ),
        # the input path a step waits for (default keys unchanged)
        **({"prefetch": data.prefetch} if data.prefetch != "auto" else {}),
        # resident on the device or not: memory and time
        **(
            {"device_resident_share": data.device_resident_share}
            if cuda and data.device_resident_share != 0.25 and data.name not in DISK_SETS + ("factory",)
            else {}
        ),
    }
    # torch's SGD keeps no state without momentum
    opt_part = {"name": opt.name, **({"momentum_buffer": opt.momentum > 0} if opt.name == "sgd" else {})}
    return {
        "key_version": KEY_VERSION,
        "model": {"name": job.model.name, "kwargs": _json(job.model.kwargs)},
        "data": data_part,
        "optimizer": opt_part,
        "collective": job.collective,
        "device": device,
        "hardware": ({"gpu": facts.gpu, "cores": facts.cores} if cuda else {"cpu": facts.cpu, "cores": facts.cores}),
        "torch": facts.torch,
        "cluster": _cluster(job.cluster.where),
        "backend": job.cluster.backend or ("nccl" if cuda else "gloo"),
        # measured in another arithmetic: another model (fp32 keys unchanged)
        **({"precision": knobs.precision} if knobs.precision != "fp32" else {}),
        # each knob changes the step; only when set
        **({"channels_last": True} if knobs.channels_last else {}),
        **({"step": knobs.step} if knobs.step is not None else {}),  # the user's own step class
        # recomputed blocks: another peak and step are measured
        **({"checkpointing": knobs.checkpoint_modules or "found"} if knobs.checkpointing == "on" else {}),
        **({"checkpointing_auto": knobs.checkpoint_modules or "found"} if knobs.checkpointing == "auto" else {}),
        # sharded steps: another peak (a share of the state) and other collectives (ddp keys unchanged)
        **({"parallelism": knobs.parallelism} if knobs.parallelism != "ddp" else {}),
        # measured over several lengths: models with terms in B*L and B*L^2 (one length's keys unchanged)
        **({"sequence_lengths": list(job.search.sequence_lengths)} if job.search.sequence_lengths else {}),
        # CUDA kernels only: on a CPU they change nothing, and leave the key alone; tf32 left out: torch's defaults
        **({"tf32": knobs.tf32} if cuda and knobs.tf32 is not None else {}),
        **({"cudnn_benchmark": True} if cuda and knobs.cudnn_benchmark else {}),
        **({"threads_per_worker": threads, "enforce_memory_cap": job.search.enforce_memory_cap} if not cuda else {}),
    }


def model_key_parts(spec: dict | JobSpec, profile: dict | ProfileRecord) -> dict:
    """The key parts of the models fitted from ``profile`` (a profile record, typed or as a dict: only its
    ``device``, ``facts``, ``sample_shape`` and ``threads_per_worker`` are read) of the job ``spec`` (a
    :class:`~tula.core.spec.JobSpec`, or a spec as a dict): hardware, threads and sample shape as the profile
    MEASURED them.

    Raises :class:`~tula.core.errors.RecordError` for a profile that does not say which hardware
    it ran on (written before profile records carried ``facts``)."""
    where = _Measured.of(profile)
    if where.facts is None or not where.facts.torch:
        raise RecordError(
            "the profile record does not say which hardware it was measured on (it has no 'facts'; "
            "an older Tula wrote it), so its fitted models cannot be stored for reuse"
        )
    return _parts(spec, device=where.device, facts=where.facts, shape=where.sample_shape, threads=where.threads)


@dataclass(frozen=True)
class _Measured:
    """What of a profile decides its models' key: where its trials ran."""

    device: str
    facts: HostFacts | None
    sample_shape: list[int]
    threads: int | None

    @classmethod
    def of(cls, profile: dict | ProfileRecord) -> _Measured:
        # a dict may be a profile's parts only (the service's and the tests' own), so it is not checked whole
        if isinstance(profile, ProfileRecord):
            return cls(profile.device, profile.facts, profile.sample_shape, profile.threads_per_worker)
        facts = profile.get("facts")
        return cls(
            profile["device"],
            _typed(facts) if isinstance(facts, HostFacts | Mapping) else None,
            profile["sample_shape"],
            profile.get("threads_per_worker"),
        )


def _typed(facts: HostFacts | Mapping[str, Any]) -> HostFacts:
    """``facts`` as :class:`~tula.core.records.HostFacts` (a mapping: as a profile record holds them)."""
    return facts if isinstance(facts, HostFacts) else HostFacts.model_validate(dict(facts))


def key_parts_for_new_job(
    spec: dict, facts: HostFacts | Mapping[str, Any], threads_per_worker: int | None = None
) -> dict:
    """The key parts of a job not yet profiled: ``facts`` from its launcher's ``facts()``
    (read where the ranks will run; a mapping of them, as a record holds them, is typed first),
    ``threads_per_worker`` the launcher's
    ``threads_per_worker`` (what its profile would run with).  Left out, it is the spec's
    ``profile.threads_per_worker``, else what ``open_launcher`` gives a local launcher
    (cores // the largest cluster size); a Dask cluster's must be given (on CPU)."""
    job = spec_from_dict(spec)
    facts = _typed(facts)
    device = facts.device
    threads = threads_per_worker
    if threads is None and device != "cuda":
        threads = job.profile.threads_per_worker
        where = job.cluster.where
        if threads is None and where == "local":  # as tula.engine.profile.default_threads
            threads = max(1, (facts.cores or 1) // max(job.search.cluster_sizes))
        if threads is None:
            raise ValueError(
                f"the threads per worker of a job on cluster {where!r} depend on its workers: pass the "
                "launcher's threads_per_worker"
            )
    return _parts(job, device=device, facts=facts, shape=sample_shape(job.data), threads=threads)


def canonical_json(parts: dict) -> str:
    """``parts`` as JSON with sorted keys and no spaces: equal parts, equal text."""
    return json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def model_key(parts: dict) -> str:
    """The SHA-256 (hex) of the canonical JSON of ``parts``."""
    return hashlib.sha256(canonical_json(parts).encode("ascii")).hexdigest()
