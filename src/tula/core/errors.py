"""Errors a user can cause, and how a run ends when it does not finish.

Each :class:`TulaError` carries one clear sentence; the CLI prints it and exits 2.
:class:`Interrupted` is not an error of the user's input: the CLI prints its sentence and
exits 130 (SIGINT) or 143 (SIGTERM).
"""

from __future__ import annotations

import signal as _signal
from collections.abc import Callable

#: why a rank of a distributed world failed; travels as data, never parsed from text
FAILURE_CAUSES = (
    "oom",
    "user_error",
    "crash",
    "lost_worker",
    "unreachable",
    "scheduler_lost",  # a Dask world's scheduler stopped answering its caller mid-run
    "timeout",
    "interrupted",
)


class TulaError(Exception):
    """Base class of every error caused by the user's input or environment."""


class SpecError(TulaError):
    """The job spec is invalid: a field has a value that is not allowed."""


class WorkloadError(TulaError):
    """The model or data set named in the spec cannot be built or loaded."""


class RecordError(TulaError):
    """A record (profile, models, plan, checkpoint) is missing, damaged or of the wrong kind."""


class InfeasibleError(TulaError):
    """No configuration satisfies the constraints (e.g. no batch fits in the memory budget)."""


class PlacementError(InfeasibleError):
    """A world cannot be placed: more ranks on a host than that host has GPUs (one rank per GPU)."""


class RunDirError(TulaError):
    """An output directory cannot be used: in use by another run, a file, or holding records."""


class WorkerError(TulaError):
    """A rank of a distributed run failed or died.

    ``cause`` is one of :data:`FAILURE_CAUSES` (the root cause's), ``rank`` the rank it
    happened on, ``details`` a traceback where there is one."""

    def __init__(self, message: str, rank: int | None = None, details: str = "", cause: str = "crash"):
        super().__init__(message)
        self.rank = rank
        self.details = details
        self.cause = cause


class Interrupted(Exception):
    """A run stopped because of SIGINT or SIGTERM; ``message`` says what was kept and how to
    continue.  ``exit_code`` is 128 + the signal number (130, 143)."""

    def __init__(self, message: str, signum: int = _signal.SIGINT):
        super().__init__(message)
        self.signum = int(signum)
        self.hint: str | None = None  # the command that continues the run, where the front knows it

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def signal_name(self) -> str:
        return _signal.Signals(self.signum).name


class OptionError(TulaError):
    """A refusal that names options of a request by their names in the core (``threshold``,
    ``min_workers``: a function's parameter, the JSON field an API takes), never by a front
    end's spelling: ``template`` holds ``{name}`` placeholders, each filled from ``options``
    (an option's name, or a tuple of names joined with ", ").  ``str()`` quotes the names
    (``'threshold' applies to ...``); :meth:`spelled` fills them with a front end's spelling
    of each (the CLI's flags: ``--threshold applies to ...``)."""

    def __init__(self, template: str, **options: str | tuple[str, ...]):
        self.template = template
        self.options = options
        super().__init__(self.spelled(lambda name: f"'{name}'"))

    def spelled(self, spell: Callable[[str], str]) -> str:
        """The sentence with each option named by ``spell(name)`` (only the ``{key}`` of an option
        is replaced: a value quoted in the sentence may hold braces)."""
        text = self.template
        for key, names in self.options.items():
            words = ", ".join(spell(n) for n in names) if isinstance(names, tuple) else spell(names)
            text = text.replace("{" + key + "}", words)
        return text


class SpecOptionError(OptionError, SpecError):
    """An :class:`OptionError` about the job spec (a field, or an option that sets one): caught
    as a :class:`SpecError` where one is, spelled by a front end as an :class:`OptionError`."""
