"""What measuring the gradient noise scale costs per step: the same 2-rank training with
``train.noise_scale`` true (a DDP comm hook that takes each bucket's local squared norm
before the all-reduce, the synchronised gradient's squared norm, and one one-element
all-reduce per step) and false (DDP's built-in all-reduce, nothing else), interleaved.

Prints, per model and setting, the trained step time (median of the epochs after the first,
epoch time / steps), and the ratio on/off per round and its median.  Target (issue #9):
the noise scale "at no extra communication beyond one small all-reduce"; we call a median
ratio within 1.05 negligible, and otherwise keep it switchable (it is: train.noise_scale).

    python bench/noise_scale_cost.py [--rounds 3] [--epochs 4]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

from tula.core.records import TrainRecord
from tula.core.spec import spec_from_dict
from tula.engine.launch import LocalLauncher
from tula.engine.train import train

MODELS = {
    # conv net of the demo: few parameters, short steps (the per-step overhead shows most)
    "small_cnn w32 (digits)": (
        {"name": "small_cnn", "kwargs": {"in_channels": 1, "num_classes": 10, "width": 32}},
        {"name": "digits"},
        128,
    ),
    # more parameters per step: the per-parameter norms and the extra copy scale with them
    "mlp 64-1024-10 (digits)": (
        {"name": "mlp", "kwargs": {"in_features": 64, "hidden": 1024, "num_classes": 10}},
        {"name": "digits"},
        128,
    ),
}


def step_s(run: TrainRecord) -> float:
    epochs = run.history[1:] or run.history
    return statistics.median(h.epoch_time_s / h.steps for h in epochs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=4)
    args = ap.parse_args()
    launcher = LocalLauncher(device="cpu", threads_per_worker=1)
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M')} on {platform.node()} ({platform.processor() or platform.machine()}), "
        f"2 ranks, gloo, {args.rounds} rounds x {args.epochs} epochs"
    )
    for label, (model, data, batch) in MODELS.items():
        ratios, on_s, off_s = [], [], []
        for r in range(args.rounds):
            times = {}
            for on in (True, False) if r % 2 == 0 else (False, True):  # interleaved, order alternating
                spec = spec_from_dict(
                    {
                        "name": "gns-cost",
                        "model": model,
                        "data": data,
                        "epochs": args.epochs,
                        "train": {"warmup_epochs": 0, "noise_scale": on},
                    }
                )
                with tempfile.TemporaryDirectory() as tmp:
                    run = train(spec, "lbt", 2, batch, Path(tmp) / "out", launcher=launcher)
                times[on] = step_s(run)
                if on:
                    assert run.history[-1].b_simple is not None
            on_s.append(times[True])
            off_s.append(times[False])
            ratios.append(times[True] / times[False])
            print(
                f"{label:26s} round {r + 1}: step {times[True] * 1e3:7.2f} ms with the noise scale, "
                f"{times[False] * 1e3:7.2f} ms without, ratio {ratios[-1]:.3f}"
            )
        med = statistics.median(ratios)
        print(
            f"{label:26s} median: {statistics.median(on_s) * 1e3:.2f} ms vs {statistics.median(off_s) * 1e3:.2f} ms,"
            f" ratio {med:.3f} ({'within' if med <= 1.05 else 'ABOVE'} 1.05)"
        )


if __name__ == "__main__":
    main()
