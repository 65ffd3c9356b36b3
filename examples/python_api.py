"""Tula from Python: your model, data, loss and optimiser as Python objects, through the whole
pipeline (profile, fit, plan, train) with progress through a callback.

    .venv/bin/python examples/python_api.py           # 5 epochs, on 1 or 2 workers
    .venv/bin/python examples/python_api.py --quick   # a quick try: 1 epoch, on 1 worker, short trials

The functions below could live in a notebook: they travel to the ranks as cloudpickle files
(or by their import path where they have one).  Each run writes a new directory under runs/.
"""

import functools
import sys
import time

import torch
from torch import nn

import tula
from tula.core.events import EpochFinished, Event, StageStarted, TrialFinished


def make_model() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 3))


def make_data(n: int = 1200, seed: int = 0) -> dict:
    """Any map-style torch Datasets: here 4x4 'images' in three classes."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 4, 4, generator=g)
    y = (x.flatten(1).sum(1) > 0).long() + (x[:, 0, 0, 0] > 1).long()
    full = torch.utils.data.TensorDataset(x, y)
    cut = n * 4 // 5
    return {"train": torch.utils.data.Subset(full, range(cut)), "test": torch.utils.data.Subset(full, range(cut, n)),
            "num_classes": 3}  # fmt: skip


class SmoothedCrossEntropy(nn.Module):
    def forward(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(out, target, label_smoothing=0.1)


def show(stage: str, event: Event) -> None:
    if isinstance(event, StageStarted | TrialFinished | EpochFinished):  # a typed event; to_json_dict: plain values
        print(stage, {k: v for k, v in event.to_json_dict().items() if k in ("type", "n_workers", "global_batch",
                                                                              "status", "epoch", "train_loss",
                                                                              "test_top1")})  # fmt: skip


if __name__ == "__main__":
    quick = "--quick" in sys.argv
    job = tula.Job(
        {
            "name": "python-api",
            "epochs": 1 if quick else 5,
            "search": {"cluster_sizes": [1] if quick else [1, 2], "min_batch": 32, "max_batch": 256},
            "profile": {"min_timed_s": 0, "noise_steps": 0} if quick else {},  # quick: shorter, rougher trials
        },
        model=make_model,
        data=make_data,
        loss=SmoothedCrossEntropy,
        optimizer=functools.partial(torch.optim.SGD, momentum=0.9, nesterov=True),  # Tula sets its lr
        out=time.strftime("runs/python-api-%Y%m%d-%H%M%S"),  # a run directory holds one training run
        on_event=show,
    )
    job.profile()
    job.fit()
    plan = job.plan("knee")
    print("choice:", plan.reason)
    run = job.train()
    print("final test top-1:", run.history[-1].test_top1)
