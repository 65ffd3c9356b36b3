"""``train.workers: {rule: plan}`` in real 2-rank runs (#30): the worker count at each batch
change is the one the models rank best, a new world starts where it changes, and the ranking
behind each choice is in the run's record.  The models here are written by hand, so that what
they prefer is known; the runs and their worlds are real."""

import pytest
from helpers import local_launcher, models_record

from tula.core.errors import SpecError
from tula.core.perfmodel import PerfModel
from tula.core.spec import spec_from_dict
from tula.engine.train import train

DIGITS_TRAIN = 1438  # the tiny spec's training samples


def _spec(tiny_spec_dict, epochs: int = 3):
    d = dict(tiny_spec_dict, epochs=epochs)
    d["train"] = {
        "warmup_epochs": 0,
        "batch_schedule": {"kind": "geometric", "factor": 2, "delay": 1},
        "workers": {"min": 1, "max": 2, "rule": "plan"},
    }
    return spec_from_dict(d)


def _models(perf: PerfModel) -> dict:
    return models_record(perf, dataset_size=DIGITS_TRAIN)


def _trained(run):
    return [(h.global_batch, h.n_workers) for h in run.history]


@pytest.mark.slow
def test_the_world_grows_where_the_models_say_two_workers_are_faster(tiny_spec_dict, tmp_path):
    # 1 ms + 10 us per sample, 0.1 ms per ring hop: one worker is best at B = 32, two from B = 64 on
    perf = PerfModel("ring", 1_000, 1e-3, 1e-5, alpha=1e-4)
    run = train(_spec(tiny_spec_dict), "lbt", 1, 32, tmp_path, launcher=local_launcher(), models=_models(perf))
    assert _trained(run) == [(32, 1), (64, 2), (128, 2)]
    # the dashboard's epoch-time chart marks the new world where it started (epoch 2)
    from tula.core.run_costs import compare_with_plan
    from tula.service.dashboard_charts import train_charts

    charts = train_charts(compare_with_plan(run, _models(perf)))
    assert charts.count("<title>new world: N=2, B=64</title>") == 1, charts
    assert [(g.n_workers, g.world, g.new_world) for g in run.generations] == [
        (1, 1, True),
        (2, 2, True),
        (2, 2, False),
    ]
    # each decision's ranking is in the epoch's record, and what trained next is its choice
    for h, nxt in zip(run.history, run.history[1:]):
        ranking = h.schedule.ranking
        assert (ranking[0].global_batch, ranking[0].n_workers) == (nxt.global_batch, nxt.n_workers)
        assert ranking[0].epoch_s < ranking[1].epoch_s


@pytest.mark.slow
def test_over_a_slow_link_the_world_stays_on_one_worker(tiny_spec_dict, tmp_path):
    # the communication-bound case: 4.5 MB of gradients over 100 Mbit/s
    perf = PerfModel("ring", 4_500_000, 1e-3, 1e-5, alpha=1e-4, beta=8 / 100e6)
    run = train(_spec(tiny_spec_dict), "lbt", 1, 32, tmp_path, launcher=local_launcher(), models=_models(perf))
    assert _trained(run) == [(32, 1), (64, 1), (128, 1)]
    assert {g.world for g in run.generations} == {1}


def test_the_plan_rule_without_models_is_refused_before_any_world(tiny_spec_dict, tmp_path):
    with pytest.raises(SpecError) as err:
        train(_spec(tiny_spec_dict), "lbt", 1, 32, tmp_path / "out", launcher=local_launcher())
    assert str(err.value) == (
        "train.workers.rule 'plan' chooses the worker count from the fitted models, and this run has none: "
        "`tula run` passes them; give `tula train` the run's models.json with 'models'"
    )
    from tula.cli_options import spell  # the core names the option (train's argument); the command line, its flag

    assert err.value.spelled(spell).endswith("give `tula train` the run's models.json with --models")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.slow
def test_the_goodput_schedule_moves_the_batch_with_the_measured_noise_scale(tiny_spec_dict, tmp_path):
    from tula.core.live_plan import Ranker, choose_goodput
    from tula.core.schedules import Caps

    d = dict(tiny_spec_dict, epochs=3)
    d["train"] = {"warmup_epochs": 0, "batch_schedule": {"kind": "goodput", "max_growth": 2}}
    perf = PerfModel("ring", 1_000, 1e-2, 1e-4)  # 0.1 ms x (100 + B) per step: the best batch is near sqrt(100 B_noise)
    models = _models(perf)
    # two workers (the noise scale needs two batch sizes: a rank's and the world's), kept: no train.workers
    run = train(spec_from_dict(d), "lbt", 2, 32, tmp_path, launcher=local_launcher(), models=models)
    ranker, caps = Ranker(models, "lbt"), Caps(DIGITS_TRAIN, min_workers=2, max_workers=2)
    assert len({h.global_batch for h in run.history}) > 1, run.history  # the batch moved
    for h, nxt in zip(run.history, run.history[1:]):
        assert h.b_simple is not None and h.b_simple > 0  # measured in the epoch, on the ranks
        assert "goodput: " in h.schedule.reason
        # what trained next is the goodput choice for the B_simple the epoch measured
        want = choose_goodput(ranker, caps, h.global_batch, 2, h.b_simple, 32, min_batch=32)
        assert nxt.global_batch == want.option.global_batch, (h.b_simple, want.reason)
    # goodput over the epochs: the dashboard's chart and train.png's panel
    from tula.core.live_plan import goodput_per_epoch
    from tula.report import plot_training
    from tula.service.dashboard_charts import train_charts

    rows = goodput_per_epoch(run)
    assert [r.epoch for r in rows] == [2, 3] and all(r.measured > 0 for r in rows), rows
    assert "Goodput: useful samples per second" in train_charts(run)
    plot_training(run, tmp_path / "train.png")
    assert (tmp_path / "train.png").stat().st_size > 10_000


def test_tula_train_without_models_is_refused_and_a_damaged_models_file_is_one_sentence(tiny_spec_dict, tmp_path):
    from helpers import assert_refused, tula_in_process, write_spec

    d = dict(tiny_spec_dict, epochs=2)
    d["train"] = {"batch_schedule": {"kind": "geometric", "factor": 2, "delay": 1},
                  "workers": {"min": 1, "max": 2, "rule": "plan"}}  # fmt: skip
    spec = write_spec(tmp_path, d)
    r = tula_in_process("train", spec, "--batch", 32, "--out", tmp_path / "out")
    assert_refused(r, "train.workers.rule 'plan' chooses the worker count from the fitted models")
    bad = tmp_path / "models.json"
    bad.write_text('{"kind": "tula.models", "version": 1')
    r = tula_in_process("train", spec, "--batch", 32, "--models", bad, "--out", tmp_path / "out2")
    assert_refused(r, str(bad))


@pytest.mark.slow
def test_tula_train_with_the_runs_models_trains_where_they_rank_best(tiny_pipeline, tmp_path):
    """The CLI path: ``tula train --models`` of a real run's fitted models."""
    from helpers import tula_in_process, write_spec

    d = tiny_pipeline.spec_dict(epochs=2)
    d["train"] = {"warmup_epochs": 0, "batch_schedule": {"kind": "geometric", "factor": 2, "delay": 1},
                  "workers": {"min": 1, "max": 2, "rule": "plan"}}  # fmt: skip
    spec = write_spec(tmp_path, d)
    models = tiny_pipeline.dir / "models.json"
    r = tula_in_process("train", spec, "--method", "lbt", "--batch", 32, "--models", models, "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    run = json.loads((tmp_path / "out" / "train.json").read_text())
    first = run["history"][0]
    best = first["schedule"]["ranking"][0]
    assert (run["history"][1]["global_batch"], run["history"][1]["n_workers"]) == (
        best["global_batch"],
        best["n_workers"],
    )
    # beside each epoch, the plan's prediction for its (B, N, k), and in the plot
    assert all(h["predicted_epoch_s"] > 0 and h["measured_to_predicted"] > 0 for h in run["history"])
    from tula.core.records import load_train
    from tula.report import training_figure

    titles = [ax.get_title() for ax in training_figure(load_train(tmp_path / "out" / "train.json")).axes]
    assert any(t.startswith("epoch time: measured / predicted") for t in titles), titles


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["plan rule", "goodput"])
def test_a_run_resumed_from_its_last_checkpoint_decides_what_the_uninterrupted_run_did(
    tiny_spec_dict, tmp_path, schedule
):
    """The decisions after a resume are the same as without it: the plan rule's worker count
    (from the models), and the goodput schedule's batch (from the B_simple the checkpoint
    carries and the epoch measures), the trained configurations and losses equal.  Killed
    after epoch 3 of 4: epoch 4 and the decision after it run in the resumed process."""
    import shutil

    from tula.engine.checkpoint import CHECKPOINT, PREVIOUS, load_checkpoint

    if schedule == "plan rule":  # the world grows from B = 64 on (test above)
        spec, n, perf = _spec(tiny_spec_dict, 4), 1, PerfModel("ring", 1_000, 1e-3, 1e-5, alpha=1e-4)
    else:  # the batch moves with the measured B_simple (test above)
        d = dict(tiny_spec_dict, epochs=4)
        d["train"] = {"warmup_epochs": 0, "batch_schedule": {"kind": "goodput", "max_growth": 2}}
        spec, n, perf = spec_from_dict(d), 2, PerfModel("ring", 1_000, 1e-2, 1e-4)
    ref = train(spec, "lbt", n, 32, tmp_path / "a", launcher=local_launcher(), models=_models(perf))
    (tmp_path / "b").mkdir()
    shutil.copyfile(tmp_path / "a" / PREVIOUS, tmp_path / "b" / CHECKPOINT)  # killed after epoch 3
    assert load_checkpoint(tmp_path / "b")["epoch"] == 3
    resumed = train(spec, "lbt", n, 32, tmp_path / "b", resume=True, launcher=local_launcher(), models=_models(perf))
    assert resumed.resumed_from_epoch == 3
    assert len(set(_trained(ref))) > 2, _trained(ref)  # decisions that changed the run, after the resume too
    assert _trained(resumed) == _trained(ref), (_trained(resumed), _trained(ref))
    assert [h.schedule.reason for h in resumed.history] == [h.schedule.reason for h in ref.history]
    assert [h.train_loss for h in resumed.history] == [h.train_loss for h in ref.history]
