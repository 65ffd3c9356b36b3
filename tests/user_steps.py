"""A user's own training steps for tests/test_step.py, named in a spec's ``train.step`` as a user
would (``user_steps:CountingStep``): the ranks import them from here (tests/ is on their path)."""

from __future__ import annotations

import os
from pathlib import Path

from tula.engine.step import TrainStep

#: the file (an environment variable, which the ranks inherit) each rank appends a line to per step
COUNT_FILE_ENV = "TULA_TEST_STEP_COUNTS"


class CountingStep(TrainStep):
    """The built-in step, with one line per call (``rank pid``) appended to the file
    :data:`COUNT_FILE_ENV` names: which processes ran it, and how often."""

    def train_step(self, batch, step=0, *, sync=True):
        path = os.environ.get(COUNT_FILE_ENV)
        if path:
            with Path(path).open("a") as fh:
                fh.write(f"{os.getpid()}\n")
        return super().train_step(batch, step, sync=sync)


class EpochCountingStep(TrainStep):
    """The built-in epoch, with one line per call (``pid steps``: the process and the steps the
    epoch ran) appended to the file :data:`COUNT_FILE_ENV` names: which processes ran training's
    epochs through this override, and how many steps each."""

    def run_epoch(self, batches, n_steps, **kwargs):
        ran = super().run_epoch(batches, n_steps, **kwargs)
        path = os.environ.get(COUNT_FILE_ENV)
        if path:
            with Path(path).open("a") as fh:
                fh.write(f"{os.getpid()} {ran.steps}\n")
        return ran


class HalvedLossStep(TrainStep):
    """A step whose update follows half the loss: with plain SGD, half the step."""

    def forward_backward(self, x, y, *, sync=True, accumulation_steps=None):
        loss_fn = self.loss_fn
        self.loss_fn = lambda out, target: 0.5 * loss_fn(out, target)
        try:
            return super().forward_backward(x, y, sync=sync, accumulation_steps=accumulation_steps)
        finally:
            self.loss_fn = loss_fn


class NotAStep:
    """A class that is not a :class:`TrainStep`."""
