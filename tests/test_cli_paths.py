"""The command paths no other test tries (issue #27, item 3): ``tula fit`` and ``tula plan`` of a
profile as commands, and their refusal of a partial one; ``tula profile --resume`` with a
changed spec; the client verbs (``submit``, ``status --state/--limit``, ``replan`` with price,
cluster sizes, epochs and noise scale) with ``--token``; ``tula serve`` on a port in use;
``tula simulate --history/--pricing/--noise-scale``.

They read the session's finished pipeline (``tiny_pipeline``) and profile nothing.  The
commands run in this process (``tula_in_process``: the same entry point, the same exit codes)
except ``serve`` on a port in use, where the real process's exit code and output are the
point.  The client verbs talk to one real ``tula serve`` for the module, with a token and no
runners (``TULA_RUN_JOBS=false``): a submitted job stays queued, nothing trains."""

from __future__ import annotations

import io
import json
import socket
from pathlib import Path

import pytest
import yaml
from helpers import assert_refused, one_line, run_tula, tula_in_process, write_spec
from service_helpers import Service, seed_finished_job

TOKEN = "paths-token"


# --------------------------------------------------------------------------- Ctrl-C in any command
def test_ctrl_c_where_a_command_has_no_handler_of_its_own_is_exit_130_with_a_sentence(
    tiny_spec_dict, tmp_path, monkeypatch
):
    """typer turns a KeyboardInterrupt inside a command into the return value 130 when it is
    not in standalone mode; the command line must not read that as success (it did: exit 0,
    nothing said, for a Ctrl-C while `tula submit --wait` started following, or a second
    Ctrl-C while `tula train` stopped)."""
    from tula import cli

    def ctrl_c(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "load_spec", ctrl_c)  # Ctrl-C while the spec is read
    r = tula_in_process("profile", write_spec(tmp_path, tiny_spec_dict), "--out", tmp_path / "p")
    assert r.returncode == 130
    assert one_line(r.stderr).startswith("interrupted: stopped at once by SIGINT")
    assert "Traceback" not in r.stderr and not (tmp_path / "p").exists()


# --------------------------------------------------------------------------- fit and plan of a profile
def _partial(tiny_pipeline, dest, how: str):
    """A copy of the pipeline's profile record as a profile that did not finish: ``how`` is
    the field a stopped (``interrupted``), failed (``failed``) or running (``in_progress``)
    profile has."""
    dest.mkdir()
    rec = tiny_pipeline.record("profile.json")
    rec[how] = True if how == "in_progress" else "the 2-worker run did not finish within 10 s"
    (dest / "profile.json").write_text(json.dumps(rec))
    return dest / "profile.json"


def _profile_alone(tiny_pipeline, tmp_path: Path) -> Path:
    """The session pipeline's profile.json alone in a folder of its own (no models, no plan)."""
    (tmp_path / "p").mkdir()
    prof = tmp_path / "p" / "profile.json"
    prof.write_bytes((tiny_pipeline.dir / "profile.json").read_bytes())
    return prof


def test_fit_of_a_profile_writes_the_models_the_pipeline_fitted(tiny_pipeline, tmp_path):
    prof = _profile_alone(tiny_pipeline, tmp_path)
    r = tula_in_process("fit", prof)
    assert r.returncode == 0, r.stderr
    assert "models written to" in one_line(r.stdout)
    assert json.loads((tmp_path / "p" / "models.json").read_text()) == tiny_pipeline.record("models.json")
    # a second fit does not overwrite the first without --force
    again = tula_in_process("fit", prof)
    assert_refused(again, "already exists and was not written by this command; pass --force")


def test_plan_of_a_profile_fits_and_plans_as_the_pipeline_did(tiny_pipeline, tmp_path):
    prof = _profile_alone(tiny_pipeline, tmp_path)
    r = tula_in_process("plan", prof)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "p" / "models.json").read_text()) == tiny_pipeline.record("models.json")
    assert json.loads((tmp_path / "p" / "plan.json").read_text()) == tiny_pipeline.record("plan.json")
    assert "plan written to" in one_line(r.stdout)


def test_the_stages_take_a_record_typed_or_as_a_dict_and_write_the_same_file(tiny_pipeline, tmp_path):
    """A producer may hand a stage its typed record or (before it is converted) a dict: the file
    written is the same, and the models planned over other workers keep the type they came in."""
    from tula.core.job_rules import spec_with
    from tula.core.records import MODELS_KIND, ModelsRecord, load_models, load_profile, load_record
    from tula.pipeline import is_partial, plan_stage, profiled_trials, with_spec

    typed, as_dict = load_models(tiny_pipeline.dir / "models.json"), tiny_pipeline.record("models.json")
    plan_stage(typed, "time", tmp_path / "typed.json")
    plan_stage(as_dict, "time", tmp_path / "dict.json")
    assert (tmp_path / "typed.json").read_text() == (tmp_path / "dict.json").read_text()
    assert json.loads((tmp_path / "typed.json").read_text())["objective"] == "time"
    spec = spec_with(typed.spec, search=typed.spec.search.model_copy(update={"cluster_sizes": [1]}))
    assert isinstance(with_spec(typed, spec), ModelsRecord) and with_spec(typed, spec).spec == spec
    assert with_spec(as_dict, spec) == {**as_dict, "spec": spec.to_dict()}
    assert load_record(tiny_pipeline.dir / "models.json", expect=(MODELS_KIND,))["spec"] == typed.spec.to_dict()
    prof = load_profile(tiny_pipeline.dir / "profile.json")
    partial = _partial(tiny_pipeline, tmp_path / "p", "interrupted")
    assert not is_partial(prof) and not is_partial(tiny_pipeline.record("profile.json"))
    assert is_partial(load_profile(partial)) and is_partial(json.loads(partial.read_text()))
    assert profiled_trials(prof) == profiled_trials(tiny_pipeline.record("profile.json")) == len(prof.trials)


@pytest.mark.parametrize("how", ["interrupted", "failed", "in_progress"])
@pytest.mark.parametrize("verb", ["fit", "plan"])
def test_fit_and_plan_refuse_a_partial_profile_and_write_nothing(tiny_pipeline, tmp_path, verb, how):
    prof = _partial(tiny_pipeline, tmp_path / "p", how)
    r = tula_in_process(verb, prof)
    assert_refused(r, f"{prof} is a partial profile (its trials did not all finish)")
    assert f"`tula profile SPEC --resume {prof.parent}` first" in one_line(r.stderr)
    assert not (prof.parent / "models.json").exists() and not (prof.parent / "plan.json").exists()


def test_profile_resume_with_a_changed_spec_is_refused_and_keeps_the_record(tiny_pipeline, tmp_path):
    prof = _partial(tiny_pipeline, tmp_path / "p", "interrupted")
    before = prof.read_bytes()
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(tiny_pipeline.spec_dict(epochs=3)))
    r = tula_in_process("profile", changed, "--resume", prof.parent)
    assert_refused(r, f"{prof} was profiled from another spec than {changed}; give that spec")
    assert prof.read_bytes() == before
    # and nothing to resume is its own sentence
    (tmp_path / "none").mkdir()
    r = tula_in_process("profile", changed, "--resume", tmp_path / "none")
    assert_refused(r, f"--resume '{tmp_path / 'none'}' holds no profile.json; give the directory holding the profile")
    assert not (tmp_path / "none" / "profile.json").exists()
    # a file where the directory belongs: one sentence naming it
    assert_refused(tula_in_process("profile", changed, "--resume", prof), f"--resume '{prof}' is a file")


# --------------------------------------------------------------------------- the client verbs
@pytest.fixture(scope="module")
def token_service(tmp_path_factory, tiny_pipeline):
    """A real ``tula serve`` with a token and no runners, its store holding the finished tiny
    job (``service.seeded``, its id)."""
    home = tmp_path_factory.mktemp("cli-paths-service") / "home"
    home.mkdir()
    seeded = seed_finished_job(home, tiny_pipeline.dir)
    s = Service(home, token=TOKEN, env={"TULA_RUN_JOBS": "false"}).start()
    s.seeded = seeded
    yield s
    s.stop()


def _client_args(service, token=TOKEN):
    return ("--server", service.url, *(("--token", token) if token is not None else ()))


def _rendered(renderable) -> str:
    """What the CLI's console prints for ``renderable``, on one line."""
    from rich.console import Console

    from tula.cli_console import console

    buf = io.StringIO()
    Console(file=buf, width=console.width, soft_wrap=console.soft_wrap).print(renderable)
    return one_line(buf.getvalue())


def test_replan_sends_price_cluster_sizes_epochs_and_noise_scale(token_service, tiny_pipeline):
    """The printed plan is the plan of the stored models with all four options, and each option
    changes it (a dropped option would print another table)."""
    from tula.report import plan_table
    from tula.service.replan import Replan, replan_from_models

    models = tiny_pipeline.record("models.json")
    body = {
        "objective": "cost_to_accuracy",
        "pricing": {"kind": "fixed", "price_per_node_hour": 7.0},
        "cluster_sizes": [1, 2, 4],
        "epochs": 5,
        "noise_scale": 5.0,
    }
    expected = replan_from_models(models, Replan(**body))
    table = _rendered(plan_table(expected))
    for left_out in ("pricing", "cluster_sizes", "epochs", "noise_scale"):
        other = replan_from_models(models, Replan(**{k: v for k, v in body.items() if k != left_out}))
        assert _rendered(plan_table(other)) != table, left_out
    args = (
        "--objective",
        "cost_to_accuracy",
        "--pricing",
        "price_per_node_hour=7",
        "--workers",
        "1,2,4",
        "--epochs",
        "5",
    )
    r = tula_in_process("replan", token_service.seeded, *args, "--noise-scale", "5", *_client_args(token_service))
    assert r.returncode == 0, r.stderr
    assert table in one_line(r.stdout)
    assert one_line(expected.reason) in one_line(r.stdout)


@pytest.mark.parametrize("objective, limit", [("cost", "deadline"), ("time", "budget")])
def test_replan_sends_deadline_and_budget(token_service, tiny_pipeline, objective, limit):
    """--deadline and --budget reach the service's re-plan as its body takes them: a deadline just
    above the fastest configuration's time moves the cheapest choice there, and a budget just
    above the cheapest's cost moves the fastest choice there."""
    from tula.report import plan_table
    from tula.service.replan import Replan, replan_from_models

    models = tiny_pipeline.record("models.json")
    free = replan_from_models(models, Replan(objective=objective))
    rows = [c for c in free.configurations if c.feasible]
    value = 1.001 * min(c.total_time_s if limit == "deadline" else c.cost for c in rows)
    given = f"{value:.6f}s" if limit == "deadline" else f"{value:.9g}"
    expected = replan_from_models(models, Replan(objective=objective, **{limit: given}))
    assert _rendered(plan_table(expected)) != _rendered(plan_table(free))  # the limit changes the choice
    r = tula_in_process(
        "replan", token_service.seeded, "--objective", objective, f"--{limit}", given, *_client_args(token_service)
    )
    assert r.returncode == 0, r.stderr
    assert _rendered(plan_table(expected)) in one_line(r.stdout)


def test_replan_use_measured_prints_the_plan_scaled_by_the_finished_runs_ratio(token_service, tiny_pipeline):
    from tula.core.records import TrainRecord
    from tula.core.run_costs import measured_ratio
    from tula.service.replan import Replan, replan_from_models

    models, run = tiny_pipeline.record("models.json"), tiny_pipeline.record("train/train.json")
    expected = replan_from_models(models, Replan(objective="time", use_measured=True), run)
    measured = measured_ratio(TrainRecord.from_dict(run), models)
    assert measured is not None and expected.to_json_dict()["measured_ratio"]["ratio"] == measured.ratio
    r = tula_in_process("replan", token_service.seeded, "--objective", "time", "--use-measured",
                        *_client_args(token_service))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert one_line(expected.reason) in one_line(r.stdout) and "epochs scaled by" in one_line(r.stdout)


@pytest.mark.parametrize(
    "args, sentence",
    [
        (("--workers", "1,two"), "--workers: worker count 'two' is not a whole number"),
        (("--epochs", "0"), "the service answered 422: field 'epochs'"),
        (("--noise-scale", "-5"), "the service answered 422: field 'noise_scale'"),
        (("--pricing", "price_per_node_hour=-1"), "--pricing: 'pricing.price_per_node_hour'"),
        (("--deadline", "soon"), "--deadline: "),
        (("--budget", "-1"), "--budget must be a non-negative amount, not -1.0"),
    ],
)
def test_replan_bad_options_are_one_sentence(token_service, args, sentence):
    assert_refused(tula_in_process("replan", token_service.seeded, *args, *_client_args(token_service)), sentence)


def test_status_state_and_limit(token_service, tiny_spec_dict, tmp_path):
    c = token_service.client()
    mine = [c.post("/v1/jobs", json={"spec": dict(tiny_spec_dict, name=f"q{i}")}).json()["id"] for i in range(2)]
    queued = c.get("/v1/jobs", params={"state": "queued", "limit": 500}).json()
    assert queued["jobs"][0]["id"] == mine[-1] and queued["total"] >= 2  # newest first

    r = tula_in_process("status", "--state", "queued", "--limit", "1", *_client_args(token_service))
    assert r.returncode == 0, r.stderr
    out = one_line(r.stdout)
    assert f"Tula jobs (1 of {queued['total']})" in out
    assert mine[-1] in out and mine[0] not in out and token_service.seeded not in out

    r = tula_in_process("status", "--state", "done", *_client_args(token_service))
    assert r.returncode == 0, r.stderr
    out = one_line(r.stdout)
    assert token_service.seeded in out and not any(j in out for j in mine)

    bad = tula_in_process("status", "--state", "finished", *_client_args(token_service))
    assert_refused(bad, "the service answered 422: field 'state'")
    assert_refused(
        tula_in_process("status", "--limit", "0", *_client_args(token_service)),
        "the service answered 422: field 'limit'",
    )


@pytest.mark.parametrize("verb", ["submit", "status", "replan"])
def test_the_client_verbs_carry_the_token(token_service, tiny_pipeline, tmp_path, monkeypatch, verb):
    """Each verb gets through with --token (or $TULA_TOKEN), and is refused without it or with a
    wrong one: one sentence, exit 2."""
    monkeypatch.delenv("TULA_TOKEN", raising=False)
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(tiny_pipeline.spec_dict(name="by-token")))
    args = {
        "submit": (spec, "--no-train"),
        "status": (token_service.seeded,),
        "replan": (token_service.seeded, "--objective", "time"),
    }[verb]
    total = token_service.client().get("/v1/jobs").json()["total"]
    for token in (None, "wrong-token"):
        r = tula_in_process(verb, *args, *_client_args(token_service, token))
        assert_refused(r, "the service answered 401: this service needs 'Authorization: Bearer <token>'")
    assert token_service.client().get("/v1/jobs").json()["total"] == total  # a refused submit made no job

    r = tula_in_process(verb, *args, *_client_args(token_service))
    assert r.returncode == 0, r.stderr
    if verb == "submit":
        job_id = one_line(r.stdout).split("submitted job ")[1].split()[0]
        assert token_service.client().get(f"/v1/jobs/{job_id}").json()["spec"]["name"] == "by-token"
    else:
        assert "choice" in r.stdout
    monkeypatch.setenv("TULA_TOKEN", TOKEN)  # the default of --token
    r = tula_in_process(verb, *args, *_client_args(token_service, None))
    assert r.returncode == 0, r.stderr


# --------------------------------------------------------------------------- serve on a port in use
def test_serve_on_a_port_in_use_exits_2_with_one_sentence(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = run_tula("serve", "--port", port, "--home", tmp_path / "home", timeout=120)
    err = assert_refused(r, f"the service cannot listen on 127.0.0.1:{port} (Address already in use")
    assert "choose another --port" in err


# --------------------------------------------------------------------------- simulate's options
def _simulate(tiny_pipeline, tmp_path, *args):
    """``tula simulate`` of the pipeline's models (a PNG of its own each call)."""
    out = tmp_path / f"sim-{len(list(tmp_path.glob('sim-*')))}.png"
    r = tula_in_process("simulate", tiny_pipeline.dir / "models.json", "--out", out, *args)
    if r.returncode == 0:
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return r


def _expected(
    models, workers, batch=None, schedules=(), history=None, pricing=None, noise_scale=None, epochs=None
) -> list[str]:
    """The title and tables ``tula simulate`` prints for these inputs, each on one line."""
    from tula.core.simulate import parse_collectives, parse_schedule, simulator_from_models, what_if
    from tula.report import simulation_tables

    sim = simulator_from_models(models, epochs=epochs, pricing=pricing)
    scheds = [(text, *parse_schedule(text)) for text in schedules]
    w = what_if(models, sim, workers, parse_collectives(None), batch, scheds, history, noise_scale=noise_scale)
    return [one_line(w.title), *(_rendered(t) for t in simulation_tables(sim, w.rows, sim.pricing.unit))]


def test_simulate_history_replays_a_training_runs_losses(tiny_pipeline, tmp_path):
    """Over 3 epochs the batch after epoch 2 follows the run's loss ratio F(w1) / F(w2)."""
    models, run = tiny_pipeline.record("models.json"), tiny_pipeline.record("train/train.json")
    train_json = tiny_pipeline.dir / "train" / "train.json"
    args = ("--schedule", "loss_ratio", "--workers", "1,2", "--epochs", "3")
    r = _simulate(tiny_pipeline, tmp_path, *args, "--history", train_json)
    assert r.returncode == 0, r.stderr
    printed = one_line(r.stdout)
    replayed = _expected(models, (1, 2), schedules=["loss_ratio"], history=run["history"], epochs=3)
    for part in replayed:
        assert part in printed, part
    # other losses lead to other batches: the history is what the schedule followed
    steeper = [dict(h, train_loss=h["train_loss"] / 4**i) for i, h in enumerate(run["history"])]
    assert _expected(models, (1, 2), schedules=["loss_ratio"], history=steeper, epochs=3)[1:] != replayed[1:]
    # without a history there are no losses to follow; a record of another kind is named
    nothing = _simulate(tiny_pipeline, tmp_path, "--schedule", "loss_ratio")
    assert_refused(nothing, "give a training run's record to replay (tula simulate --history train.json)")
    bad = _simulate(tiny_pipeline, tmp_path, "--schedule", "loss_ratio", "--history", tiny_pipeline.dir / "plan.json")
    assert_refused(bad, "is a plan record, but a training run record is needed here")


def test_simulate_pricing_prices_the_rows(tiny_pipeline, tmp_path):
    models = tiny_pipeline.record("models.json")
    ten_x = models["spec"]["pricing"]["price_per_node_hour"] * 10
    r = _simulate(
        tiny_pipeline, tmp_path, "--workers", "1,2", "--batch", "64", "--pricing", f"price_per_node_hour={ten_x}"
    )
    assert r.returncode == 0, r.stderr
    printed = one_line(r.stdout)
    priced = _expected(models, (1, 2), 64, pricing={"price_per_node_hour": ten_x})
    for part in priced:
        assert part in printed, part
    assert priced != _expected(models, (1, 2), 64)  # the price shows in the rows
    refused = _simulate(tiny_pipeline, tmp_path, "--pricing", "price_per_node_hour")
    assert_refused(refused, "--pricing 'price_per_node_hour' is not KEY=VALUE")
    assert_refused(
        _simulate(tiny_pipeline, tmp_path, "--pricing", "kind=barter"), "--pricing: 'pricing.kind' is 'barter'"
    )


def test_simulate_noise_scale_is_the_b_noise_of_the_time_to_accuracy(tiny_pipeline, tmp_path):
    models = tiny_pipeline.record("models.json")
    r = _simulate(tiny_pipeline, tmp_path, "--workers", "1,2", "--batch", "64", "--noise-scale", "5")
    assert r.returncode == 0, r.stderr
    printed = one_line(r.stdout)
    what_if = _expected(models, (1, 2), 64, noise_scale=5.0)
    for part in what_if:
        assert part in printed, part
    assert "(B_noise 5, a what-if)" in what_if[0]
    assert what_if[1:] != _expected(models, (1, 2), 64)[1:]  # the profiled B_noise gives other rows
    refused = _simulate(tiny_pipeline, tmp_path, "--noise-scale", "-5")
    assert_refused(refused, "the noise scale must be a positive number of samples, not -5")


# --------------------------------------------------------------------------- TULA_LOG_EVERY_S
def test_the_log_interval_is_read_from_the_environment_and_a_bad_one_is_one_sentence(
    tiny_pipeline, tmp_path, monkeypatch
):
    from tula.cli_console import LOG_STEP_EVERY_S, log_step_every_s
    from tula.core.errors import SpecError

    monkeypatch.delenv("TULA_LOG_EVERY_S", raising=False)
    assert log_step_every_s() == LOG_STEP_EVERY_S == 2.0
    monkeypatch.setenv("TULA_LOG_EVERY_S", "30")
    assert log_step_every_s() == 30.0
    for bad in ("0", "-1", "nan", "inf", "soon"):
        monkeypatch.setenv("TULA_LOG_EVERY_S", bad)
        with pytest.raises(SpecError, match="is not a positive number of seconds"):
            log_step_every_s()
    # a command refuses it in one sentence and writes nothing
    prof = _profile_alone(tiny_pipeline, tmp_path)
    r = tula_in_process("fit", prof)
    assert_refused(r, "TULA_LOG_EVERY_S='soon' is not a positive number of seconds")
    assert not (tmp_path / "p" / "models.json").exists()
