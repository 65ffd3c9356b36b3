"""Errors a user can cause. Each carries one clear sentence; the CLI prints it and exits 2."""


class TulaError(Exception):
    """Base class of every error caused by the user's input or environment."""


class SpecError(TulaError):
    """The job spec is invalid: a field has a value that is not allowed."""


class WorkloadError(TulaError):
    """The model or data set named in the spec cannot be built or loaded."""


class RecordError(TulaError):
    """A JSON record (profile, models, plan) is missing, unreadable or of the wrong kind."""


class InfeasibleError(TulaError):
    """No configuration satisfies the constraints (e.g. no batch fits in the memory budget)."""


class WorkerError(TulaError):
    """A worker process of a distributed run failed or died."""

    def __init__(self, message: str, rank: int | None = None, details: str = ""):
        super().__init__(message)
        self.rank = rank
        self.details = details
