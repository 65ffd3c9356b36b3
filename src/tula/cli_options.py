"""The command line's names, in one place: the verbs in the order a user meets them, the help
panels, the old spellings refused before parsing (one table), the worker counts (one parser)
and the job spec a verb reads (a SPEC path or ``--example NAME``, one resolver).

No torch, no typer: :mod:`tula.cli` builds the commands from these; the tests walk the
commands it built and check them against these tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, overload

from tula.core.errors import TulaError

#: the verbs in the order a user meets them (``tula --help`` lists them so)
VERBS = (
    "run",
    "check",
    "examples",
    "profile",
    "fit",
    "plan",
    "train",
    "simulate",
    "report",
    "serve",
    "submit",
    "status",
    "replan",
    "spec",
)

# the help panels options are grouped in
IO = "Input and output"
CONFIG = "Configuration"
OBJECTIVE = "Objective, constraints and pricing"
CLUSTER = "Cluster"
NETWORK = "Network (what-if)"
SCHEDULE = "Schedule"
SERVICE = "Service"


@dataclass(frozen=True)
class Rename:
    """An old spelling ``old`` and what replaced it: ``new`` (a sentence's end, ``{value}``
    filled with the value the old option was given, if any)."""

    old: str
    new: str
    takes_value: bool = True


#: the spellings refused before parsing, on every verb, each with the sentence naming its new form
RENAMES = (
    Rename(
        "--cluster-sizes",
        "--cluster-sizes is now --workers, the worker counts to plan over (e.g. --workers {value})",
    ),
    Rename(
        "--price",
        "--price is now --pricing price_per_node_hour=VALUE (e.g. --pricing price_per_node_hour={value})",
    ),
    Rename(
        "--max-accumulation",
        "--max-accumulation is now --accumulation, the most accumulation steps a schedule may use "
        "(e.g. --accumulation {value})",
    ),
)
_EXAMPLE_VALUE = {"--cluster-sizes": "1,2,4", "--price": "3.2", "--max-accumulation": "4"}

#: the flags whose names are not the core's option name with "-" for "_" (``--{name}``): the
#: core names an option by its parameter (its JSON field), the command line by its flag
FLAGS = {
    "max_accumulation_steps": "--accumulation",
    "schedules": "--schedule",
    "train.accumulation_steps": "--accumulation",  # a spec field: spelled with its flag (:func:`spell`)
}


def flag(option: str) -> str:
    """The command line's flag for the core's option ``option`` (``"min_workers"``: ``--min-workers``)."""
    return FLAGS.get(option, "--" + option.replace("_", "-"))


#: the core's options that one verb alone takes, as a sentence names them: the command with its flag and an
#: example value (the core's ``history``, a training run to replay: ``tula simulate --history train.json``)
IN_A_SENTENCE = {"history": "tula simulate --history train.json"}


def spell(option: str) -> str:
    """How the command line names the core's option ``option`` in a sentence: its flag (an option
    one verb alone takes: the command, :data:`IN_A_SENTENCE`); a spec field
    (``train.accumulation_steps``) as itself, with the flag that sets it where one does
    (``train.accumulation_steps, --accumulation``)."""
    if option in IN_A_SENTENCE:
        return IN_A_SENTENCE[option]
    if "." not in option:
        return flag(option)
    return f"{option}, {FLAGS[option]}" if option in FLAGS else option


#: what ``--resume DIR`` continues, per verb (the flag form ``--resume`` alone is refused naming it)
RESUMES = {
    "run": "tula run --resume DIR (the run's directory)",
    "profile": "tula profile SPEC --resume DIR (the directory holding profile.json)",
    "train": "tula train SPEC --resume DIR (the directory holding checkpoint.pt)",
}


def verb_of(args: Sequence[str]) -> str | None:
    """The verb of a command line's arguments (after ``tula``): its first word that is not an option."""
    return next((a for a in args if not a.startswith("-")), None)


def refuse_old_spellings(args: Sequence[str]) -> None:
    """Raise :class:`~tula.core.errors.TulaError` with one sentence naming the new spelling when
    ``args`` (a command line after ``tula``) uses an old one: a renamed option, or ``--resume``
    given as a flag (no value, or another option after it) on a verb that continues a
    directory.  Arguments after ``--`` are values, not options."""
    verb = verb_of(args)
    args = list(args)
    if "--" in args:
        args = args[: args.index("--")]
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        for rename in RENAMES:
            if name == rename.old:
                value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
                if not value or value.startswith("-"):
                    value = _EXAMPLE_VALUE[rename.old]
                raise TulaError(rename.new.format(value=value))
        if arg == "--resume" and verb in RESUMES:
            following = args[i + 1] if i + 1 < len(args) else None
            if following is None or following.startswith("-"):
                raise TulaError(f"--resume takes the directory to continue: {RESUMES[verb]}")


def parse_counts(text: str | Sequence[int] | tuple) -> tuple[int, ...]:
    """``"1,2,4"`` into worker counts (ascending, each once): the type of ``--workers`` on every
    verb.  A count that is not a whole number of at least 1 is one sentence."""
    if isinstance(text, tuple):  # already parsed (a default, or click converting twice)
        return text
    from tula.core.simulate import parse_workers

    try:
        return parse_workers(text)
    except TulaError as err:
        raise TulaError(f"--workers: {err}") from None


def one_count(counts: tuple[int, ...] | None, verb: str) -> int | None:
    """The single worker count a verb that trains takes from ``--workers``."""
    if counts is None or len(counts) == 1:
        return None if counts is None else counts[0]
    given = ",".join(map(str, counts))
    raise TulaError(f"tula {verb} trains on one worker count, not {given}; give one, e.g. --workers {counts[0]}")


@overload
def spec_source(spec: Path | None, example: str | None, verb: str, optional: Literal[False] = False) -> Path: ...
@overload
def spec_source(spec: Path | None, example: str | None, verb: str, optional: bool) -> Path | None: ...


def spec_source(spec: Path | None, example: str | None, verb: str, optional: bool = False) -> Path | None:
    """The job spec a verb reads: ``SPEC`` or the shipped example ``--example NAME`` (exactly one
    of them; neither is allowed only when ``optional``).  An unknown example is one sentence
    (from :mod:`tula.examples`)."""
    if spec is not None and example is not None:
        raise TulaError(
            f"give a job spec or --example {example}, not both (tula {verb} SPEC, or tula {verb} --example NAME)"
        )
    if example is not None:
        import tula.examples as examples

        return examples.path(example)
    if spec is None and not optional:
        raise TulaError(
            f"give a job spec (tula {verb} SPEC), or one of the shipped examples (tula {verb} --example NAME; "
            "tula examples lists them)"
        )
    return spec


def spec_words(spec: Path | None, example: str | None) -> str:
    """How a command that continues names its spec again: ``--example NAME`` or the quoted path."""
    import shlex

    return f"--example {shlex.quote(example)}" if example is not None else shlex.quote(str(spec))


def epilog(*examples: str) -> str:
    """A verb's help ending: its examples, one per line (an opening bracket escaped: not rich markup)."""
    return "Examples\n\n" + "\n".join("  " + e.replace("[", "\\[") for e in examples)
