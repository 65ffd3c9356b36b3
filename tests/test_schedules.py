"""Batch-size schedules on hand-computed sequences: the batch, the workers and the LR per
epoch, the caps (memory, workers, data set, max_batch, even split), the LR rules, the
state round trip, and the spec's one-sentence errors.  Pure arithmetic: no torch."""

import dataclasses
import json
import math
from dataclasses import replace

import pytest
from helpers import assert_imports_no_torch

from tula.core.errors import SpecError
from tula.core.job_rules import caps_from_spec, state_from_spec
from tula.core.records import ScheduleDecision
from tula.core.schedules import (
    LR_RULES,
    PARAM_NAMES,
    SCHEDULE_NAMES,
    SCHEDULES,
    STATE_VERSION,
    Caps,
    Geometric,
    Schedule,
    ScheduleState,
    initial_state,
    next_config,
)
from tula.core.spec import BatchScheduleSpec, TrainSpec, spec_from_dict


def drive(state, caps, epochs, records=None):
    """Decide at epoch_done = 0 .. epochs; ``records[e]`` adds fields to epoch e's record
    (``steps`` defaults to the data set // B, ``train_loss`` to 1.0)."""
    decisions, history = [], []
    for e in range(epochs + 1):
        d = next_config(state, e, history, caps)
        decisions.append(d)
        state = d.state
        rec = {
            "train_loss": 1.0,
            "steps": caps.dataset_size // d.global_batch,
            "global_batch": d.global_batch,
            "n_workers": d.n_workers,
            **((records or {}).get(e, {})),
        }
        history.append(rec)
    return decisions


def col(decisions, name):
    return [getattr(d, name) for d in decisions]


def test_schedules_load_without_torch():
    assert_imports_no_torch("tula.core.schedules", "tula.core.noise_scale", "tula.core.spec")


def test_the_table_and_the_spec_agree():
    assert BatchScheduleSpec.model_fields["kind"].annotation.__args__ == SCHEDULE_NAMES == tuple(SCHEDULES)
    assert BatchScheduleSpec.model_fields["lr_rule"].annotation.__args__ == LR_RULES
    common = {"kind", "every_epochs", "lr_rule", "max_batch"}
    assert set(BatchScheduleSpec.model_fields) - common == set(PARAM_NAMES)
    for name, info in SCHEDULES.items():
        assert issubclass(info.cls, Schedule) and info.cls.name == name
        assert info.summary and "\n" not in info.summary
        required = {p.name: [64] for p in info.params if p.required}
        assert spec_from_dict({"train": {"batch_schedule": {"kind": name, **required}, "lr_milestones": [3]}})
    assert SCHEDULES["increase_instead_of_decay"].owns_lr_milestones
    assert SCHEDULES["adaptive"].needs_b_simple and not SCHEDULES["geometric"].needs_b_simple


def test_piecewise_follows_its_list_grows_and_shrinks_within_the_caps():
    caps = Caps(dataset_size=1000, max_local_batch=100, min_workers=1, max_workers=3, batch_per_worker=64)
    ds = drive(
        initial_state("piecewise", 64, {"batches": [64, 128, 500, 32]}, every_epochs=2, lr_rule="linear"), caps, 9
    )
    # periods of 2 epochs: 64, 128, then 500 capped by memory (100 x 3 = 300), then 32 for the rest
    assert col(ds, "global_batch") == [64, 64, 128, 128, 300, 300, 32, 32, 32, 32]
    assert col(ds, "n_workers") == [1, 1, 2, 2, 3, 3, 1, 1, 1, 1]
    assert col(ds, "resize") == [False, False, True, False, True, False, True, False, False, False]
    assert ds[4].capped_by == "memory" and ds[6].capped_by is None
    assert col(ds, "lr_multiplier")[::2] == [1.0, 2.0, 300 / 64, 0.5, 0.5]
    with pytest.raises(SpecError, match="needs its parameter 'batches'"):
        initial_state("piecewise", 64)


def test_constant():
    ds = drive(initial_state("constant", 64), Caps(1000), 3)
    assert col(ds, "global_batch") == [64, 64, 64, 64]
    assert col(ds, "n_workers") == [1, 1, 1, 1]
    assert col(ds, "lr_multiplier") == [1.0, 1.0, 1.0, 1.0]
    assert col(ds, "changed") == [True, False, False, False]


def test_geometric_with_workers_growing_and_the_memory_cap():
    caps = Caps(dataset_size=10_000, max_local_batch=100, min_workers=1, max_workers=4, batch_per_worker=64)
    ds = drive(initial_state("geometric", 32, {"factor": 2, "delay": 2}, lr_rule="linear"), caps, 10)
    assert col(ds, "global_batch") == [32, 32, 64, 64, 128, 128, 256, 256, 400, 400, 400]
    assert col(ds, "n_workers") == [1, 1, 1, 1, 2, 2, 4, 4, 4, 4, 4]
    assert col(ds, "local_batch") == [32, 32, 64, 64, 64, 64, 64, 64, 100, 100, 100]
    assert col(ds, "lr_scale") == [1, 1, 2, 2, 4, 4, 8, 8, 12.5, 12.5, 12.5]
    assert col(ds, "capped_by") == [None] * 8 + ["memory"] * 3
    assert col(ds, "changed") == [True, False, True, False, True, False, True, False, True, False, False]
    assert col(ds, "resize") == [False, False, False, False, True, False, True, False, False, False, False]
    assert "memory model" in ds[8].reason and "\n" not in ds[8].reason


def test_lr_rules_relative_to_the_first_batch():
    caps = Caps(10_000)
    for rule, want in [
        ("keep", [1, 1, 1, 1]),
        ("linear", [1, 2, 4, 8]),
        ("sqrt", [1, 1.4142135623730951, 2, 2.8284271247461903]),
    ]:
        ds = drive(initial_state("geometric", 16, {"factor": 2, "delay": 1}, lr_rule=rule), caps, 3)
        assert col(ds, "global_batch") == [16, 32, 64, 128]
        assert col(ds, "lr_scale") == pytest.approx(want)


def test_even_split_and_the_data_set_cap():
    caps = Caps(dataset_size=40, min_workers=1, max_workers=3, batch_per_worker=8)
    ds = drive(initial_state("geometric", 10, {"factor": 1.5, "delay": 1}), caps, 4)
    # wanted 10, 15, 22.5, 33.75, 50.6 -> N = clip(ceil(B/8), 1, 3), B rounded down to a multiple of N
    assert col(ds, "global_batch") == [10, 14, 21, 33, 39]
    assert col(ds, "n_workers") == [2, 2, 3, 3, 3]
    assert col(ds, "capped_by") == [None, None, None, None, "dataset"]


def test_max_batch_never_below_the_workers_and_memory_adds_workers():
    ds = drive(initial_state("geometric", 16, {"factor": 2, "delay": 1}, max_batch=50), Caps(1000), 3)
    assert col(ds, "global_batch") == [16, 32, 50, 50]
    assert col(ds, "capped_by") == [None, None, "max_batch", "max_batch"]
    d = next_config(initial_state("constant", 2), 0, [], Caps(100, min_workers=4, max_workers=4))
    assert (d.global_batch, d.n_workers) == (4, 4)
    # 256 per worker would not fit in 100: three workers of 85
    d = next_config(
        initial_state("constant", 256),
        0,
        [],
        Caps(1000, max_local_batch=100, min_workers=1, max_workers=4, batch_per_worker=256),
    )
    assert (d.global_batch, d.n_workers, d.local_batch) == (255, 3, 85)


def test_every_epochs():
    ds = drive(initial_state("geometric", 16, {"factor": 2, "delay": 1}, every_epochs=3), Caps(10_000), 6)
    assert col(ds, "global_batch") == [16, 16, 16, 128, 128, 128, 1024]
    assert "every 3 epochs" in ds[1].reason


def test_linear_after_k_updates():
    state = initial_state("linear", 100, {"rate": 0.1})
    hist = [{"train_loss": 1.0, "steps": s, "global_batch": 0, "n_workers": 1} for s in (10, 20, 5)]
    got = [next_config(state, 0, [], Caps(1000)).global_batch]
    for e in (1, 2, 3):
        d = next_config(state, e, hist, Caps(1000))
        got.append(d.global_batch)
        state = d.state
    # k = 10, 30, 35: 100 + ceil(1.0), 100 + ceil(3.0) (not 4: 0.1 * 30 is 3.0000000000000004), 100 + ceil(3.5)
    assert got == [100, 101, 103, 104]


def test_increase_instead_of_decay_then_the_lr_decays_at_the_largest_batch():
    caps = Caps(dataset_size=100_000, max_local_batch=500, min_workers=1, max_workers=2, batch_per_worker=200)
    state = initial_state("increase_instead_of_decay", 32, lr_milestones=[2, 4, 6], lr_gamma=0.1)
    ds = drive(state, caps, 7)
    assert col(ds, "global_batch") == [32, 32, 320, 320, 1000, 1000, 1000, 1000]
    assert col(ds, "n_workers") == [1, 1, 2, 2, 2, 2, 2, 2]
    # at epoch 4 the batch grows 320 -> 1000 (not 3200): the LR takes the rest, 0.1 * 1000 / 320
    assert col(ds, "lr_decay") == pytest.approx([1, 1, 1, 1, 0.3125, 0.3125, 0.03125, 0.03125])
    assert col(ds, "decayed_instead") == [False, False, False, False, True, False, True, False]
    assert col(ds, "lr_scale") == [1.0] * 8
    assert "LR decays" in ds[6].reason
    # changes only every 4 epochs: the pending milestones are applied together
    ds4 = drive(
        initial_state("increase_instead_of_decay", 32, lr_milestones=[2, 4, 6], lr_gamma=0.1, every_epochs=4), caps, 8
    )
    assert col(ds4, "global_batch") == [32, 32, 32, 32, 1000, 1000, 1000, 1000, 1000]
    assert col(ds4, "lr_decay") == pytest.approx([1, 1, 1, 1, 0.3125, 0.3125, 0.3125, 0.3125, 0.03125])


def test_loss_ratio_with_f_star():
    losses = {0: 2.5, 1: 1.5, 2: 1.0, 3: 0.6, 4: 0.4}
    recs = {e: {"train_loss": f} for e, f in losses.items()}
    ds = drive(initial_state("loss_ratio", 50, {"f_star": 0.5}), Caps(10_000), 5, recs)
    # F(w0) = the first epoch's loss 2.5: 50 x 2 / (F - 0.5); at or below F* the largest batch
    assert col(ds, "global_batch") == [50, 50, 100, 200, 1000, 10_000]
    assert ds[5].capped_by == "dataset"
    # F(w0) measured before training
    ds = drive(initial_state("loss_ratio", 50, {"f_star": 0.5}, f0=4.5), Caps(10_000), 2, recs)
    assert col(ds, "global_batch") == [50, 100, 200]
    # F* = 0 by default; a loss above F(w0) shrinks the batch
    ds = drive(
        initial_state("loss_ratio", 60),
        Caps(10_000),
        3,
        {0: {"train_loss": 2.0}, 1: {"train_loss": 1.0}, 2: {"train_loss": 3.0}},
    )
    assert col(ds, "global_batch") == [60, 60, 120, 40]


def test_adaptive_follows_b_simple_with_hysteresis_and_max_growth():
    caps = Caps(dataset_size=100_000, min_workers=1, max_workers=8, batch_per_worker=64)
    bs = [70, 50, 75, 200, 1000, 1000, 900, 1100, 30]
    ds = drive(
        initial_state("adaptive", 64, {"band": 0.25, "max_growth": 2}),
        caps,
        9,
        {e: {"b_simple": v} for e, v in enumerate(bs)},
    )
    assert col(ds, "global_batch") == [64, 64, 64, 64, 128, 256, 512, 896, 896, 448]
    assert col(ds, "n_workers") == [1, 1, 1, 1, 2, 4, 8, 8, 8, 7]
    assert "growth limited" in ds[4].reason


def test_adaptive_does_not_flap_inside_the_band():
    caps = Caps(dataset_size=100_000, min_workers=1, max_workers=8, batch_per_worker=64)
    bs = [128] + [150, 110] * 6  # +-17% around 128 with a band of 20%
    ds = drive(
        initial_state("adaptive", 64, {"band": 0.2, "max_growth": 4}),
        caps,
        len(bs),
        {e: {"b_simple": v} for e, v in enumerate(bs)},
    )
    assert col(ds, "global_batch") == [64, 128] + [128] * 12
    assert sum(col(ds, "resize")) == 1


def test_adaptive_without_b_simple_keeps_and_with_an_infinite_one_grows_to_the_cap():
    caps = Caps(dataset_size=1000, max_local_batch=300, min_workers=1, max_workers=2, batch_per_worker=256)
    ds = drive(
        initial_state("adaptive", 100, {"min_batch": 10}),
        caps,
        4,
        {0: {"b_simple": None}, 1: {"b_simple": math.inf}, 2: {"b_simple": math.inf}, 3: {"b_simple": math.inf}},
    )
    assert col(ds, "global_batch") == [100, 100, 200, 400, 600]
    assert ds[4].capped_by is None and ds[4].local_batch == 300


@pytest.mark.parametrize(
    "kind, params, kw, records",
    [
        ("adaptive", {"band": 0.1}, {}, {e: {"b_simple": 64 * 1.5**e} for e in range(8)}),
        ("loss_ratio", {}, {}, {e: {"train_loss": 3.0 / (1 + e)} for e in range(8)}),
        ("increase_instead_of_decay", {}, {"lr_milestones": [1, 3, 5], "lr_gamma": 0.5}, {}),
        ("linear", {"rate": 0.7}, {"every_epochs": 2}, {}),
    ],
)
def test_a_resumed_schedule_decides_exactly_as_an_uninterrupted_one(kind, params, kw, records):
    caps = Caps(dataset_size=5000, max_local_batch=400, min_workers=1, max_workers=3, batch_per_worker=100)
    full = drive(initial_state(kind, 64, params, **kw), caps, 7, records)
    # stop after epoch 3's decision: its state goes through JSON (the checkpoint) and the run goes on
    history = [
        {
            "train_loss": 1.0,
            "steps": 5000 // d.global_batch,
            "global_batch": d.global_batch,
            "n_workers": d.n_workers,
            **records.get(e, {}),
        }
        for e, d in enumerate(full)
    ]
    state = json.loads(json.dumps(full[3].state.to_dict()))
    again = next_config(json.loads(json.dumps(full[2].state.to_dict())), 3, history, caps)
    assert again == full[3] and again.state == full[3].state  # pure: deciding twice gives the same
    for e in range(4, 8):
        d = next_config(state, e, history, caps)
        assert d == full[e] and d.state == full[e].state
        state = d.state
    assert len(set(col(full, "global_batch"))) > 1  # the schedule did move


def test_a_decision_in_an_epoch_line_is_typed_and_dumps_as_read():
    """The decision an epoch line carries (``schedule``) loads as a ScheduleDecision and writes back the
    same JSON: the trainer's, one written before gradient accumulation (no k, no micro-batch), and one
    with a workers rule's ranking; a damaged one names its field."""
    from tula.core.errors import RecordError
    from tula.core.records import RankedOption, as_epoch

    d = next_config(initial_state("geometric", 32, {"factor": 2, "delay": 1}), 0, [], Caps(1000, None, 1, 4, 32))
    line = {"epoch": 1, "steps": 31, "steps_done": 31, "global_batch": 32, "n_workers": 1, "lr": 0.1,
            "train_loss": 1.0, "epoch_time_s": 0.5, "test_loss": 1.0, "schedule": ScheduleDecision.of(d).to_json_dict()}  # fmt: skip
    assert list(line["schedule"]) == [
        "epoch", "global_batch", "n_workers", "local_batch", "wanted_batch", "capped_by", "lr_scale", "lr_decay",
        "decayed_instead", "changed", "resize", "reason", "accumulation_steps", "lr_multiplier", "micro_batch",
    ]  # fmt: skip
    e = as_epoch(json.loads(json.dumps(line)))
    assert isinstance(e.schedule, ScheduleDecision) and e.schedule == ScheduleDecision.of(d)
    assert (
        e.to_json_dict()["schedule"] == line["schedule"] and e.schedule.config == d.config and e.schedule.ranking == ()
    )
    old = {k: v for k, v in line["schedule"].items() if k not in ("accumulation_steps", "micro_batch")}
    assert as_epoch({**line, "schedule": old}).to_json_dict()["schedule"] == old
    option = {"global_batch": 32, "n_workers": 1, "accumulation_steps": 1, "epoch_s": 0.5, "score": 0.5,
              "micro_batch": 32}  # fmt: skip
    ranked = as_epoch({**line, "schedule": {**line["schedule"], "ranking": [option]}})
    assert ranked.schedule is not None and ranked.schedule.ranking == (RankedOption(**option),)
    assert ranked.to_json_dict()["schedule"]["ranking"] == (option,)  # json.dumps writes the tuple as a list
    with pytest.raises(RecordError, match="epoch_s"):
        as_epoch({**line, "schedule": {**line["schedule"], "ranking": [{**option, "epoch_s": "fast"}]}})


def test_the_input_state_is_not_changed_and_epochs_come_in_order():
    state = initial_state("loss_ratio", 32).to_dict()  # as the checkpoint keeps it
    copy = json.loads(json.dumps(state))
    d0 = next_config(state, 0, [], Caps(100))
    assert state == copy
    d1 = next_config(d0.state, 1, [{"train_loss": 1.0, "steps": 3, "global_batch": 32, "n_workers": 1}], Caps(100))
    with pytest.raises(ValueError, match="already decided"):
        next_config(d1.state, 1, [{"train_loss": 1.0, "steps": 3}], Caps(100))
    assert json.loads(json.dumps(ScheduleDecision.of(d1).to_json_dict()))["global_batch"] == 32


def test_state_and_caps_from_the_spec():
    spec = spec_from_dict(
        {
            "train": {
                "batch_schedule": {
                    "kind": "geometric",
                    "factor": 3,
                    "every_epochs": 2,
                    "lr_rule": "sqrt",
                    "max_batch": 512,
                },
                "workers": {"min": 1, "max": 4},
            }
        }
    )
    state = state_from_spec(spec, 64)
    assert state.schedule == Geometric(factor=3.0, delay=5) and state.to_dict()["params"] == {"factor": 3.0, "delay": 5}
    assert (state.every_epochs, state.lr_rule, state.max_batch, state.b0) == (2, "sqrt", 512, 64)
    caps = caps_from_spec(spec, 64, 2, 1438, 200)
    assert caps == Caps(1438, 200, 1, 4, 32)  # batch_per_worker: the first local batch
    assert caps_from_spec(spec_from_dict({}), 64, 2, 1438, None) == Caps(1438, None, 2, 2, None)
    assert state_from_spec(spec_from_dict({}), 64).kind == "constant"


@pytest.mark.parametrize(
    "train, sentence",
    [
        (
            {"batch_schedule": {"kind": "geometric", "factor": 1}},
            "spec field 'train.batch_schedule.factor': must be greater than 1, not 1.0",
        ),
        (
            {"batch_schedule": {"kind": "geometric", "delay": 0}},
            "spec field 'train.batch_schedule.delay': must be at least 1, not 0",
        ),
        (
            {"batch_schedule": {"kind": "linear", "rate": 0}},
            "spec field 'train.batch_schedule.rate': must be greater than 0, not 0.0",
        ),
        (
            {"batch_schedule": {"kind": "adaptive", "band": 1}},
            "spec field 'train.batch_schedule.band': must be between 0 and 1 (exclusive), not 1.0",
        ),
        (
            {"batch_schedule": {"kind": "adaptive", "max_growth": 0.5}},
            "spec field 'train.batch_schedule.max_growth': must be at least 1, not 0.5",
        ),
        (
            {"batch_schedule": {"kind": "loss_ratio", "f_star": "nan"}},
            "spec field 'train.batch_schedule.f_star': must be a finite number, not nan",
        ),
        (
            {"batch_schedule": {"kind": "linear", "factor": 2}},
            "spec field 'train.batch_schedule.factor': it does not apply to schedule 'linear', whose only parameter "
            "is rate",
        ),
        (
            {"batch_schedule": {"factor": 2}},
            "spec field 'train.batch_schedule.factor': it does not apply to schedule 'constant', which takes no "
            "parameters",
        ),
        (
            {"batch_schedule": {"kind": "adaptive", "delay": 2}},
            "spec field 'train.batch_schedule.delay': it does not apply to schedule 'adaptive', whose parameters are "
            "min_batch, band and max_growth",
        ),
        (
            {"batch_schedule": {"kind": "geometric", "every_epochs": 0}},
            "spec field 'train.batch_schedule.every_epochs': input should be greater than or equal to 1",
        ),
        (
            {"batch_schedule": {"kind": "increase_instead_of_decay"}},
            "spec field 'train': batch schedule 'increase_instead_of_decay' grows the batch at train.lr_milestones, "
            "which is empty",
        ),
        (
            {"batch_schedule": {"kind": "increase_instead_of_decay"}, "lr_milestones": [3], "lr_gamma": 1},
            "spec field 'train': batch schedule 'increase_instead_of_decay' grows the batch by 1 / train.lr_gamma, "
            "which must be below 1",
        ),
        (
            {"batch_schedule": {"kind": "piecewise"}},
            "spec field 'train.batch_schedule': batch schedule 'piecewise' needs its parameter 'batches' (the global "
            "batch of each period, e.g. [64, 128, 64])",
        ),
        (
            {"batch_schedule": {"kind": "piecewise", "batches": []}},
            "spec field 'train.batch_schedule.batches': must be a non-empty list of integers, not []",
        ),
        (
            {"batch_schedule": {"kind": "piecewise", "batches": [64, 0]}},
            "spec field 'train.batch_schedule.batches': entry 1 must be at least 1, not 0",
        ),
        (
            {"batch_schedule": {"kind": "adaptive"}, "noise_scale": False},
            "spec field 'train': batch schedule 'adaptive' follows the gradient noise scale, which train.noise_scale "
            "false turns off",
        ),
        ({"workers": {"min": 3, "max": 2}}, "spec field 'train.workers': min (3) is above max (2)"),
        (
            {"workers": {"max": 2, "per_worker": 2}},
            "unknown field 'train.workers.per_worker' in the spec; check its spelling against the documented fields",
        ),
    ],
)
def test_bad_schedule_specs_are_one_sentence(train, sentence):
    with pytest.raises(SpecError) as err:
        spec_from_dict({"train": train})
    assert str(err.value) == sentence


def test_bad_kind_and_rule_name_the_choices():
    with pytest.raises(SpecError, match="'train.batch_schedule.kind' is 'cosine', but it must be 'constant', "):
        spec_from_dict({"train": {"batch_schedule": {"kind": "cosine"}}})
    with pytest.raises(SpecError, match="'train.batch_schedule.lr_rule' is 'cube', but it must be 'keep', "):
        spec_from_dict({"train": {"batch_schedule": {"lr_rule": "cube"}}})
    with pytest.raises(SpecError, match="batch schedule parameter 'rate': it does not apply to schedule 'geometric'"):
        initial_state("geometric", 32, {"rate": 1})
    with pytest.raises(SpecError, match="unknown batch schedule 'cosine'"):
        initial_state("cosine", 32)
    assert TrainSpec().batch_schedule is None and TrainSpec().workers is None


def test_a_configuration_that_still_fits_is_kept_and_one_that_no_longer_does_is_refitted():
    caps = Caps(dataset_size=1000, min_workers=1, max_workers=4, batch_per_worker=8)
    state = initial_state("constant", 17, every_epochs=5)
    d0 = next_config(state, 0, [], caps)
    assert (d0.global_batch, d0.n_workers) == (15, 3)  # ceil(17 / 8) = 3 workers, 17 rounded down to 15
    d1 = next_config(d0.state, 1, [{"train_loss": 1.0, "steps": 66}], caps)
    assert (d1.global_batch, d1.n_workers, d1.changed) == (15, 3, False)  # not 14 on ceil(15 / 8) = 2
    # the largest worker count drops to 2 between two boundaries (e.g. fewer Dask workers)
    d2 = next_config(d1.state, 2, [{"train_loss": 1.0, "steps": 66}] * 2, Caps(1000, None, 1, 2, 8))
    assert (d2.global_batch, d2.n_workers, d2.resize) == (14, 2, True)
    assert "no longer fits" in d2.reason


def test_the_batch_grows_through_accumulation_once_the_workers_are_at_their_most():
    """Issue #17, item 3: memory caps the local batch at 100 and the workers at 2; with up to
    4 accumulation steps the batch goes on doubling past 2 x 100 as k micro-batches of a
    share (the fewest k that split it, the planner's rule), to the cap 2 x 100 x 4 = 800."""
    caps = Caps(10_000, max_local_batch=100, min_workers=1, max_workers=2, batch_per_worker=64,
                max_accumulation_steps=4)  # fmt: skip
    ds = drive(initial_state("geometric", 64, {"factor": 2, "delay": 1}), caps, 5)
    assert col(ds, "global_batch") == [64, 128, 256, 512, 800, 800]
    assert col(ds, "n_workers") == [1, 2, 2, 2, 2, 2]
    assert col(ds, "accumulation_steps") == [1, 1, 2, 4, 4, 4]
    assert col(ds, "micro_batch") == [64, 64, 64, 64, 100, 100]
    assert col(ds, "capped_by") == [None, None, None, None, "memory", "memory"]
    assert col(ds, "changed") == [True, True, True, True, True, False]
    assert col(ds, "resize") == [False, True, False, False, False, False]
    assert "as 2 accumulated micro-batches of 64" in ds[2].reason
    assert ScheduleDecision.of(ds[3]).accumulation_steps == 4 and ScheduleDecision.of(ds[3]).micro_batch == 64
    # a share that no k up to the cap splits into fitting micro-batches is rounded down: 2 x 150 -> k 2 of 75
    odd = drive(initial_state("constant", 300), Caps(10_000, 80, 2, 2, None, 3), 0)[0]
    assert (odd.global_batch, odd.n_workers, odd.accumulation_steps, odd.micro_batch) == (300, 2, 2, 75)
    prime = drive(initial_state("constant", 2 * 151), Caps(10_000, 80, 2, 2, None, 3), 0)[0]
    assert (prime.global_batch, prime.accumulation_steps, prime.micro_batch) == (300, 2, 75)
    # without accumulation the same schedule stops at the memory's 2 x 100
    flat = drive(initial_state("geometric", 64, {"factor": 2, "delay": 1}), replace(caps, max_accumulation_steps=1), 3)
    assert col(flat, "global_batch") == [64, 128, 200, 200]
    assert col(flat, "accumulation_steps") == [1, 1, 1, 1]
    with pytest.raises(SpecError, match="max_accumulation_steps must be at least 1"):
        Caps(100, max_accumulation_steps=0)


def test_a_state_from_before_accumulation_decides_as_k_one():
    caps = Caps(10_000, 100, 1, 2, 64, 4)
    state = drive(initial_state("geometric", 64, {"factor": 2, "delay": 1}), caps, 1)[-1].state
    old = {k: v for k, v in state.to_dict().items() if k != "accumulation_steps"}
    d = next_config(old, 2, [{"train_loss": 1.0, "steps": 1, "global_batch": 128, "n_workers": 2}] * 2, caps)
    assert (d.global_batch, d.accumulation_steps, d.changed) == (256, 2, True)


# what a checkpoint of an earlier Tula (STATE_VERSION 1) holds after epoch 3's decision, and the
# decision it led to at epoch 4 (caps: 5000 samples, 100 per worker in memory, 1-2 workers)
_WRITTEN = {"version": 1, "b0": 64, "every_epochs": 1, "lr_rule": "keep", "max_batch": None, "lr_milestones": [],
            "lr_gamma": 0.1, "f0": None, "epoch": 3, "batch": 200, "workers": 2, "accumulation_steps": 1,
            "lr_decay": 1.0, "milestones_applied": 0}  # fmt: skip
_CHECKPOINTED = [
    (
        {**_WRITTEN, "kind": "loss_ratio", "params": {"f_star": 0.1}, "f0": 3.0},
        {"train_loss": 0.75, "steps": 25, "global_batch": 200, "n_workers": 2},
        (200, 2, 1.0, "loss ratio: 64 x (3 - 0.1) / (0.75 - 0.1); capped at 200 by the memory model"),
    ),
    (
        {
            **_WRITTEN,
            "kind": "increase_instead_of_decay",
            "params": {},
            "lr_milestones": [1, 2, 3],
            "lr_gamma": 0.5,
            "lr_decay": 0.390625,
            "milestones_applied": 3,
        },
        {"train_loss": 1.0, "steps": 25, "global_batch": 200, "n_workers": 2},
        (200, 2, 0.390625, "no LR milestone reached: batch stays 200 -> global batch 200 on 2 workers"),
    ),
    (
        {**_WRITTEN, "kind": "piecewise", "params": {"batches": [64, 160, 32]}, "every_epochs": 2, "batch": 160},
        {"train_loss": 1.0, "steps": 31, "global_batch": 160, "n_workers": 2},
        (32, 1, 1.0, "piecewise: entry 2 of [64, 160, 32] -> global batch 32 on 1 worker"),
    ),
]


@pytest.mark.parametrize("written, last_epoch, expected", _CHECKPOINTED, ids=[w["kind"] for w, _, _ in _CHECKPOINTED])
def test_a_state_a_checkpoint_holds_loads_and_decides_as_it_did(written, last_epoch, expected):
    """The schedule state as JSON (the checkpoint's): today's states load (typed, its
    parameters the schedule's fields), write back the same JSON, and decide as they did."""
    caps = Caps(dataset_size=5000, max_local_batch=100, min_workers=1, max_workers=2, batch_per_worker=100)
    state = ScheduleState.from_dict(json.loads(json.dumps(written)))
    assert state.to_dict() == written and state.kind == written["kind"] and STATE_VERSION == 1
    assert state.schedule.params() == written["params"]
    for given in (written, state):  # the JSON form (a checkpoint's) or the typed state
        d = next_config(given, 4, [last_epoch] * 4, caps)
        batch, workers, lr_multiplier, reason = expected
        assert (d.global_batch, d.n_workers, d.lr_multiplier) == (batch, workers, lr_multiplier)
        assert d.reason.startswith(reason) and d.state.epoch == 4
        assert json.loads(json.dumps(d.state.to_dict())) == {**written, "epoch": 4, "batch": batch, "workers": workers}
    with pytest.raises(SpecError, match="batch schedule state version 2 is not 1"):
        ScheduleState.from_dict({**written, "version": 2})


def test_each_schedules_fields_are_its_parameters_in_the_tables_order():
    for info in SCHEDULES.values():
        assert [f.name for f in dataclasses.fields(info.cls)] == [p.name for p in info.params], info.name
        assert dataclasses.is_dataclass(info.cls) and info.cls.__dataclass_params__.frozen
