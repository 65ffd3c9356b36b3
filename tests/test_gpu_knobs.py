"""The knobs GPU users set (#25 item 3): ``train.tf32``, ``train.channels_last`` and
``train.cudnn_benchmark``.  Their spec fields and one-sentence refusals; the stored-model key
(each knob that changes the step is in it, only when set, so the keys of jobs without them stay
as they were); the rank applies them (torch's switches, the model's and the batches' layout),
and ``channels_last`` profiles and trains a CNN on a CPU through real ranks whose model refuses
any tensor not in that layout (tests/factories.py ``ChannelsLastOnly``)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from helpers import local_launcher

from tula.core.errors import SpecError, WorkloadError
from tula.core.spec import spec_from_dict
from tula.service.model_key import key_parts_for_new_job, model_key, model_key_parts

HERE = Path(__file__).resolve().parent
KNOBS = ("tf32", "channels_last", "cudnn_benchmark")

# the keys of this job as Tula wrote them before the knobs existed (computed with the
# model_key.py of the commit before them): a job that sets no knob keeps finding its stored models
_BASE = {
    "name": "k",
    "model": {"name": "small_cnn", "kwargs": {"in_channels": 1, "width": 4}},
    "data": {"name": "digits"},
    "search": {"cluster_sizes": [1]},
}
_OLD_KEYS = {
    "cpu": "128ac105912e257538eb543ac4f4eb5c00daaa9bad06e7dc53d0f5d86885b18d",
    "cuda": "a441a7ba810514224de3e95bf33199f1eea9bef8c4a2c1a5dd7d1296d33f7481",
}


def _facts(device: str) -> dict:
    return {
        "device": device,
        "cpu": "Test CPU",
        "gpu": "Test GPU" if device == "cuda" else None,
        "cores": 8,
        "torch": "2.14.1",
    }


def _with(**train) -> dict:
    return {**_BASE, "train": train}


# --------------------------------------------------------------------------- the spec
def test_the_knobs_are_torchs_defaults_unless_given_and_take_booleans():
    train = spec_from_dict(_BASE).train
    assert (train.tf32, train.channels_last, train.cudnn_benchmark) == (None, False, False)
    assert spec_from_dict(_with(tf32=False)).train.tf32 is False
    on = spec_from_dict(_with(tf32=True, channels_last=True, cudnn_benchmark=True)).train
    assert (on.tf32, on.channels_last, on.cudnn_benchmark) == (True, True, True)
    for knob in KNOBS:
        with pytest.raises(SpecError) as err:
            spec_from_dict(_with(**{knob: "sometimes"}))
        msg = str(err.value)
        assert f"train.{knob}" in msg and "\n" not in msg, msg
    with pytest.raises(SpecError, match="unknown field 'train.allow_tf32'"):
        spec_from_dict(_with(allow_tf32=True))


# --------------------------------------------------------------------------- the key
def test_jobs_without_knobs_keep_their_keys():
    for device, key in _OLD_KEYS.items():
        parts = key_parts_for_new_job(_BASE, _facts(device), 2)
        assert not set(KNOBS) & set(parts)
        assert model_key(parts) == key, device


def test_each_knob_that_changes_the_step_changes_the_key_and_a_profile_gives_the_same_parts():
    for device in ("cpu", "cuda"):
        facts = _facts(device)
        base = model_key(key_parts_for_new_job(_BASE, facts, 2))
        seen = {base}
        for knob in KNOBS:
            spec = _with(**{knob: True})
            parts = key_parts_for_new_job(spec, facts, 2)
            # a finished profile of the same job keys its fitted models the same way
            profile = {"device": device, "facts": facts, "sample_shape": [1, 8, 8], "threads_per_worker": 2}
            assert model_key_parts(spec, profile) == parts
            changes = knob == "channels_last" or device == "cuda"  # TF32 and cuDNN's autotuner: CUDA kernels only
            assert (model_key(parts) != base) == changes, (device, knob)
            assert (knob in parts) == changes
            seen.add(model_key(parts))
        assert len(seen) == (4 if device == "cuda" else 2)
        # strict float32 (tf32 false) is another kernel choice than torch's defaults, and than TF32 on
        strict = model_key(key_parts_for_new_job(_with(tf32=False), facts, 2))
        assert (strict not in seen) == (device == "cuda") and (strict == base) == (device == "cpu")
        every = model_key(key_parts_for_new_job(_with(**dict.fromkeys(KNOBS, True)), facts, 2))
        only_layout = model_key(key_parts_for_new_job(_with(channels_last=True), facts, 2))
        assert (every not in seen) if device == "cuda" else (every == only_layout)


def test_a_user_step_class_changes_the_key_on_every_device():
    """train.step names the step the profile times: another class, another model (no step: the key as before)."""
    for device in ("cpu", "cuda"):
        facts = _facts(device)
        base = model_key(key_parts_for_new_job(_BASE, facts, 2))
        spec = _with(step="user_steps:CountingStep")
        parts = key_parts_for_new_job(spec, facts, 2)
        assert parts["step"] == "user_steps:CountingStep" and model_key(parts) != base
        profile = {"device": device, "facts": facts, "sample_shape": [1, 8, 8], "threads_per_worker": 2}
        assert model_key_parts(spec, profile) == parts


# --------------------------------------------------------------------------- in a rank
def _switches() -> tuple[bool, bool, bool]:
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark


def test_the_backend_switches_follow_the_spec_every_way():
    import subprocess
    import sys

    from tula.engine.gpu_knobs import set_backend_knobs

    # torch's own defaults, read in a fresh interpreter: what a job that sets nothing must get
    fresh = subprocess.run(
        [sys.executable, "-c", "import torch; b = torch.backends; "
         "print(b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.benchmark)"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    saved = _switches()
    try:
        set_backend_knobs(spec_from_dict(_with(tf32=True, cudnn_benchmark=True)).train)
        assert _switches() == (True, True, True)
        set_backend_knobs(spec_from_dict(_with(tf32=False)).train)
        assert _switches() == (False, False, False)
        set_backend_knobs(spec_from_dict(_BASE).train)  # a later job without them gets torch's defaults back
        assert [str(v) for v in _switches()] == fresh
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = saved


def test_channels_last_lays_out_the_model_and_every_4d_input_it_consumes():
    from tula.engine.gpu_knobs import to_memory_format
    from tula.engine.workloads import SmallCNN

    seen: list[torch.Tensor] = []
    model = SmallCNN(in_channels=3, width=4)
    model.features[0].register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    to_memory_format(model, spec_from_dict(_with(channels_last=True)).train)
    assert model.features[0].weight.is_contiguous(memory_format=torch.channels_last)
    x = torch.randn(5, 3, 8, 8)
    out = model(x)
    assert seen[-1].is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous(
        memory_format=torch.channels_last
    )
    # the same numbers as the default layout (up to the summation order)
    plain = SmallCNN(in_channels=3, width=4)
    plain.load_state_dict(model.state_dict())
    torch.testing.assert_close(out, plain(x), rtol=1e-4, atol=1e-5)
    untouched = to_memory_format(SmallCNN(in_channels=3, width=4), spec_from_dict(_BASE).train)
    assert not untouched.features[0].weight.is_contiguous(memory_format=torch.channels_last)


def test_channels_last_on_samples_that_are_not_images_is_one_sentence():
    from tula.engine.workloads import check_workload

    d = {
        "name": "seq",
        "model": {"name": "mlp", "kwargs": {"in_features": 12}},
        "data": {"name": "synthetic", "sample_shape": [12], "num_samples": 64},
        "train": {"channels_last": True},
    }
    with pytest.raises(WorkloadError) as err:
        check_workload(spec_from_dict(d))
    msg = str(err.value)
    assert "train.channels_last" in msg and "(12,)" in msg and "\n" not in msg, msg
    d["train"] = {}
    check_workload(spec_from_dict(d))  # the same job without it is fine


def _channels_last_job(channels_last: bool) -> dict:
    return {
        "name": "nhwc",
        "model": {"name": "factories:ChannelsLastOnly", "kwargs": {"in_channels": 3, "width": 4}},
        "data": {"name": "synthetic", "sample_shape": [3, 8, 8], "num_samples": 160},
        "epochs": 1,
        "search": {"cluster_sizes": [1], "min_batch": 16, "max_batch": 32},
        "profile": {"warmup_steps": 1, "timed_steps": 2, "threads_per_worker": 1, "min_timed_s": 0},
        "train": {"channels_last": channels_last, "ags": {"b_small": 8}, "eval_batch": 64},
    }


def test_channels_last_profiles_and_trains_a_cnn_on_cpu(tests_on_path, tmp_path):
    from tula.engine.checkpoint import load_checkpoint
    from tula.engine.profile import profile
    from tula.engine.train import train
    from tula.engine.workloads import check_workload

    with pytest.raises(WorkloadError, match="not channels_last"):  # the model does refuse the default layout
        check_workload(spec_from_dict(_channels_last_job(False)))
    spec = spec_from_dict(_channels_last_job(True))
    launcher = local_launcher()
    rec = profile(spec, "partial", launcher=launcher)
    assert rec.trials and {t.status for t in rec.trials} == {"ok"}, rec.trials
    # AGS (its small batch goes through the model too), evaluation, a checkpoint: all in channels_last
    res = train(spec, "ags", 1, 32, tmp_path / "run", launcher=launcher)
    assert len(res.history) == 1 and math.isfinite(res.history[0].train_loss)
    weight = load_checkpoint(tmp_path / "run")["model"]["conv.weight"]
    assert weight.is_contiguous(memory_format=torch.channels_last)


def _subnormals_left(ctx) -> int:
    # in a fresh rank process, before any knob of the job is set: x * 1.0 over 2 intra-op threads
    x = torch.full((1 << 20,), 1e-39)  # a float32 subnormal
    return int(((x * 1.0) != 0).sum())


def test_subnormal_floats_are_flushed_in_the_rank_and_its_intra_op_threads():
    """On a CPU, arithmetic on subnormal floats made a trained model's step slower the longer it
    trained (tiny_gpt on ``text``: 28 -> 37-44 ms within seconds; flushed 27-32 ms): a fresh rank
    process flushes them to zero before torch starts its intra-op threads (which inherit it), and
    :func:`set_backend_knobs` in the calling thread."""
    from tula.engine.gpu_knobs import set_backend_knobs

    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU has no flush-to-zero mode torch can set")
    try:
        assert float(torch.tensor([1e-39]) * 1.0) != 0.0  # kept: the test process's own setting
        set_backend_knobs(spec_from_dict(_BASE).train)
        assert float(torch.tensor([1e-39]) * 1.0) == 0.0
    finally:
        torch.set_flush_denormal(False)
    assert local_launcher(threads_per_worker=2).run(_subnormals_left, 1) == [0]
