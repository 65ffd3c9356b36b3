"""One command line: one name and one type per idea across verbs, the old spellings refused with a
sentence naming the new one, help panels and examples, the verbs in the order a user meets them,
``--example``, ``tula examples``, ``tula spec schema`` and ``tula check``.

The names are read from the command tree typer builds (``typer.main.get_command``), not from
the source; what a command prints is checked through its entry point in this process
(:func:`helpers.tula_in_process`), as a user gets it: one sentence and exit code 2 for bad input.
"""

from __future__ import annotations

import json

import pytest
import yaml
from helpers import assert_refused, one_line, tula_in_process, write_spec

#: the ideas that must have one name and one type on every verb that takes them, and the verbs
#: that must take them (at least)
IDEAS = {
    "--resume": {"run", "profile", "train"},
    "--workers": {"run", "profile", "plan", "train", "simulate", "submit", "replan"},
    "--pricing": {"plan", "simulate", "replan"},
    "--accumulation": {"train", "simulate"},
    "--deadline": {"plan", "replan"},
    "--budget": {"plan", "replan"},
    "--epochs": {"run", "train", "simulate", "replan"},
    "--out": {"run", "profile", "fit", "plan", "train", "simulate", "spec schema"},
    "--force": {"run", "profile", "fit", "plan", "simulate", "examples copy", "spec schema"},
    "--cluster": {"run", "profile", "plan", "train", "serve"},
    "--objective": {"run", "plan", "submit", "replan"},
    "--method": {"plan", "train"},
    "--noise-scale": {"plan", "simulate", "replan"},
    "--search": {"run", "profile", "plan", "submit"},
    "--example": {"run", "check", "profile", "plan", "train", "submit"},
}


def _commands():
    """Every command of the tree as (its words after ``tula``, the click command)."""
    import typer

    from tula.cli import app

    root = typer.main.get_command(app)
    found = []

    def walk(cmd, words):
        subs = getattr(cmd, "commands", None)
        if words:
            found.append((" ".join(words), cmd))
        for name, sub in (subs or {}).items():
            walk(sub, [*words, name])

    walk(root, [])
    return root, found


def _options(cmd) -> dict:
    return {name: p for p in cmd.params for name in p.opts if name.startswith("--")}


def _kind(param) -> tuple:
    """What a user can give an option: its type (``X | None`` read as ``X``) and the parser behind
    it, flag or not, how many."""
    import types
    import typing

    d = param.type_descriptor
    ann = d.annotation
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        ann = tuple(a for a in typing.get_args(ann) if a is not type(None))
        ann = ann[0] if len(ann) == 1 else ann
    return (ann, d.parameter_info.parser, param.is_flag, param.multiple, param.nargs)


def test_one_name_and_one_type_per_idea_across_verbs():
    _, commands = _commands()
    for idea, must in IDEAS.items():
        having = {words: _options(cmd)[idea] for words, cmd in commands if idea in _options(cmd)}
        assert must <= set(having), (idea, sorted(must - set(having)))
        kinds = {words: _kind(p) for words, p in having.items()}
        assert len(set(kinds.values())) == 1, (idea, kinds)
    # --resume takes a directory everywhere (never a flag); --workers is the one worker-count parser
    _, cmds = _commands()
    resume = [_options(c)["--resume"] for _, c in cmds if "--resume" in _options(c)]
    assert all(not p.is_flag and p.metavar == "DIR" for p in resume)
    from tula.cli_options import parse_counts

    workers = [_options(c)["--workers"] for _, c in cmds if "--workers" in _options(c)]
    assert all(p.type_descriptor.parameter_info.parser is parse_counts for p in workers)


def test_the_old_spellings_exist_nowhere():
    from tula.cli_options import RENAMES

    _, commands = _commands()
    old = {r.old for r in RENAMES}
    assert old == {"--cluster-sizes", "--price", "--max-accumulation"}
    for words, cmd in commands:
        assert not old & set(_options(cmd)), (words, old & set(_options(cmd)))


def test_verbs_are_listed_in_the_order_a_user_meets_them_and_each_has_examples():
    import click

    from tula.cli_options import VERBS

    root, commands = _commands()
    listed = root.list_commands(click.Context(root))
    assert listed == [v for v in VERBS if v in listed]
    assert listed[:3] == ["run", "check", "examples"] and {"spec", "replan", "simulate"} <= set(listed)
    for words, cmd in commands:
        assert cmd.epilog and "Examples" in cmd.epilog, words
        assert "tula " in cmd.epilog.split("Examples", 1)[1], words
        first = (cmd.help or "").strip().splitlines()[0]
        assert first.endswith(".") and len(first) <= 100, (words, first)


@pytest.mark.parametrize("verb", ["run", "check", "profile", "plan", "train", "simulate", "replan", "examples copy"])
def test_help_at_100_columns_ends_with_its_examples_and_groups_options_in_panels(verb):
    r = tula_in_process(*verb.split(), "--help", env={"COLUMNS": "100"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.rstrip().splitlines()
    assert max(len(line) for line in lines) <= 100
    tail = "\n".join(lines[-6:])
    assert "Examples" in r.stdout and f"tula {verb}" in tail, r.stdout[-600:]
    if verb in ("run", "train", "simulate", "plan"):
        assert "Input and output" in r.stdout and ("Configuration" in r.stdout or "Schedule" in r.stdout)


# --------------------------------------------------------------------------- the old spellings, refused
@pytest.mark.parametrize(
    "args, sentence",
    [
        (("replan", "JOB", "--cluster-sizes", "1,2,4"), "--cluster-sizes is now --workers"),
        (("replan", "JOB", "--price", "7"), "--price is now --pricing price_per_node_hour=VALUE"),
        (("replan", "JOB", "--price=7"), "(e.g. --pricing price_per_node_hour=7)"),
        (("simulate", "m.json", "--max-accumulation", "4"), "--max-accumulation is now --accumulation"),
        (("train", "s.yaml", "--out", "o", "--resume"), "--resume takes the directory to continue: tula train SPEC"),
        (("train", "s.yaml", "--resume", "--epochs", "3"), "(the directory holding checkpoint.pt)"),
        (("profile", "s.yaml", "--resume", "--search", "full"), "tula profile SPEC --resume DIR"),
        (("run", "--resume"), "--resume takes the directory to continue: tula run --resume DIR"),
    ],
)
def test_an_old_spelling_is_one_sentence_naming_the_new_one(args, sentence):
    assert_refused(tula_in_process(*args), sentence)


def test_the_refusal_table_reads_options_not_values():
    from tula.cli_options import refuse_old_spellings
    from tula.core.errors import TulaError

    passing = (
        ["train", "s.yaml", "--resume", "runs/x", "--workers", "2"],  # the new forms
        ["run", "--", "--price"],  # after --: a value
        ["plan", "s.yaml", "--pricing", "price_per_node_hour=3"],  # --pricing is not --price
    )
    refused = [args for args in passing if _refusal(refuse_old_spellings, args, TulaError)]
    assert refused == [], refused
    # the same table refuses the old option itself
    assert _refusal(refuse_old_spellings, ["run", "--price", "3"], TulaError) == (
        "--price is now --pricing price_per_node_hour=VALUE (e.g. --pricing price_per_node_hour=3)"
    )


def _refusal(check, args, error) -> str | None:
    """The sentence ``check(args)`` refuses ``args`` with, or None when it lets them pass."""
    try:
        check(args)
    except error as err:
        return str(err)
    return None


def test_resume_on_the_wrong_kind_of_path_is_one_sentence(tmp_path, tiny_spec_dict):
    spec = write_spec(tmp_path, tiny_spec_dict)
    a_file = tmp_path / "f.txt"
    a_file.write_text("x")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_refused(
        tula_in_process("train", spec, "--resume", a_file), f"--resume '{a_file}' is a file; give the directory"
    )
    assert_refused(tula_in_process("train", spec, "--resume", empty), f"--resume '{empty}' holds no checkpoint.pt")
    assert_refused(
        tula_in_process("train", spec, "--resume", tmp_path / "none"), "is not a directory; give the directory"
    )
    assert_refused(tula_in_process("profile", spec, "--resume", a_file), "is a file; give the directory holding")
    assert_refused(tula_in_process("profile", spec, "--resume", empty), "holds no profile.json")
    assert_refused(tula_in_process("run", "--resume", a_file), "is a file, not a directory")
    # --resume DIR is the training directory: another --out is one sentence
    (empty / "checkpoint.pt").write_bytes(b"")
    assert_refused(
        tula_in_process("train", spec, "--resume", empty, "--out", tmp_path / "other"), "give the directory once"
    )
    assert not (tmp_path / "other").exists()


def test_workers_is_one_parser_and_train_takes_one_count(tmp_path, tiny_spec_dict):
    from tula.cli_options import parse_counts
    from tula.core.errors import TulaError

    assert parse_counts("4,1,2,2") == (1, 2, 4)
    with pytest.raises(TulaError, match="--workers: worker count 'two' is not a whole number"):
        parse_counts("1,two")
    spec = write_spec(tmp_path, tiny_spec_dict)
    assert_refused(
        tula_in_process("train", spec, "--workers", "1,2", "--batch", "64", "--out", tmp_path / "o"),
        "tula train trains on one worker count, not 1,2; give one, e.g. --workers 1",
    )
    assert_refused(tula_in_process("simulate", tmp_path / "m.json", "--workers", "1,x"), "worker count 'x'")
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- examples
def test_examples_lists_the_shipped_specs_and_copy_writes_one(tmp_path):
    import tula.examples as examples

    r = tula_in_process("examples", env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    for name in examples.names():
        assert name in r.stdout and one_line(examples.summary(name))[:40] in one_line(r.stdout)
    assert {"digits", "mnist1d"} <= set(examples.names())

    dest = tmp_path / "mine.yaml"
    r = tula_in_process("examples", "copy", "digits", dest)
    assert r.returncode == 0, r.stderr
    assert dest.read_text() == examples.path("digits").read_text()
    dest.write_text("# edited\n")
    assert_refused(tula_in_process("examples", "copy", "digits", dest), "already exists")
    assert dest.read_text() == "# edited\n"  # not overwritten
    assert tula_in_process("examples", "copy", "digits", dest, "--force").returncode == 0
    assert dest.read_text() == examples.path("digits").read_text()


@pytest.mark.parametrize(
    "args",
    [
        ("examples", "copy", "nope"),
        ("check", "--example", "nope"),
        ("run", "--example", "nope"),
        ("train", "--example", "nope", "--workers", "1", "--batch", "8"),
    ],  # fmt: skip
)
def test_an_unknown_example_is_one_sentence(tmp_path, args):
    err = assert_refused(tula_in_process(*args, cwd=tmp_path), "no example 'nope'")
    assert "digits" in err  # it names the ones there are
    assert list(tmp_path.iterdir()) == []


def test_spec_and_example_are_exactly_one(tmp_path, tiny_spec_dict):
    spec = write_spec(tmp_path, tiny_spec_dict)
    assert_refused(
        tula_in_process("check", spec, "--example", "digits"), "give a job spec or --example digits, not both"
    )
    assert_refused(tula_in_process("profile"), "give a job spec (tula profile SPEC), or one of the shipped examples")


# --------------------------------------------------------------------------- tula spec schema, tula check
def test_spec_schema_is_a_json_schema_that_the_examples_meet(tmp_path):
    from jsonschema import Draft202012Validator

    import tula.examples as examples

    r = tula_in_process("spec", "schema")
    assert r.returncode == 0, r.stderr
    schema = json.loads(r.stdout)
    Draft202012Validator.check_schema(schema)
    v = Draft202012Validator(schema)
    for name in examples.names():
        spec = yaml.safe_load(examples.path(name).read_text())
        assert not list(v.iter_errors(spec)), (name, [e.message for e in v.iter_errors(spec)])
    assert list(v.iter_errors({"name": "x", "epochs": "many"}))  # a wrong type fails it
    assert list(v.iter_errors({"name": "x", "no_such_field": 1}))  # and so does an unknown field

    out = tmp_path / "schema.json"
    assert tula_in_process("spec", "schema", "--out", out).returncode == 0
    assert json.loads(out.read_text()) == schema
    assert_refused(tula_in_process("spec", "schema", "--out", out), "already exists")


def test_check_an_example_prints_what_it_found_and_ok():
    r = tula_in_process("check", "--example", "digits", env={"COLUMNS": "120"})
    assert r.returncode == 0, r.stderr
    text = one_line(r.stdout)
    for word in ("small_cnn", "parameters", "digits", "1 x 8 x 8", "classes 10", "ok:"):
        assert word.replace(" ", "") in text.replace(" ", "").replace("│", ""), (word, r.stdout)


def test_check_counts_what_the_builders_build(tiny_spec_dict):
    from tula.core.spec import spec_from_dict
    from tula.engine.check import check_job
    from tula.engine.workloads import build_model

    job = spec_from_dict(tiny_spec_dict)
    found = check_job(job)
    model = build_model(job.model)
    assert found.parameters == sum(p.numel() for p in model.parameters())
    assert found.train_size + found.test_size == 1797  # scikit-learn's digits
    assert found.sample_shape == (1, 8, 8) and found.classes == 10


@pytest.mark.parametrize(
    "change, sentence",
    [
        ({"model": {"name": "alexnetz"}}, "unknown model 'alexnetz'"),
        ({"model": {"name": "small_cnn", "kwargs": {"num_classes": 3}}}, "set model.kwargs.num_classes"),
        ({"epochs": 0}, "epochs"),
        ({"model": {"name": "workers:no_such_factory"}}, "no_such_factory"),
    ],
)
def test_check_of_a_bad_spec_is_one_sentence(tmp_path, tiny_spec_dict, change, sentence):
    spec = write_spec(tmp_path, {**tiny_spec_dict, **change})
    assert_refused(tula_in_process("check", spec), sentence)
