"""``tula check`` makes every check a run makes before any worker (#44, bad input), each with the
run's own sentence and exit code 2: a sequence length above the model's positional limit, lengths
for a data factory that takes none, a checkpointing class that matches nothing, FSDP with what it
cannot train, a dict batch without a key the model needs; and its table says the sequence lengths
checked, the blocks checkpointing wraps and the parallelism."""

import pytest
from helpers import assert_refused, one_line, tula_in_process, write_spec


def _gpt(**train: object) -> dict:
    """tiny_gpt (positions up to 32) on 128 text sequences of 16 characters."""
    return {
        "name": "gpt-check",
        "model": {"name": "tiny_gpt", "kwargs": {"n_layers": 2, "d_model": 32, "n_heads": 2, "max_positions": 32}},
        "data": {"name": "text", "sequence_length": 16, "num_samples": 128},
        "optimizer": {"name": "adamw", "lr": 0.01},
        "train": {"noise_scale": False, **train},
        "search": {"cluster_sizes": [1, 2], "min_batch": 8, "max_batch": 32},
    }


def _with_lengths(spec: dict, lengths: list[int]) -> dict:
    return {**spec, "search": {**spec["search"], "sequence_lengths": lengths}}


_FACTORY_WITHOUT_LENGTHS = {
    "name": "factory-lengths",
    "model": {"name": "factories:linear_at_zero"},
    "data": {"factory": "factories:linear_regression", "kwargs": {"n": 200}},
    "train": {"loss": "mse"},
    "search": {"cluster_sizes": [1], "min_batch": 8, "max_batch": 32, "sequence_lengths": [16, 32]},
}

_DICT_BATCH_WITHOUT_A_KEY = {
    "name": "hf-check",
    "model": {"name": "user_hf:TinyLM"},
    "data": {"name": "factory", "factory": "user_hf:make_tokens", "kwargs": {"keys": ["input_ids", "labels"]}},
    "optimizer": {"name": "sgd", "lr": 0.5},
    "train": {"loss": "model", "noise_scale": False},
    "search": {"cluster_sizes": [1], "min_batch": 16, "max_batch": 64},
}


@pytest.mark.parametrize(
    "spec, sentence",
    [
        (
            _with_lengths(_gpt(), [16, 64]),
            "search.sequence_lengths [64] exceed the model's positional limit of 32 tokens (model 'tiny_gpt'); "
            "give lengths of at most 32, or a model that takes longer sequences",
        ),
        (
            _FACTORY_WITHOUT_LENGTHS,
            "search.sequence_lengths [16, 32] are given, but data factory 'factories:linear_regression' takes no "
            "sequence_length keyword to build its sets at each length",
        ),
        (
            _gpt(checkpointing="on", checkpoint_modules=["NoSuchBlock"]),
            "train.checkpointing is on, but model 'tiny_gpt' has no submodule of class 'NoSuchBlock' to checkpoint",
        ),
        (
            _gpt(parallelism="fsdp", method="ags"),
            "method 'ags' compares the norms of the whole small-batch and large-batch gradients, which "
            "train.parallelism fsdp shards over the workers",
        ),
        (
            _gpt(parallelism="fsdp", method="lbt", precision="fp16"),
            "train.precision fp16 is not available with train.parallelism fsdp yet",
        ),
        (
            _gpt(parallelism="fsdp", method="lbt", noise_scale=True),
            "train.noise_scale needs each worker's whole gradient before it is averaged, which train.parallelism "
            "fsdp reduce-scatters inside the backward pass",
        ),
        (
            _DICT_BATCH_WITHOUT_A_KEY,
            "model 'user_hf:TinyLM' cannot take user_hf:make_tokens batches of keys input_ids, labels "
            "(TypeError: TinyLM.forward() missing 1 required positional argument: 'attention_mask')",
        ),
    ],
    ids=["positional-limit", "factory-without-lengths", "checkpointing-no-match", "fsdp-ags", "fsdp-fp16",
         "fsdp-noise-scale", "dict-batch-missing-key"],
)  # fmt: skip
def test_tula_check_refuses_what_a_run_refuses_before_any_worker(tmp_path, spec, sentence):
    assert_refused(tula_in_process("check", write_spec(tmp_path, spec)), sentence)


def _rows(stdout: str) -> str:
    return " ".join(one_line(stdout).replace("│", " ").split())


def test_tula_check_says_the_lengths_the_blocks_and_the_parallelism_it_checked(tmp_path):
    spec = _with_lengths(_gpt(checkpointing="auto", parallelism="auto", method="lbt"), [8, 16, 32])
    r = tula_in_process("check", write_spec(tmp_path, spec), env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    text = _rows(r.stdout)
    assert "sequence lengths 8, 16, 32 (the model takes up to 32)" in text, text
    assert "checkpointing auto: 2 block(s) of _Block (the plan chooses whether to checkpoint them)" in text, text
    assert "parallelism auto: the plan chooses ddp or fsdp" in text, text

    spec = _gpt(checkpointing="on", parallelism="auto", method="ags")
    r = tula_in_process("check", write_spec(tmp_path, spec), env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    text = _rows(r.stdout)
    assert "sequence lengths 16 (the model takes up to 32)" in text, text  # the data's own length
    assert "checkpointing on: 2 block(s) of _Block" in text, text
    assert "parallelism auto: ddp only, method 'ags' compares the norms of the whole" in text, text


def test_tula_check_of_data_without_a_length_says_no_lengths(tmp_path, tiny_spec_dict):
    r = tula_in_process("check", write_spec(tmp_path, tiny_spec_dict), env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    text = _rows(r.stdout)
    assert "sequence lengths" not in text and "checkpointing off" in text and "parallelism ddp" in text, text
