"""Planning while training (issue #30) on emulated hosts: does ``train.workers: {rule: plan}``
beat AdaDamp's rule where the link is slow, cost nothing where it is fast, and does the goodput
schedule reach a target accuracy as fast as the best fixed plan?

Needs root (network namespaces: ``tests/emulated_hosts.py``).  For each link rate (default
100 Mbit/s and 1 Gbit/s, ``htb``-shaped both ways on every host's link) it makes 2 emulated
hosts with one Dask worker each and, for each model (default the communication-bound ``mlp``:
hidden 1024 on digits, 4.5 MB of gradients per step):

1. profiles it (``tula profile --search full``, N in {1, 2}, B 32..256) and fits the models;
2. trains, for each seed, ``--epochs`` epochs with each strategy, from the head host through
   ``--cluster <scheduler>`` and ``--models``:

   * ``fixed``: the plan's choice (objective ``time``) at a constant batch;
   * ``adadamp``: a geometric schedule 32 -> 64 -> 128 (x2 per epoch, capped at 128) with
     ``workers: {min: 1, max: 2, batch_per_worker: 32}`` (AdaDamp's rule: N = ceil(B / 32));
   * ``plan``: the same schedule with ``workers: {min: 1, max: 2, rule: plan}``;
   * ``goodput``: ``batch_schedule: {kind: goodput}`` from 32 with ``rule: plan``;

3. reads from each run's record the time to the target test accuracy (the epochs' wall
   times summed up to the first epoch at or above it; "-" when never reached), the same
   with each new world's start added (the wall time a user waits: a change of N restarts
   the world from the checkpoint, which the epochs' times leave out), and each epoch's
   measured time against the plan's prediction at its (B, N, k).  A second table gives the
   medians over the seeds and AdaDamp's rule's time over ``rule: plan``'s, both ways.

Targets (issue #30): ``plan`` at least 1.5x faster than ``adadamp`` where the link is slow and
never more than 5 % slower where it is fast; ``goodput`` within 5 % of ``fixed``'s
time-to-target, or faster; each generation's predicted epoch time within 10 % of the measured.
The 2 emulated hosts share this machine's 2 cores: at N = 2 the ranks' compute contends for
them, which no real cluster has.  ``--pin`` puts host k's worker (and so its ranks) on core
k - 1 (``EmulatedHosts(pin_cores=True)``): each rank of N = 2 then has a core of its own, as on
separate hosts, and a run against the same run unpinned shows the shared cores' share of
each error (the head's command, the scheduler and the links' packet processing still float).

Run:  sudo .venv/bin/python bench/plan_while_training.py [--rates 100,1000] [--seeds 0] [--epochs 6]
      [--data digits,mnist1d] [--models mlp,small_cnn] [--pin]   (MNIST-1D: small_cnn1d; the MLP is digits only)
Prints its table; ``--json`` writes the rows (docs/benchmarks-history.md's section is written by hand from them).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from emulated_hosts import EmulatedHosts, why_unavailable  # noqa: E402

from tula.core.fit import fit_models  # noqa: E402
from tula.core.plan import make_plan  # noqa: E402
from tula.core.records import EpochRecord, TrainRecord, load_profile, load_train, save_record  # noqa: E402
from tula.core.run_costs import measured_epoch_s  # noqa: E402

console = Console(width=150)
TULA = str(Path(sys.executable).parent / "tula")
SECTION = "## Planning while training (`bench/plan_while_training.py`, issue #30)"

MODELS = {  # per data set: the model spec each name stands for
    "digits": {
        "mlp": {"name": "mlp", "kwargs": {"in_features": 64, "hidden": 1024, "num_classes": 10}},
        "small_cnn": {"name": "small_cnn", "kwargs": {"in_channels": 1, "num_classes": 10, "width": 16}},
    },
    "mnist1d": {  # MNIST-1D needs a convolution: the MLP stays near 0.6 in 6 epochs (small_cnn1d: 0.96)
        "small_cnn": {"name": "small_cnn1d", "kwargs": {"num_classes": 10}},
    },
}
DATA = {"digits": {"name": "digits"}, "mnist1d": {"name": "mnist1d", "num_samples": 4000}}
#: the test accuracy each data set's time is measured to (small_cnn1d at B = 32 on one worker: 0.91 after 3 epochs)
TARGETS = {"digits": 0.97, "mnist1d": 0.85}
GEOMETRIC = {"kind": "geometric", "factor": 2, "delay": 1, "max_batch": 128}
STRATEGIES = {
    "fixed": None,  # the plan's choice, constant
    "adadamp": {"batch_schedule": GEOMETRIC, "workers": {"min": 1, "max": 2, "batch_per_worker": 32}},
    "plan": {"batch_schedule": GEOMETRIC, "workers": {"min": 1, "max": 2, "rule": "plan"}},
    "goodput": {"batch_schedule": {"kind": "goodput"}, "workers": {"min": 1, "max": 2, "rule": "plan"}},
}


def base_spec(model: str, epochs: int, seed: int, data: str = "digits") -> dict:
    return {
        "name": f"pwt-{data}-{model}",
        "model": MODELS[data][model],
        "data": DATA[data],
        "epochs": epochs,
        "seed": seed,
        "search": {"cluster_sizes": [1, 2], "min_batch": 32, "max_batch": 256},
        "profile": {"warmup_steps": 2, "timed_steps": 6, "threads_per_worker": 1},
        "collective": "ring",
        "cluster": {"pg_timeout_s": 120},
        "train": {"warmup_epochs": 0, "ags": {"b_small": 8}},  # AGS (the default) measures B_simple on 1 worker
    }


def run_on_head(h: EmulatedHosts, args: list, what: str) -> float:
    t0 = time.perf_counter()
    r = h.run([TULA, *map(str, args), "--cluster", h.scheduler_address], timeout=3600)
    if r.returncode != 0:
        raise SystemExit(f"{what} failed ({r.returncode}): {r.stderr[-2000:]}\n{h.log_tail()}")
    return time.perf_counter() - t0


def time_to_target(history: list[EpochRecord], target: float) -> float | None:
    """Seconds of training (the epochs' wall times) until the first epoch whose test accuracy
    is at least ``target``; None when none reaches it."""
    total = 0.0
    for h in history:
        total += measured_epoch_s(h)
        if (h.test_top1 or 0.0) >= target:
            return total
    return None


def wall_to_target(run: TrainRecord, target: float) -> float | None:
    """Wall seconds of training until the first epoch whose test accuracy is at least
    ``target``, world starts included: the epochs' wall times as :func:`time_to_target` sums
    them, plus, for each generation begun by then, the part of its ``wall_s`` that none of its
    epochs holds (a new world's start: processes, the process group, the checkpoint read).
    None when no epoch reaches it or the record has no generations."""
    history, gens = run.history, run.generations or []
    if not gens:
        return None
    ends = [g.from_epoch for g in gens[1:]] + [history[-1].epoch + 1]
    total = 0.0
    for g, end in zip(gens, ends):
        epochs = [h for h in history if g.from_epoch <= h.epoch < end]
        total += max(0.0, (g.wall_s or 0.0) - sum(measured_epoch_s(h) for h in epochs))
        for h in epochs:
            total += measured_epoch_s(h)
            if (h.test_top1 or 0.0) >= target:
                return total
    return None


def one_rate(rate: float, model: str, args, out: Path, data: str = "digits") -> list[dict]:
    rows = []
    target = args.target if args.target is not None else TARGETS[data]
    tag = f"{data}-{model}"
    with EmulatedHosts(n_hosts=2, rate_mbit=rate, pin_cores=args.pin) as h:
        spec = base_spec(model, args.epochs, 0, data)
        spec_path = out / f"{tag}-{rate:g}.yaml"
        spec_path.write_text(yaml.safe_dump(spec))
        prof_path = out / f"{tag}-{rate:g}-profile.json"
        t = run_on_head(h, ["profile", spec_path, "--search", "full", "--out", prof_path, "--force"], "profile")
        console.print(f"{tag} at {rate:g} Mbit/s: profiled in {t:.0f} s")
        models = fit_models(load_profile(prof_path))
        models_path = out / f"{tag}-{rate:g}-models.json"
        save_record(models, models_path)
        choice = make_plan(models, "time").choice
        for seed in args.seeds:
            for name, train in STRATEGIES.items():
                s = base_spec(model, args.epochs, seed, data)
                if train is not None:
                    s["train"] = {**s["train"], **train}
                path = out / f"{tag}-{rate:g}-{name}-{seed}.yaml"
                path.write_text(yaml.safe_dump(s))
                run_dir = out / f"{tag}-{rate:g}-{name}-{seed}"
                shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run each time
                cmd = ["train", path, "--models", models_path, "--out", run_dir]
                if name == "fixed":
                    cmd += ["--workers", choice.n_workers, "--batch", choice.global_batch]
                else:
                    cmd += ["--batch", 32]
                wall = run_on_head(h, cmd, f"training {name}")
                run = load_train(run_dir / "train.json")
                hist = run.history
                ratios = [measured_epoch_s(e) / e.predicted_epoch_s for e in hist[1:] if e.predicted_epoch_s]
                row = {
                    "rate_mbit": rate,
                    "model": model,
                    "data": data,
                    "target": target,
                    "seed": seed,
                    "strategy": name,
                    "configs": " ".join(f"{e.global_batch}/{e.n_workers}" for e in hist),
                    "train_s": sum(measured_epoch_s(e) for e in hist),
                    "to_target_s": time_to_target(hist, target),
                    "wall_to_target_s": wall_to_target(run, target),
                    "world_starts": sum(1 for g in run.generations or [] if g.new_world),
                    "final_acc": hist[-1].test_top1,
                    "median_measured_to_predicted": statistics.median(ratios) if ratios else None,
                    # each generation's epoch after the first, for the accuracy statistics (bench/_stats.py)
                    "epochs": [
                        {
                            "config": (e.global_batch, e.n_workers),
                            "predicted_s": e.predicted_epoch_s,
                            "measured_s": measured_epoch_s(e),
                        }
                        for e in hist[1:]
                        if e.predicted_epoch_s
                    ],
                    "command_s": wall,
                }
                rows.append(row)
                console.print(
                    f"  {name:8s} seed {seed}: {row['configs']}  {row['train_s']:.1f} s, "
                    f"to {target:.0%}: {_s(row['to_target_s'])} s (wall, {row['world_starts']} world start(s): "
                    f"{_s(row['wall_to_target_s'])} s), "
                    f"measured/predicted {row['median_measured_to_predicted']}"
                )
    return rows


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def table(rows: list[dict]) -> Table:
    t = Table(title="time to the target test accuracy (s), per strategy; B/N per epoch")
    for c in ("link", "data", "model", "seed", "strategy", "B/N per epoch", "training s", "target", "to target s",
              "wall to target s", "world starts", "final acc", "measured / predicted"):  # fmt: skip
        t.add_column(c)
    for r in rows:
        t.add_row(
            f"{r['rate_mbit']:g} Mbit/s", r.get("data", "digits"), r["model"], str(r["seed"]), r["strategy"],
            r["configs"], f"{r['train_s']:.1f}", f"{r.get('target', 0):.2f}",
            _s(r["to_target_s"]), _s(r.get("wall_to_target_s")), str(r.get("world_starts", "-")),
            f"{r['final_acc']:.3f}", "-" if r["median_measured_to_predicted"] is None
            else f"{r['median_measured_to_predicted']:.2f}",
        )  # fmt: skip
    return t


def _median_s(xs: list[float | None]) -> float | None:
    """The median over seeds, a seed that never reached the target counted as the slowest
    (None when most never did)."""
    m = statistics.median([float("inf") if x is None else x for x in xs])
    return None if m == float("inf") else m


def summary(rows: list[dict]) -> Table:
    """Per link, data set and model: each strategy's median time to the target over the seeds,
    the epochs' and the wall's, and AdaDamp's rule's over ``rule: plan``'s (the issue's 1.5x)."""
    t = Table(title="median over seeds: to target s (epochs) / (wall, world starts included)")
    for c in ("link", "data", "model", "fixed", "adadamp", "plan", "goodput", "adadamp / plan (epochs, wall)"):
        t.add_column(c)
    cells: dict[tuple, dict[str, list[dict]]] = {}
    for r in rows:
        cell = cells.setdefault((r["rate_mbit"], r.get("data", "digits"), r["model"]), {})
        cell.setdefault(r["strategy"], []).append(r)
    for (rate, data, model), by in cells.items():
        med = {k: (_median_s([r["to_target_s"] for r in v]), _median_s([r.get("wall_to_target_s") for r in v]))
               for k, v in by.items()}  # fmt: skip
        ratios = []
        for i in (0, 1):
            a, p = med.get("adadamp", (None, None))[i], med.get("plan", (None, None))[i]
            ratios.append("-" if a is None or p is None or p <= 0 else f"{a / p:.2f}")
        t.add_row(
            f"{rate:g} Mbit/s", data, model,
            *(f"{_s(med[k][0])} / {_s(med[k][1])}" if k in med else "" for k in ("fixed", "adadamp", "plan", "goodput")),
            ", ".join(ratios),
        )  # fmt: skip
    return t


def stat_lines(rows: list[dict]) -> list[str]:
    """The accuracy as the field states it (``bench/_stats.py``), per data set, model and link and over
    all: mean, median, p95 and max of ``|predicted / measured - 1|`` over every generation's epoch
    after a run's first, beside a noise floor from the same runs: consecutive epochs of one
    configuration (the same B and N) in one run, which the prediction cannot tell apart."""
    from _stats import describe, error_stats, noise_floor  # bench/, the folder the script runs from

    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(f"{r['data']}, {r['model']}, {r['rate_mbit']:g} Mbit/s", []).append(r)
    if len(groups) > 1:
        groups["all"] = rows
    out = []
    for label, rs in groups.items():
        eps = [e for r in rs for e in r.get("epochs", [])]
        if not eps:
            continue
        pairs = [
            (a["measured_s"], b["measured_s"])
            for r in rs
            for a, b in zip(r["epochs"], r["epochs"][1:])
            if tuple(a["config"]) == tuple(b["config"])
        ]
        noise = noise_floor(*zip(*pairs, strict=True)) if pairs else None
        stats = error_stats([e["predicted_s"] for e in eps], [e["measured_s"] for e in eps])
        out.append(describe(f"each generation's epoch, {label}", stats, noise))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="100,1000", help="link rates in Mbit/s, comma-separated")
    ap.add_argument("--data", default="digits", help=f"comma-separated, of {', '.join(DATA)}")
    ap.add_argument("--models", default="mlp", help="comma-separated, of mlp (digits only) and small_cnn")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--target", type=float, default=None,
                    help=f"the test accuracy the time is measured to (default per data set: {TARGETS})")  # fmt: skip
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-plan-while-training")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here")
    ap.add_argument("--pin", action="store_true",
                    help="each host's worker on a core of its own (host k on core k - 1): no compute contention between the ranks")  # fmt: skip
    args = ap.parse_args()
    args.seeds = [int(s) for s in args.seeds.split(",")]
    why = why_unavailable()
    if why:
        raise SystemExit(f"bench/plan_while_training.py: {why}")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for data in args.data.split(","):
        for model in args.models.split(","):
            if model not in MODELS[data]:
                console.print(f"{model} on {data}: not run (this benchmark has no such model for {data})")
                continue
            for rate in (float(r) for r in args.rates.split(",")):
                rows += one_rate(rate, model, args, args.out, data)
    console.print(table(rows))
    console.print(summary(rows))
    for line in stat_lines(rows):
        console.print(line, highlight=False, soft_wrap=True)
    pinned = "each host's worker on a core of its own" if args.pin else "the hosts sharing the cores"
    console.print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {platform.node()}, {platform.machine()}; {pinned}"
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
