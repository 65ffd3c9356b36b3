"""A rank's checkpoint as a typed object (:class:`tula.engine.rank_checkpoint.RankCheckpoint`): the
file's dict is its edge (checkpoints written before the typed object load, and it writes them as they
were), and it records the sequence length trained at, which a resume at another length is refused for
(one sentence, exit 2)."""

import torch
from helpers import assert_refused, local_launcher, train_args, tula_in_process, write_spec

from tula.core.spec import spec_from_dict
from tula.engine.checkpoint import CHECKPOINT, PREVIOUS, checkpoint_header, load_checkpoint, save_checkpoint
from tula.engine.rank_checkpoint import RankCheckpoint
from tula.engine.train import train

#: a checkpoint's dict as the ranks wrote it before the typed checkpoint (a 1-worker lbt run of
#: small_cnn after epoch 1), tensors made small
_LINE = {
    "epoch": 1, "steps": 22, "steps_done": 22, "global_batch": 64, "n_workers": 1, "accumulation_steps": 1,
    "micro_batch": 64, "lr": 0.1, "train_loss": 1.9, "epoch_time_s": 0.4, "test_loss": 1.5, "test_top1": 0.6,
    "test_top5": 0.9, "b_simple": None, "eval_s": 0.01, "epoch_end_s": 0.02, "checkpoint_s": 0.03,
}  # fmt: skip


def _old_state() -> dict:
    return {
        "epoch": 1,
        "steps_done": 22,
        "history": [_LINE],
        "method": "lbt",
        "global_batch": 64,
        "n_workers": 1,
        "accumulation_steps": 1,
        "fallbacks": [],
        "model": {"conv.weight": torch.arange(6.0).reshape(2, 3)},
        "method_state": {"optimizer": {"state": {}, "param_groups": []}, "extra": {}},
        "torch_rng": torch.get_rng_state(),
        "schedule_state": None,
        "lr_multiplier": 1.0,
        "next_global_batch": 64,
        "next_n_workers": 1,
        "next_accumulation_steps": 1,
        "noise_scale": {"version": 1, "decay": 0.9, "steps": 3, "weight": 1.0, "g2_ema": 2.0, "trace_ema": 3.0},
        "precision": {"name": "fp32", "scaler": None},
    }


def test_a_checkpoint_written_before_the_typed_one_loads_and_is_written_back_as_it_was(tmp_path):
    old = _old_state()
    save_checkpoint(old, tmp_path)  # the file as the ranks wrote it (header, checksum, torch.save'd dict)
    ckpt = RankCheckpoint.from_state(load_checkpoint(tmp_path))
    assert (ckpt.epoch, ckpt.method, ckpt.global_batch, ckpt.sequence_length, ckpt.shards) == (1, "lbt", 64, None, None)
    assert ckpt.history[0].test_top1 == 0.6 and ckpt.history[0].checkpoint_s == 0.03
    assert torch.equal(ckpt.model["conv.weight"], old["model"]["conv.weight"])
    again = ckpt.to_state()
    assert list(again) == list(old)  # the same keys in the same order: no sequence length, no shards
    assert again["history"] == [_LINE] and list(again["history"][0]) == list(_LINE)  # the line's keys in its order
    assert again["noise_scale"] == old["noise_scale"]
    # older still: no accumulation, schedule, next configuration, noise scale or precision kept
    oldest = {k: v for k, v in old.items() if k not in ("accumulation_steps", "schedule_state", "lr_multiplier",
                                                         "next_global_batch", "next_n_workers",
                                                         "next_accumulation_steps", "noise_scale", "precision")}  # fmt: skip
    ckpt = RankCheckpoint.from_state(oldest)
    assert (ckpt.accumulation_steps, ckpt.lr_multiplier, ckpt.precision, ckpt.noise_scale) == (1, 1.0, None, None)


def test_a_new_checkpoint_round_trips_with_its_sequence_length_and_shards(tmp_path):
    ckpt = RankCheckpoint.from_state({**_old_state(), "sequence_length": 32, "shards": "checkpoint.shards/epoch-0001"})
    save_checkpoint(ckpt.to_state(), tmp_path)
    back = RankCheckpoint.from_state(load_checkpoint(tmp_path))
    assert (back.sequence_length, back.shards) == (32, "checkpoint.shards/epoch-0001")
    assert back.history == ckpt.history and checkpoint_header(tmp_path).sequence_length == 32


def _gpt(sequence_length: int, epochs: int) -> dict:
    return {
        "name": "gpt-ckpt",
        "model": {
            "name": "tiny_gpt",
            "kwargs": {"n_layers": 1, "d_model": 16, "n_heads": 2, "max_positions": 32, "dropout": 0.0},
        },
        "data": {"name": "text", "sequence_length": sequence_length, "num_samples": 96},
        "epochs": epochs,
        "train": {"noise_scale": False},
    }


def test_the_checkpoint_records_its_sequence_length_and_a_resume_at_another_is_one_sentence(tmp_path):
    out = tmp_path / "run"
    train(spec_from_dict(_gpt(16, 1)), "lbt", 1, 16, out, launcher=local_launcher())
    assert checkpoint_header(out).sequence_length == 16
    assert RankCheckpoint.from_state(load_checkpoint(out)).sequence_length == 16
    spec = write_spec(tmp_path, _gpt(24, 2))
    r = tula_in_process(*train_args(spec, out, "--resume", out, workers=1, batch=16))
    assert_refused(
        r,
        f"the checkpoint in {out} was trained at sequence length 16, not 24; resume it at sequence length 16, "
        "or train into another --out",
    )
    assert checkpoint_header(out).epoch == 1  # untouched


def test_a_checkpoint_without_a_sequence_length_resumes_as_the_uninterrupted_run(tmp_path):
    """A checkpoint from before the length was kept (its key taken out of a real one) resumes, and the
    run ends with the parameters of one that was never interrupted (one worker: bit for bit)."""
    ref = train(spec_from_dict(_gpt(16, 2)), "lbt", 1, 16, tmp_path / "ref", launcher=local_launcher())
    cut = tmp_path / "cut"
    train(spec_from_dict(_gpt(16, 1)), "lbt", 1, 16, cut, launcher=local_launcher())
    old = {k: v for k, v in load_checkpoint(cut).items() if k not in ("kind", "version", "sequence_length")}
    (cut / CHECKPOINT).unlink()
    (cut / PREVIOUS).unlink(missing_ok=True)
    save_checkpoint(old, cut)
    assert checkpoint_header(cut).sequence_length is None
    resumed = train(spec_from_dict(_gpt(16, 2)), "lbt", 1, 16, cut, launcher=local_launcher(), resume=True)
    assert [h.train_loss for h in resumed.history] == [h.train_loss for h in ref.history]
    a, b = load_checkpoint(tmp_path / "ref")["model"], load_checkpoint(cut)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert checkpoint_header(cut).sequence_length == 16  # the resumed run's checkpoint records it


def test_a_batch_change_under_fsdp_goes_on_in_the_world_from_the_shards_just_written(tmp_path):
    """The in-world batch change takes the checkpoint as it was written (under FSDP: the shards it
    names), as a new generation would take it from the file."""
    d = _gpt(16, 2)
    d["train"] = {"parallelism": "fsdp", "noise_scale": False, "warmup_epochs": 0,
                  "batch_schedule": {"kind": "piecewise", "batches": [16, 32]}}  # fmt: skip
    run = train(spec_from_dict(d), "lbt", 2, 16, tmp_path, launcher=local_launcher())
    assert [(h.global_batch, h.n_workers) for h in run.history] == [(16, 2), (32, 2)]
    assert [(g.global_batch, g.world, g.new_world) for g in run.generations] == [(16, 1, True), (32, 1, False)]
    assert RankCheckpoint.from_state(load_checkpoint(tmp_path)).shards == "checkpoint.shards/epoch-0002"
