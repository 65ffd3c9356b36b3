"""A configuration to train at, as one value: :class:`Config`.

A configuration is the number of workers N, the global batch B and the gradient
accumulation steps k: each worker's share of a step, B / N samples (its local batch), runs
as k micro-batches of b = B / (N k).  Which configuration a job trains at is decided in one
place, :func:`tula.core.job_rules.train_config`, for every front.
"""

from __future__ import annotations

from dataclasses import dataclass

from tula.core.errors import SpecError, SpecOptionError


@dataclass(frozen=True)
class Config:
    """A configuration: ``n_workers`` (N), ``global_batch`` (B), ``accumulation_steps`` (k).

    N and k are at least 1 (else one sentence, as :func:`tula.core.job_rules.check_train_config`
    says it); whether B splits over them is :meth:`problem` / :meth:`check`, since the first
    configuration of a batch schedule is only where the schedule starts (its first decision
    may still round B).

    Parameters
    ----------
    n_workers : int
        The number of workers N.
    global_batch : int
        The global batch B: the samples of one optimizer step, over all workers.
    accumulation_steps : int
        Micro-batches per step on each worker, k (1: none).

    Raises
    ------
    SpecError
        If N or k is below 1.
    """

    n_workers: int
    global_batch: int
    accumulation_steps: int = 1

    def __post_init__(self) -> None:
        if self.n_workers < 1:
            raise SpecError(f"the number of workers must be at least 1, not {self.n_workers}")
        if self.accumulation_steps < 1:
            raise SpecError(f"the number of accumulation steps must be at least 1, not {self.accumulation_steps}")

    @property
    def local_batch(self) -> int:
        """A worker's share of a step, B / N (rounded down where it does not split)."""
        return self.global_batch // self.n_workers

    @property
    def micro_batch(self) -> int:
        """The samples of one forward and backward pass, b = B / (N k) (rounded down where it
        does not split)."""
        return self.local_batch // self.accumulation_steps

    def refusal(self) -> SpecError | None:
        """Why the batch does not split over the workers and the accumulation steps, as the
        error :meth:`check` raises (its option named as the spec's field,
        ``train.accumulation_steps``: a front end spells it); ``None`` when it does."""
        n, b, k = self.n_workers, self.global_batch, self.accumulation_steps
        if b < n or b % n:
            return SpecError(f"global batch {b} does not split evenly over {n} workers")
        if (b // n) % k:
            return SpecOptionError(
                f"global batch {b} on {n} worker(s) gives each worker {b // n} samples a step, "
                f"which do not split into {k} equal micro-batches ({{accumulation}}); "
                "choose accumulation steps that divide the share, or another batch",
                accumulation="train.accumulation_steps",
            )
        return None

    def problem(self) -> str | None:
        """The sentence saying why the batch does not split over the workers and the
        accumulation steps (:meth:`refusal`'s); ``None`` when it does."""
        refusal = self.refusal()
        return None if refusal is None else str(refusal)

    def check(self) -> Config:
        """This configuration, or :meth:`refusal`'s error."""
        refusal = self.refusal()
        if refusal is not None:
            raise refusal
        return self
