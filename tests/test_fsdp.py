"""Sharded data parallel (``train.parallelism: fsdp``, FSDP2's ``fully_shard``) on real 2-rank gloo
worlds: the same losses as DDP for the same seed, a sharded checkpoint (DCP) that resumes exactly,
the parameters, gradients and optimiser state of a rank divided by the worker count (measured), and
the refusals before any worker starts."""

import re
import shutil
from dataclasses import replace

import pytest
import torch
from helpers import assert_refused, local_launcher, run_tula, train_args, tula_in_process, write_spec

from tula.core.spec import spec_from_dict
from tula.engine.checkpoint import CHECKPOINT, PREVIOUS, load_checkpoint
from tula.engine.fsdp import (
    SHARDS_DIR,
    SHARDS_KEY,
    full_parameters,
    full_state_from_shards,
    load_shards,
    save_shards,
    wrap_for_world,
)
from tula.engine.memory import measure_step_peak_bytes
from tula.engine.precision import Precision
from tula.engine.rank_checkpoint import RankCheckpoint
from tula.engine.step import TrainStep
from tula.engine.train import train
from tula.engine.workloads import build_loss, build_model, load_dataset

N_WORKERS, BATCH = 2, 32  # 256 - 1/8 test sequences -> 7 steps per epoch
HISTORY_KEYS = ("train_loss", "test_loss", "test_perplexity", "lr")


def _gpt_spec(parallelism: str = "fsdp", epochs: int = 3, d_model: int = 32, **train: object) -> dict:
    """tiny_gpt (2 blocks) on 256 text sequences of 32 bytes, AdamW, warm-up and decay so the LR
    changes across the checkpoint."""
    return {
        "name": "gpt-fsdp",
        "model": {
            "name": "tiny_gpt",
            "kwargs": {"n_layers": 2, "d_model": d_model, "n_heads": 2, "max_positions": 32, "dropout": 0.0},
        },
        "data": {"name": "text", "sequence_length": 32, "num_samples": 256},
        "epochs": epochs,
        "optimizer": {"name": "adamw", "lr": 0.01},
        "train": {
            "method": "lrs",
            "base_batch": 16,
            "warmup_epochs": 2,
            "lr_milestones": [2],
            "parallelism": parallelism,
            "noise_scale": False,
            **train,
        },
    }


def _history(run):
    return [[getattr(h, k) for k in HISTORY_KEYS] for h in run.history]


def test_fsdp_trains_as_ddp_does_and_its_sharded_checkpoint_resumes_exactly(tmp_path):
    spec = spec_from_dict(_gpt_spec())
    sharded = train(spec, "lrs", N_WORKERS, BATCH, tmp_path / "a", launcher=local_launcher())
    ddp = train(spec_from_dict(_gpt_spec("ddp")), "lrs", N_WORKERS, BATCH, tmp_path / "ddp", launcher=local_launcher())
    # the same losses, step for step: FSDP's reduce-scatter averages as DDP's all-reduce does
    assert torch.allclose(torch.tensor(_history(sharded)), torch.tensor(_history(ddp)), rtol=1e-5, atol=0)
    assert sharded.replicas_identical  # the gathered parameters, the same from every rank

    # the checkpoint: shards (DCP) beside a checkpoint.pt without model tensors, the last two kept
    head = load_checkpoint(tmp_path / "a")
    assert head[SHARDS_KEY] == f"{SHARDS_DIR}/epoch-0003" and head["model"] == {}
    assert sorted(p.name for p in (tmp_path / "a" / SHARDS_DIR).iterdir()) == ["epoch-0002", "epoch-0003"]

    # what a run stopped after epoch 2 leaves: its checkpoint.pt and the shards it names
    (tmp_path / "b").mkdir()
    shutil.copyfile(tmp_path / "a" / PREVIOUS, tmp_path / "b" / CHECKPOINT)
    ref = load_checkpoint(tmp_path / "b")[SHARDS_KEY]
    shutil.copytree(tmp_path / "a" / ref, tmp_path / "b" / ref)
    resumed = train(spec, "lrs", N_WORKERS, BATCH, tmp_path / "b", resume=True, launcher=local_launcher())
    assert resumed.resumed_from_epoch == 2 and _history(resumed) == _history(sharded)
    whole_a = full_state_from_shards(tmp_path / "a", head[SHARDS_KEY])
    whole_b = full_state_from_shards(tmp_path / "b", load_checkpoint(tmp_path / "b")[SHARDS_KEY])
    assert whole_a["model"].keys() == whole_b["model"].keys()
    differ = [k for k in whole_a["model"] if not torch.equal(whole_a["model"][k], whole_b["model"][k])]
    assert not differ, f"resumed weights differ from the uninterrupted run's in {differ}"
    moments = [
        (name, key)
        for name, state in whole_a["optimizer"]["state"].items()
        for key, value in state.items()
        if not torch.equal(torch.as_tensor(value), torch.as_tensor(whole_b["optimizer"]["state"][name][key]))
    ]
    assert not moments, f"resumed optimiser state differs in {moments}"


def _local_bytes(tensors) -> int:
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    return sum(t.numel() * t.element_size() for t in local)


def rank_memory(ctx, parallelism: str) -> dict:
    """On each rank: tiny_gpt (4 blocks, 128 wide) as ``parallelism`` holds it, one AdamW step, then
    the next step's peak (tula.engine.memory.measure_step_peak_bytes) and the bytes this rank holds of
    the parameters, the gradients and the optimiser state."""
    spec = spec_from_dict({**_gpt_spec(parallelism, d_model=128), "model": {
        "name": "tiny_gpt",
        "kwargs": {"n_layers": 4, "d_model": 128, "n_heads": 2, "max_positions": 16, "dropout": 0.0},
    }, "data": {"name": "text", "sequence_length": 16, "num_samples": 64}})  # fmt: skip
    torch.manual_seed(0)
    model = build_model(spec.model)
    block_bytes = max(_local_bytes(b.parameters()) for b in model.blocks)
    root_bytes = _local_bytes(model.parameters()) - sum(_local_bytes(b.parameters()) for b in model.blocks)
    held = wrap_for_world(model, ctx.device, spec.train)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    step = TrainStep(held, build_loss(spec.train.loss, ctx.device), Precision("fp32", ctx.device), optimizer=optimizer)
    batch = load_dataset(spec.data, 0).batch(4, torch.Generator().manual_seed(ctx.rank))
    step.train_step(batch)  # the optimiser's state exists from here on
    peak = measure_step_peak_bytes(lambda: step.train_step(batch), model, optimizer, ctx.device)
    state = (
        _local_bytes(model.parameters())
        + _local_bytes(p.grad for p in model.parameters() if p.grad is not None)
        + _local_bytes(v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim())
    )
    return {"peak": peak, "state": state, "block": block_bytes, "root": root_bytes}


def test_a_rank_holds_a_worker_counts_share_of_parameters_gradients_and_optimiser_state():
    ddp = local_launcher().run(rank_memory, N_WORKERS, "ddp", timeout_s=120)
    sharded = local_launcher().run(rank_memory, N_WORKERS, "fsdp", timeout_s=120)
    print(f"DDP {ddp}\nFSDP {sharded}")
    for d, s in zip(ddp, sharded):
        # every tensor of the state split along its first dimension (all even here: no padding)
        assert s["state"] * N_WORKERS == d["state"], (d, s)
        # the step's peak: DDP's less the half of the state FSDP does not hold, plus what it gathers
        # at once: a block's whole parameters and gradients, and the root's parameters
        working_set = 2 * d["block"] + 2 * d["root"]
        assert s["peak"] < d["peak"] - d["state"] / 2 + working_set, (d, s)
        assert s["peak"] < d["peak"]


def rank_shards(ctx, out_dir: str, write: bool) -> list[float]:
    """On each rank: tiny_gpt sharded, one AdamW step from seed 1 (``write``: then its shards saved as
    epoch 1's) or from seed 2 (then epoch 1's shards loaded over it); its parameters' sums, whole."""
    spec = spec_from_dict(_gpt_spec())
    torch.manual_seed(1 if write else 2)
    model = build_model(spec.model)
    held = wrap_for_world(model, ctx.device, spec.train)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    tokens = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(ctx.rank))
    model(tokens, labels=tokens).loss.backward()
    optimizer.step()
    state = RankCheckpoint.from_state(
        {"epoch": 1, "steps_done": 1, "method": "lbt", "global_batch": 2, "n_workers": ctx.world_size,
         "method_state": {"extra": {}}, "model": {}, "torch_rng": torch.get_rng_state()}
    )  # fmt: skip
    if write:
        save_shards(held, optimizer, out_dir, 1, state)
    else:
        loaded = load_shards(held, optimizer, out_dir, replace(state, shards=f"{SHARDS_DIR}/epoch-0001"))
        assert len(loaded.method_state["optimizer"]["state"]) == len(list(model.parameters()))
    return [float(p.sum()) for p in full_parameters(model)]


def test_shards_written_by_two_ranks_load_into_one(tmp_path):
    """What a new worker count does with a sharded checkpoint (DCP reshards it)."""
    written = local_launcher().run(rank_shards, 2, str(tmp_path), True, timeout_s=120)
    loaded = local_launcher().run(rank_shards, 1, str(tmp_path), False, timeout_s=120)
    assert loaded[0] == written[0] == written[1]


def rank_run_trial(ctx, tmp_root: str):
    """On each rank: the run trial of lrs at a global batch of 16 under fsdp (no plain step beside it),
    its temporary folders made under ``tmp_root``/rank-R; the trial and what that folder holds after it."""
    import tempfile
    from pathlib import Path

    from tula.engine.run_trial import run_trial

    here = Path(tmp_root) / f"rank-{ctx.rank}"
    here.mkdir()
    before, tempfile.tempdir = tempfile.tempdir, str(here)
    try:
        trial = run_trial(ctx, spec_from_dict(_gpt_spec(epochs=1)), 16, 1, 0.0, lambda: None)
    finally:
        tempfile.tempdir = before
    return trial, sorted(str(p.relative_to(here)) for p in here.rglob("*"))


def test_a_run_trial_under_fsdp_times_every_ranks_sharded_checkpoint_and_leaves_no_files(tmp_path):
    """Under fsdp training writes the shards on every rank (DCP) and rank 0 the small checkpoint.pt:
    the run trial times that write on every rank (under DDP rank 0's file alone, 0.0 elsewhere), and
    removes what it wrote."""
    from tula.engine.run_trial import RankRunTrial, merge_run_trials

    results = local_launcher().run(rank_run_trial, N_WORKERS, str(tmp_path), timeout_s=120)
    trials = [trial for trial, _ in results]
    print([t.checkpoint_s for t in trials])
    assert all(isinstance(t, RankRunTrial) and t.checkpoint_s > 0 for t in trials), trials
    assert merge_run_trials(trials).checkpoint_s == max(t.checkpoint_s for t in trials)
    assert [left for _, left in results] == [[], []]


@pytest.mark.parametrize(
    "train_section, method, sentence",
    [
        (
            {},
            "ags",
            "method 'ags' compares the norms of the whole small-batch and large-batch gradients, which "
            "train.parallelism fsdp shards over the workers; use method lbt or lrs with fsdp, or train.parallelism "
            "ddp",
        ),
        (
            {"precision": "fp16"},
            "lbt",
            "train.precision fp16 is not available with train.parallelism fsdp yet",
        ),
        (
            {"noise_scale": True},
            "lbt",
            "train.noise_scale needs each worker's whole gradient before it is averaged, which train.parallelism "
            "fsdp reduce-scatters inside the backward pass; set train.noise_scale to false with fsdp",
        ),
    ],
    ids=["whole-gradient-method", "fp16", "noise-scale"],
)
def test_what_fsdp_cannot_train_is_one_sentence_before_any_worker_starts(tmp_path, train_section, method, sentence):
    spec = write_spec(tmp_path, _gpt_spec(**train_section))
    r = tula_in_process(*train_args(spec, tmp_path / "out", method=method), env={"TULA_FP16_ON_CPU": "1"})
    assert_refused(r, sentence)
    assert not (tmp_path / "out" / CHECKPOINT).exists()


def test_tula_run_refuses_fsdp_with_a_whole_gradient_method_before_profiling(tmp_path):
    d = _gpt_spec(method="lars")
    r = run_tula("run", write_spec(tmp_path, d), "--out", tmp_path / "run", timeout=120)  # a process of its own
    assert_refused(r, "method 'lars' scales each layer by the norms of its whole weight and gradient")
    assert not (tmp_path / "run" / "profile.json").exists()


@pytest.mark.slow
def test_the_out_of_memory_fallback_works_under_fsdp(tiny_spec_dict, tmp_path):
    """tests/test_train.py's capped run (8 MiB of address space above each rank's set-up) with
    fsdp: the probe is the synchronised sharded step, so a rank that runs out of memory there fails
    its world with cause oom (the world's sentence is the fallback's reason); the world starts again
    at half the micro-batch until it fits, and the run trains there."""
    d = dict(tiny_spec_dict, epochs=2, model={"name": "small_cnn", "kwargs": {"width": 32}})
    d["search"] = {**d["search"], "memory_budget_bytes": 8 * 2**20, "enforce_memory_cap": True}
    d["train"] = {"warmup_epochs": 0, "method": "lbt", "parallelism": "fsdp", "noise_scale": False}
    run = train(spec_from_dict(d), "lbt", N_WORKERS, 1024, tmp_path, launcher=local_launcher())
    assert run.fallbacks, "the capped run never ran out of memory"
    assert all(f.to_global_batch == 1024 for f in run.fallbacks)
    assert all(re.match(r"rank [01] of 2 ran out of memory \(", f.reason) for f in run.fallbacks), run.fallbacks
    assert run.accumulation_steps > 1 and [h.epoch for h in run.history] == [1, 2]


def rank_probed_and_unprobed_steps(ctx, out_root: str) -> dict:
    """On each rank, for k = 1 and 2 accumulation steps: two lrs trainers at a global batch of 16
    built alike (the same seed), one probed first (:meth:`_RankTrainer.probe`: under fsdp the
    synchronised sharded step; at k = 2 a micro-batch under no_sync, then one synchronised), then
    each two steps on the same two batches; their losses and parameters (digest) after them."""
    from tula.engine.rank_loop import _RankTrainer, param_digest

    spec = spec_from_dict(_gpt_spec(epochs=1))
    runs = {}
    for k in (1, 2):
        for probed in (False, True):
            rt = _RankTrainer(ctx, spec, "lrs", f"{out_root}/{k}-{probed}", [], None, k)
            try:
                rt.start_at(16, None)
                if probed:
                    assert rt.probe() is None
                    assert all(p.grad is None for p in rt.model.parameters())
                gen = torch.Generator().manual_seed(ctx.rank)
                losses = [float(rt.stepper.train_step(rt.data.batch(rt.local_batch, gen), i)) for i in range(2)]
                runs[k, probed] = (losses, param_digest(rt.model))
            finally:
                rt.data.close()
    return runs


def test_the_sharded_probe_leaves_no_gradient_behind(tmp_path):
    """Under fsdp the probe runs synchronised (a backward under no_sync would leave whole gradients in
    FSDP's accumulators, which the next synchronised backward reduces with its own) and its gradients
    are dropped: the steps after it are an unprobed trainer's, bit for bit, with and without accumulation."""
    for runs in local_launcher().run(rank_probed_and_unprobed_steps, N_WORKERS, str(tmp_path), timeout_s=120):
        for k in (1, 2):
            assert runs[k, True] == runs[k, False], (k, runs[k, True], runs[k, False])


def test_a_sharded_trial_whose_probe_runs_out_of_memory_is_the_profiles_oom_result():
    """A profiling world under fsdp capped at 30 MiB above its set-up (tiny_gpt, 4 blocks 512 wide, whose
    first synchronised sharded step, AdamW's update included, ran out of memory at every cap from 30 to
    120 MiB and ran at 160, measured 2026-11-29): the probe is that step, so a rank runs out of memory inside
    it and fails the world with cause oom; the session records the trial as out of memory, with the world's
    sentence, and no error."""
    import json
    from pathlib import Path

    from tula.core.records import ProfileRecord
    from tula.engine.profile import MemoryProbe, ProfileSession

    d = _gpt_spec(d_model=512)
    d["model"]["kwargs"].update(n_layers=4, max_positions=16)
    d["data"] = {"name": "text", "sequence_length": 16, "num_samples": 64}
    d["search"] = {"cluster_sizes": [N_WORKERS]}
    d["profile"] = {"warmup_steps": 1, "timed_steps": 2, "min_timed_s": 0.0}
    session = ProfileSession(spec_from_dict(d), "full", local_launcher(), None)
    session.check()
    stored = json.loads((Path(__file__).parent / "data" / "records" / "profile.json").read_text())
    session.probe = MemoryProbe(ProfileRecord.from_dict(stored).memory, 4, ((N_WORKERS, 8),))
    session.cap = 30 * 2**20
    session.run_world(N_WORKERS, [(N_WORKERS, 8)])
    assert [(t.global_batch, t.status) for t in session.trials] == [(8, "oom")], session.trials
    assert re.match(r"rank [01] of 2 ran out of memory \(", session.trials[0].note), session.trials[0].note


def test_a_world_that_runs_out_of_memory_after_its_trials_keeps_them_and_records_its_run_trial_as_oom():
    """Under fsdp the run trial's probe (and the accumulated-step check) run synchronised sharded steps, so an
    out-of-memory after the world's last trial fails the world: its trials are kept and its run trial is
    ``oom`` with the world's sentence, where it used to fail the profile."""
    import json
    from pathlib import Path

    from tula.core.errors import WorkerError
    from tula.core.records import ProfileRecord, Trial
    from tula.engine.profile import MemoryProbe, ProfileSession

    session = ProfileSession(spec_from_dict(_gpt_spec()), "full", local_launcher(), None)
    session.check()
    stored = json.loads((Path(__file__).parent / "data" / "records" / "profile.json").read_text())
    session.probe = MemoryProbe(ProfileRecord.from_dict(stored).memory, 8, ((N_WORKERS, 16),))
    ran = Trial(N_WORKERS, 8, 16, "ok", step_times_s=[0.2], compute_times_s=[0.1], peak_mem_bytes=1000, timed_steps=1)
    session.streamed = {0: [ran], 1: [ran]}
    sentence = "rank 1 of 2 ran out of memory (RuntimeError: DefaultCPUAllocator: can't allocate memory)"
    session.world_failed(WorkerError(sentence, rank=1, cause="oom"), N_WORKERS, [(N_WORKERS, 16)])
    assert [(t.global_batch, t.status) for t in session.trials] == [(16, "ok")]
    [run_trial] = session.run_trials
    assert (run_trial.n_workers, run_trial.method, run_trial.status) == (N_WORKERS, "lrs", "oom")
    assert run_trial.note.endswith(sentence)


# --------------------------------------------------------------------------- the profile under FSDP
@pytest.mark.slow  # two real 2-rank profiles
def test_a_profile_under_fsdp_measures_sharded_steps_below_ddp_s_peaks():
    """The profile holds the model as training does (``wrap_for_world``): under fsdp each trial's
    step is the sharded one, whose peak is below the same trial's under DDP (each rank holds half
    the parameters, gradients and AdamW state); the out-of-memory probe (the synchronised sharded step)
    and the timings run, and no noise scale is measured (no rank holds a whole local gradient)."""
    from tula.engine.profile import profile

    def trials(parallelism: str) -> dict:
        spec = _gpt_spec(parallelism, d_model=128)
        spec["search"] = {"cluster_sizes": [N_WORKERS], "min_batch": 4, "max_batch": 8}
        spec["profile"] = {"warmup_steps": 1, "timed_steps": 2, "min_timed_s": 0.0, "noise_steps": 2}
        rec = profile(spec_from_dict(spec), "full")
        assert all(t.status == "ok" for t in rec.trials), rec.trials
        return {t.global_batch: t for t in rec.trials}

    ddp, sharded = trials("ddp"), trials("fsdp")
    print({b: (ddp[b].peak_mem_bytes, sharded[b].peak_mem_bytes) for b in ddp})
    assert sorted(ddp) == sorted(sharded) and len(ddp) >= 2
    for b, t in sharded.items():
        assert t.peak_mem_bytes < ddp[b].peak_mem_bytes, (b, t.peak_mem_bytes, ddp[b].peak_mem_bytes)
        assert t.t_step_s > 0 and t.t_compute_s > 0 and t.noise is None
    assert any(t.noise is not None for t in ddp.values())


# --------------------------------------------------------------------------- the stored models' key
def test_fsdp_and_several_sequence_lengths_change_the_stored_model_key_and_ddp_keeps_it():
    """Models measured on sharded steps, or over several lengths (terms in B*L and B*L^2), are not
    those of a DDP profile at one length: another key; ddp and no lengths leave the parts as they
    were (the golden keys of test_gpu_knobs and test_checkpointing)."""
    from tula.service.model_key import key_parts_for_new_job, model_key, model_key_parts

    facts = {"device": "cpu", "cpu": "Test CPU", "gpu": None, "cores": 8, "torch": "2.14.1"}
    profile = {"device": "cpu", "facts": facts, "sample_shape": [32], "threads_per_worker": 2}
    keys = {}
    for name, parallelism, lengths in (
        ("ddp", "ddp", None),
        ("fsdp", "fsdp", None),
        ("lengths", "ddp", [32, 16]),
        ("same lengths", "ddp", [16, 32, 16]),
        ("other lengths", "ddp", [32, 64]),
        ("both", "fsdp", [16, 32]),
    ):
        spec = _gpt_spec(parallelism)
        if lengths is not None:
            spec["search"] = {"sequence_lengths": lengths}
        parts = key_parts_for_new_job(spec, facts, 2)
        assert model_key_parts(spec, profile) == parts  # a finished profile of the job: the same parts
        keys[name] = (model_key(parts), parts)
    assert not {"parallelism", "sequence_lengths"} & set(keys["ddp"][1])
    assert keys["fsdp"][1]["parallelism"] == "fsdp" and keys["lengths"][1]["sequence_lengths"] == [16, 32]
    assert keys["lengths"][0] == keys["same lengths"][0]  # the set of lengths, as the spec reads it
    distinct = {keys[n][0] for n in ("ddp", "fsdp", "lengths", "other lengths", "both")}
    assert len(distinct) == 5
