"""Fit stage: a profile record in, a fitted-models record out.

The models record is small and self-contained (spec, memory model, performance model,
data-set size, the measured trials for plots), so it is saved once and re-planned from
without profiling again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tula.core.errors import RecordError
from tula.core.perfmodel import (
    PerfModel,
    fit_perf_model,
    relative_error,
    relative_errors,
    trial_topology,
    world_shape,
)
from tula.core.records import (  # noqa: F401
    MODELS_KIND,
    PLAN_KIND,
    PROFILE_KIND,
    VERSIONS,
    AccumulationCheck,
    AccumulationTrial,
    ModelsRecord,
    NoiseScale,
    NoiseWorld,
    ProfileRecord,
    Trial,
    load_record,
    parse_record,
    placement,
    save_record,
)
from tula.core.run_costs import fit_run_costs
from tula.core.spec import reference_sequence_length, spec_from_dict
from tula.core.variants import fit_checkpointing_effect, fit_sharding_effect


def oom_local_batch(trials: Sequence[Trial]) -> int | None:
    """Smallest local batch that ran out of memory.  (The trials skipped after one did have
    larger local batches; a trial skipped for another reason -- a cluster size the launcher
    could not place or run -- says nothing about memory.)"""
    bad = [t.local_batch for t in trials if t.status == "oom"]
    return min(bad) if bad else None


def fit_noise_scale(trials: Sequence[Trial]) -> NoiseScale:
    """The gradient noise scale B_noise at the start of training, from the trials' ``noise``
    measurements (the first trial of each world): the ratio of the mean tr(Sigma) to the
    mean |G|^2 over every measured batch of every world (each batch's pair is unbiased at
    its own batch sizes, so they pool), with a jackknife standard error over the batches
    (``low``, ``high``: one error either side).  ``b_noise`` is None, with a ``note``
    saying why, when nothing was measured or no gradient signal stood above the noise."""
    measured = [(t.n_workers, t.noise) for t in trials if t.noise is not None and t.noise.steps]
    worlds = [
        NoiseWorld(n_workers=n, b_small=m.b_small, b_big=m.b_big, steps=m.steps, b_simple=m.b_simple)
        for n, m in measured
    ]
    if not measured:
        note = "not measured: the profile has no noise measurement (profile.noise_steps 0, or an older profile)"
        return NoiseScale(b_noise=None, low=None, high=None, steps=0, worlds=worlds, note=note)
    g2 = np.array([v for _, m in measured for v in m.g2], float)
    tr = np.array([v for _, m in measured for v in m.trace_sigma], float)
    if g2.sum() <= 0:
        note = (
            f"not measurable: over {g2.size} batches the mean |G|^2 is not above 0 -- the gradient noise "
            "swamps the signal at these batches (B_noise is far above them)"
        )
        return NoiseScale(b_noise=None, low=None, high=None, steps=int(g2.size), worlds=worlds, note=note)
    b = float(max(tr.sum(), 0.0) / g2.sum())
    low = high = None
    if g2.size >= 2:
        rest_g2, rest_tr = g2.sum() - g2, tr.sum() - tr
        ok = rest_g2 > 0
        loo = np.maximum(rest_tr[ok], 0.0) / rest_g2[ok]
        se = float(np.sqrt((loo.size - 1) / loo.size * np.sum((loo - loo.mean()) ** 2))) if loo.size >= 2 else 0.0
        low, high = max(b - se, 0.0), b + se
    return NoiseScale(b_noise=b, low=low, high=high, steps=int(g2.size), worlds=worlds, note="")


def accumulation_check(
    perf: PerfModel, trials: Sequence[Trial], checks: Sequence[AccumulationTrial]
) -> list[AccumulationCheck]:
    """Each accumulated-step measurement of the profile (``accumulation_trials``) against the
    model's ``t_step(micro, N, k)``, on the hosts of the ordinary trial of the same batch."""
    out = []
    topology = trial_topology(trials) is not None
    for a in checks:
        n, b = a.n_workers, a.local_batch
        same = next((t for t in trials if (t.n_workers, t.local_batch) == (n, b)), None)
        r, h = world_shape(same) if topology and same else (None, None)
        predicted = float(perf.t_step_s(a.micro_batch, n, r, h, a.accumulation_steps))
        out.append(
            AccumulationCheck(
                n_workers=n,
                local_batch=b,
                micro_batch=a.micro_batch,
                accumulation_steps=a.accumulation_steps,
                t_step_s=a.t_step_s,
                predicted_t_step_s=predicted,
                rel_error=abs(predicted - a.t_step_s) / a.t_step_s,
            )
        )
    return out


def fit_models(profile: Mapping[str, Any] | ProfileRecord) -> ModelsRecord:
    """Fit the memory and performance models of a profile record (a dict as read from
    ``profile.json``, checked here, or a :class:`~tula.core.records.ProfileRecord`): the
    :class:`~tula.core.records.ModelsRecord` (``.to_json_dict()`` where it is written)."""
    prof = parse_record(profile, ProfileRecord, "the profile")
    spec = prof.spec
    # the models are the plain step's (the spec's variant); train.checkpointing auto's checkpointed
    # trials then fit that variant's effect on them (tula.core.variants), as train.parallelism auto's sharded ones
    plain_trials = [t for t in prof.trials if not t.checkpointing and t.parallelism is None]
    ok_trials = [t for t in plain_trials if t.status == "ok"]
    if not ok_trials:
        raise RecordError(
            "the profile has no successful trial to fit a performance model to "
            "(every trial ran out of memory or failed)"
        )
    # the batch's line is fitted at the data's own length (every trial of a profile of one length);
    # the trials at the other lengths of search.sequence_lengths then fit the terms in B*L and B*L^2
    ref_length = reference_sequence_length(spec.data)
    at_ref = [t for t in plain_trials if t.sequence_length in (None, ref_length)]
    ref_ok = [t for t in at_ref if t.status == "ok"]
    if not ref_ok:
        raise RecordError(
            f"the profile has no successful trial at the data's own sequence length {ref_length} to fit the "
            "performance model to (every one ran out of memory or failed)"
        )
    perf = fit_perf_model(at_ref, spec.collective, prof.model.grad_bytes)
    probed = prof.memory
    peaks = [t.peak_mem_bytes for t in ok_trials if t.peak_mem_bytes is not None]  # every one (ProfileRecord checks)
    ref_peaks = [t.peak_mem_bytes for t in ref_ok if t.peak_mem_bytes is not None]
    # the line over the one-rank trials at L_ref, and what an N >= 2 world holds beyond it over the N >= 2 trials
    # (MemoryModel.refit).  Measured (bench/transformer_plan run 4's profile, 2026-11-29): a two-rank peak is the
    # one-rank line's at large batches (N 2, b 32, L 32: 128 bytes below it) and above it only at small ones (b 4:
    # +335 kB, not the buckets' 565 kB): max(line, a phase with 80 % of its bytes per sample, 631 kB above it at
    # b 0; small_cnn the same shape).  The line over both sizes, each N >= 2 peak less the buckets, came out 574 kB
    # low (1,122,301 bytes; one rank measures 1,696,000 + 8 L): run 4's DDP rows were off 1.5 % median, 9.1 % max
    # (low), now 0.0 % and 5.4 % (high, at N 2 B 12 L 48: the two-rank trials' line between its two batches)
    mem = probed.refit([t.local_batch for t in ref_ok], ref_peaks, [t.n_workers for t in ref_ok])
    local = np.array([t.local_batch for t in ok_trials])
    ns = [t.n_workers for t in ok_trials]
    lengths = None
    if ref_length is not None and len(ref_ok) < len(ok_trials):  # trials at other lengths
        perf = perf.with_sequence_length(ref_length, ok_trials)
        lengths = np.array([t.sequence_length or ref_length for t in ok_trials])
        mem = mem.with_sequence_length(ref_length, lengths.tolist(), local.tolist(), peaks, ns)
    t_err = relative_errors(perf, ok_trials)  # each trial where its ranks ran, at its length
    m_err = relative_error(mem.predict_peak_bytes(local, ns, lengths), peaks)
    acc = accumulation_check(perf, ref_ok, prof.accumulation_trials or [])
    run_trials = prof.run_trials or []
    run_costs = fit_run_costs(run_trials, spec.train.method)
    fit_error = {
        "t_step_median_rel": float(np.median(t_err)),
        "t_step_max_rel": float(t_err.max()),
        "peak_mem_median_rel": float(np.median(m_err)),
        "peak_mem_max_rel": float(m_err.max()),
    }
    if acc:
        fit_error["accumulated_step_max_rel"] = max(a.rel_error for a in acc)
    not_measured = prof.not_measured
    effect = fit_checkpointing_effect(mem, perf, prof.trials)
    sharding = fit_sharding_effect(mem, perf, prof.trials, effect)  # and the checkpointed + sharded trial
    return ModelsRecord(
        kind=MODELS_KIND,
        version=VERSIONS[MODELS_KIND],
        spec=spec.to_dict(),
        search=prof.search,
        device=prof.device,
        dataset_size=prof.dataset_size,
        memory_budget_bytes=prof.memory_budget_bytes,
        memory=mem,
        memory_probed=probed,
        perf=perf,
        oom_local_batch=oom_local_batch(at_ref),
        fit_error=fit_error,
        accumulation_check=acc,
        trials=prof.trials,
        profiling_s=prof.profiling_s,
        placement=placement(prof.trials),
        noise_scale=fit_noise_scale(prof.trials),
        # the method's own step and each epoch's end, from the run trials (None: the profile had none)
        run_costs=run_costs,
        run_trials=run_trials,
        # cluster sizes the profile could not place (one rank per GPU): N -> why; the plan does not rank them
        **({"not_measured": not_measured} if not_measured else {}),
        # train.checkpointing auto: the checkpointed step's effect (None: not measured)
        **({"checkpointing": effect} if effect is not None else {}),
        # train.parallelism auto: the sharded step's effect (None: not measured)
        **({"sharding": sharding.to_dict()} if sharding is not None else {}),
    )


def rebase_models(models: dict, spec: dict, dataset_size: int, from_job: str | None = None) -> dict:
    """Fitted models reused for another job with the same model key: the fitted memory and
    performance models (and the trials they were fitted on) are kept; the job's own spec
    (epochs, search space, pricing, objective) and training-set size replace the measured
    job's, so the plan is this job's.  ``from_job`` names the job that measured them."""
    out = {**models, "spec": spec_from_dict(spec).to_dict(), "dataset_size": int(dataset_size)}
    if from_job is not None:
        out["reused_models_from"] = from_job
    return out
