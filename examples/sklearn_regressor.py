"""AdaDamp's example with Tula: a PyTorch regressor behind scikit-learn's API, trained with a
batch size that grows geometrically (GeoDamp) and workers that grow with it.

The paper's snippet (Holt & Sievert, "Training machine learning models faster with Dask",
section "Example usage") reads::

    est = DaskRegressor(module=HiddenLayer, module__features=10, optimizer=optim.Adadelta,
                        optimizer__weight_decay=1e-7, max_epochs=10)
    est.set_params(batch_size=GeoDamp, batch_size__delay=60, batch_size__factor=5)
    est.fit(X, y)

Here it is for :class:`tula.sklearn.TulaRegressor`, with the paper's Adadelta (at its
torch default ``lr=1.0``; any ``torch.optim`` class is an optimiser factory to Tula).  One
difference: the batch grows every ``--delay`` epochs (the paper's 60 is for 200-epoch runs) from ``--initial-batch``.
With ``--max-workers 2`` the worker count follows the batch (N = ceil(B / batch per worker),
at most 2), each change a new DDP world started from the last checkpoint.

    python examples/sklearn_regressor.py                      # 10 epochs, 1 to 2 local workers
    python examples/sklearn_regressor.py --cluster tcp://host:8786 --max-workers 8
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from sklearn.datasets import make_regression

from tula.sklearn import TulaRegressor


class HiddenLayer(nn.Module):
    """The paper's model: one hidden layer."""

    def __init__(self, features=4, hidden=2, out=1):
        super().__init__()
        self.hidden = nn.Linear(features, hidden)
        self.out = nn.Linear(hidden, out)

    def forward(self, x, *args, **kwargs):
        return self.out(F.relu(self.hidden(x)))


def main(argv: list[str] | None = None) -> TulaRegressor:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=4000)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--initial-batch", type=int, default=32)
    ap.add_argument("--delay", type=int, default=3, help="epochs between two growths of the batch")
    ap.add_argument("--factor", type=float, default=5, help="the batch is multiplied by this (the paper's 5)")
    ap.add_argument("--max-workers", type=int, default=2, help="workers grow with the batch up to this many")
    ap.add_argument("--cluster", default=None, help="a Dask scheduler address (default: processes on this machine)")
    args = ap.parse_args(argv)

    est = TulaRegressor(
        module=HiddenLayer,
        module__features=10,
        module__hidden=32,
        optimizer=optim.Adadelta,
        optimizer__weight_decay=1e-7,
        lr=1.0,
        max_epochs=args.epochs,
        random_state=0,
        verbose=1,
        cluster=args.cluster,
    )
    # GeoDamp: the batch x factor every `delay` epochs; the workers follow it
    est.set_params(
        batch_size="geometric",
        batch_size__initial=args.initial_batch,
        batch_size__delay=args.delay,
        batch_size__factor=args.factor,
        workers__max=args.max_workers,
        workers__batch_per_worker=4 * args.initial_batch,
    )

    X, y = make_regression(n_samples=args.samples, n_features=10, noise=1.0, random_state=0)
    X = torch.from_numpy(X.astype("float32"))
    y = torch.from_numpy((y / y.std()).astype("float32")).reshape(-1, 1)  # unit-variance targets for the MSE
    t0 = time.perf_counter()
    est.fit(X, y)
    print(
        f"fit in {time.perf_counter() - t0:.1f} s: {est.train_record_['steps_done']} model updates; "
        f"R^2 on the training data {est.score(X, y):.4f}, on the held-out 10 % {est.history_[-1]['test_r2']:.4f}"
    )
    print("global batch per epoch:", [h["global_batch"] for h in est.history_])
    print("workers per epoch:     ", [h["n_workers"] for h in est.history_])
    return est


if __name__ == "__main__":
    main()
