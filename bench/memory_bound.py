"""How many seconds and training steps does it take to find the largest local batch that
fits a memory cap?  Tula's model-based bound vs PyTorch Lightning's ``BatchSizeFinder``.

For each model, on the same synthetic data (3x32x32, 10 classes), the same optimiser (the
spec's default SGD) and the same memory cap, three procedures run, each in its own fresh
process (this script re-run with ``--child``):

* **ground truth** (not counted against either method): one real training step per
  candidate local batch, each candidate in a FRESH process under the cap, doubling from 16
  until a step runs out of memory, then bisection to the exact largest batch whose step
  succeeds.  Fresh processes, because a failed allocation under an address-space cap
  leaves address space reserved (allocator arenas, caches): within one process, every step
  after the first out-of-memory error sees a smaller cap.
* **Tula**: what the profiler does (``tula.engine.profile._Worker.probe_memory``, without the DDP
  wrapper): one untracked training step at the first probe batch (creates the optimiser
  state), then ``tula.engine.memory.probe_memory_model``: one step at each probe batch with its
  forward/backward and its optimiser update tracked separately (plus the data batch's
  bytes), doubling the batch while the peak does not grow, then
  ``MemoryModel.max_local_batch(budget, safety)`` with the spec's default safety (10 %),
  and ONE confirming training step at that batch under the cap.  Should the confirming step
  run out of memory, Tula falls back as its training runner does (a new process): bisection
  between the largest probe batch and the failed bound, one fresh process per candidate,
  every step and every process's wall time (start-up included) counted against Tula.
* **Lightning**: ``lightning.pytorch.tuner.Tuner(trainer).scale_batch_size(mode="binsearch")``
  -- the public entry point that adds a ``BatchSizeFinder`` callback and stops after it --
  with the finder's defaults otherwise (``init_val=2``, ``steps_per_trial=3``,
  ``max_trials=25``, ``margin=0.05``, ``max_val=8192``), on a ``LightningModule`` that wraps
  the same model, optimiser object and data set (a shuffled ``DataLoader`` with
  ``drop_last=True`` over the same training tensors; ``batch_size`` attribute).  The module's
  ``batch_size`` is set to ``init_val`` before the search: the finder builds its first loader
  before it applies ``init_val``, so its first trial would otherwise run at whatever batch
  the module had.  Steps are counted in the module's own hooks
  (``training_step`` = attempted, ``on_train_batch_end`` = completed), because the finder
  detaches the trainer's callbacks while it searches.  Its seconds are the wall time of the
  ``scale_batch_size`` call (which includes the checkpoint the finder saves and restores).

The cap is real: each process, after building the model, optimiser and data and running
one training step at local batch 16 (so that the optimiser state, thread pools and lazily
loaded libraries exist), calls ``resource.setrlimit(RLIMIT_AS, (VmSize + budget, hard))``
exactly as ``tula.engine.memory.cap_address_space`` does, so a step that needs more raises the
CPU allocator's own error (``RuntimeError: [enforce fail at alloc_cpu.cpp] ...
DefaultCPUAllocator: can't allocate memory ...``).  For Tula that pre-cap step is its
untracked probe step and is counted in its steps and seconds; for Lightning it is run through
Lightning's own training loop (``Trainer(max_steps=1).fit``) and is not counted.

Out-of-memory recognition.  Lightning's finder only adapts the batch on errors its
``lightning.pytorch.utilities.memory.is_oom_error`` accepts; for CPU that is
``is_out_of_cpu_memory``: a ``RuntimeError`` with one argument containing
``"DefaultCPUAllocator: can't allocate memory"``.  That is exactly the message of the CPU
allocator under an address-space cap, so the comparison needs no translation layer and none
is applied: the Lightning module's ``training_step`` is a plain forward + loss.  The
benchmark checks it on the data rather than assuming it: every out-of-memory error raised in
the ground-truth search is passed to both ``tula.engine.memory.is_out_of_memory`` and Lightning's
``is_oom_error`` and the counts are printed; an error Lightning does not recognise would end
its search with an exception, which is recorded in its row.

One more failure appears under a cap: a convolution can raise oneDNN's
``RuntimeError: could not create a primitive`` when oneDNN's own allocation fails.  Neither
Tula's nor Lightning's check counts it as out of memory.  The ground truth counts it as "does
not fit" (and so does Tula's confirming step here); the output says whether it was seen.

Differences that remain, by design: Tula's bound keeps a 10 % safety margin of the budget
and counts the parameters and optimiser state inside the budget although they already exist
when the cap is set (as in the profiler), so it sits below the true maximum; Lightning's
binsearch result is cut by its 5 % margin.  Neither is tuned here.

Run:  .venv/bin/python bench/memory_bound.py [--models small_cnn,resnet18] [--threads 2]
Results (JSON, one file per process and results.json) go to runs/bench/memory_bound/.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WORKLOADS: dict[str, dict[str, Any]] = {
    "small_cnn": {
        "model": {"name": "small_cnn", "kwargs": {"in_channels": 3, "num_classes": 10, "width": 32}},
        "budget_mib": 768,
        "num_samples": 10240,
    },
    "resnet18": {"model": {"name": "resnet18", "kwargs": {"num_classes": 10}}, "budget_mib": 384, "num_samples": 10240},
}
WARMUP_BATCH = 16  # = Tula's first probe batch (spec.profile.memory_probe_batches[0])


# =========================================================================== child process
def _vm_size_bytes() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmSize:")) * 1024


def _cap(budget: int) -> int:
    """``tula.engine.memory.cap_address_space``: address space capped at its size now + budget."""
    from tula.engine.memory import cap_address_space

    return cap_address_space(budget)


def _spec(name: str, budget: int, num_samples: int):
    from tula.core.spec import spec_from_dict

    w = WORKLOADS[name]
    return spec_from_dict(
        {
            "name": f"bench-membound-{name}",
            "model": w["model"],
            "data": {"name": "synthetic", "sample_shape": [3, 32, 32], "num_samples": num_samples},
            "epochs": 1,
            "search": {"memory_budget_bytes": budget, "enforce_memory_cap": True},
        }
    )


class _Plain:
    """Model, optimiser and data of one process; a training step as the profiler runs it
    (without the DDP wrapper)."""

    def __init__(self, spec):
        import torch
        from torch import nn

        from tula.engine.workloads import build_model, build_optimizer, load_dataset

        torch.manual_seed(spec.seed)
        self.torch = torch
        self.data = load_dataset(spec.data, spec.seed)
        self.model = build_model(spec.model)
        self.optimizer = build_optimizer(self.model, spec)
        self.loss_fn = nn.CrossEntropyLoss()
        self.gen = torch.Generator().manual_seed(spec.seed)
        self.x = self.y = None

    @property
    def sample_bytes(self) -> int:
        x, y = self.data.batch(1, self.torch.Generator().manual_seed(0))
        return x.numel() * x.element_size() + y.numel() * y.element_size()

    def load_batch(self, b: int) -> None:
        self.x, self.y = self.data.batch(b, self.gen)

    def forward_backward(self) -> None:
        self.loss_fn(self.model(self.x), self.y).backward()

    def update(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def step(self) -> None:
        self.forward_backward()
        self.update()

    def release(self) -> None:
        self.x = self.y = None
        self.optimizer.zero_grad(set_to_none=True)
        gc.collect()

    def try_step(self, b: int, errors: list | None = None) -> bool:
        """One training step at local batch ``b``; False if it failed for lack of memory."""
        try:
            self.load_batch(b)
            self.step()
            ok = True
        except Exception as err:  # noqa: BLE001
            if not _is_cap_failure(err):
                raise
            if errors is not None:
                errors.append(_describe_oom(err))
            ok = False
        self.release()
        return ok


def _is_cap_failure(err: BaseException) -> bool:
    """An error that means the step did not fit under the cap: what ``tula.engine.memory.is_out_of_memory``
    recognises, plus oneDNN's ``could not create a primitive`` (raised by a convolution when
    oneDNN's own allocation fails under the address-space cap; neither Tula nor Lightning
    counts it as out of memory)."""
    from tula.engine.memory import is_out_of_memory

    return is_out_of_memory(err) or (isinstance(err, RuntimeError) and "could not create a primitive" in str(err))


def _describe_oom(err: BaseException) -> dict:
    from lightning.pytorch.utilities.memory import is_oom_error

    from tula.engine.memory import is_out_of_memory

    return {
        "type": type(err).__name__,
        "message": str(err).splitlines()[0][:240],
        "tula_recognises": bool(is_out_of_memory(err)),
        "lightning_recognises": bool(is_oom_error(err)),
    }


def child_check(spec, budget: int, batch: int) -> dict:
    """One capped step at ``batch`` in a fresh process."""
    w = _Plain(spec)
    w.try_step(WARMUP_BATCH)
    _cap(budget)
    errors: list[dict] = []
    return {"batch": batch, "fits": w.try_step(batch, errors), "oom_errors": errors}


def child_tula(spec, budget: int) -> dict:
    from tula.engine.memory import measure_phase_peaks, probe_memory_model

    w = _Plain(spec)
    b1, b2 = spec.profile.memory_probe_batches
    safety = spec.search.memory_safety
    t0 = time.perf_counter()
    # probe_memory: one untracked step (creates the optimiser state) ...
    w.load_batch(b1)
    w.step()
    w.release()
    steps = 1
    cap = _cap(budget)
    # ... then the profiler's probe steps (tula.engine.memory.probe_memory_model): forward/backward
    # and update tracked separately, more probes only if the peak does not grow
    sb = w.sample_bytes  # the data batch is created outside the tracked step: add it back
    probed = []

    def measure(b: int) -> tuple[int, int]:
        w.load_batch(b)
        fb, up = measure_phase_peaks(w.forward_backward, w.update, w.model, w.optimizer, w.torch.device("cpu"))
        w.release()
        probed.append(b)
        return fb + sb * b, up + sb * b

    mm = probe_memory_model(
        measure, w.model, w.optimizer, sb, (b1, b2), w.torch.device("cpu"), max_batch=w.data.train_size
    )
    steps += len(probed)
    bound = mm.max_local_batch(budget, safety)
    t_model = time.perf_counter() - t0
    # ONE confirming step; if it fails the parent continues in fresh processes, because a
    # failed allocation under the cap leaves address space reserved in this one
    errors: list[dict] = []
    confirms = [(bound, w.try_step(bound, errors))] if bound else []
    steps += len(confirms)
    answer = bound if confirms and confirms[0][1] else None
    return {
        "max_local_batch": answer,
        "probe_batches": probed,
        "model_bound": bound,
        "model_bound_no_safety": mm.max_local_batch(budget, 0.0),
        "safety": safety,
        "steps": steps,
        "seconds": time.perf_counter() - t0,
        "seconds_to_bound": t_model,
        "confirms": confirms,
        "memory_model": mm.to_dict(),
        "oom_errors": errors,
        "address_space_cap_bytes": cap,
    }


def child_lightning(spec, budget: int, steps_per_trial: int) -> dict:
    import logging
    import warnings

    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.tuner import Tuner

    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    w = _Plain(spec)
    root = Path(os.environ.get("MEMBOUND_OUT", "runs/bench/memory_bound")) / "lightning_root"
    root.mkdir(parents=True, exist_ok=True)

    class Lit(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model, self.loss_fn = w.model, w.loss_fn
            self.batch_size = WARMUP_BATCH
            self.attempted = self.completed = 0
            self.log_steps: list[list] = []  # [batch, attempted, completed] per run of equal batches

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.attempted += 1
            if not self.log_steps or self.log_steps[-1][0] != len(x) or self.log_steps[-1][3]:
                self.log_steps.append([len(x), 0, 0, False])
            self.log_steps[-1][1] += 1
            return self.loss_fn(self.model(x), y)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            self.completed += 1
            self.log_steps[-1][2] += 1

        def configure_optimizers(self):
            return w.optimizer  # the same optimiser object (its state survives the warm-up)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(
                w.data.train,
                batch_size=self.batch_size,
                shuffle=True,
                drop_last=True,
                generator=torch.Generator().manual_seed(spec.seed),
            )

    lit = Lit()

    def trainer(**kw):
        return pl.Trainer(
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            default_root_dir=str(root),
            **kw,
        )

    trainer(max_steps=1).fit(lit)  # the warm-up step at local batch 16, through Lightning's own loop
    # the finder's first trial runs at the module's batch_size, not at init_val (it sets init_val
    # after building the first loader), so start from init_val (2) as its documentation says
    lit.batch_size = 2
    gc.collect()
    cap = _cap(budget)
    lit.attempted = lit.completed = 0
    lit.log_steps = []
    t0 = time.perf_counter()
    error = None
    answer = None
    try:
        answer = Tuner(trainer(max_steps=10_000)).scale_batch_size(
            lit, mode="binsearch", steps_per_trial=steps_per_trial
        )
    except Exception as err:  # noqa: BLE001 - recorded, e.g. an out-of-memory error it did not recognise
        error = f"{type(err).__name__}: {str(err).splitlines()[0][:240]}"
    seconds = time.perf_counter() - t0
    trials = [{"batch": b, "attempted": a, "completed": c} for b, a, c, _ in lit.log_steps]
    ok = [t["batch"] for t in trials if t["completed"] >= steps_per_trial]
    return {
        "max_local_batch": answer,
        "largest_trial_passed": max(ok) if ok else None,
        "steps": lit.attempted,
        "steps_completed": lit.completed,
        "seconds": seconds,
        "trials": trials,
        "steps_per_trial": steps_per_trial,
        "error": error,
        "address_space_cap_bytes": cap,
    }


def child_main(cfg: dict) -> None:
    # everything imported before the cap: an import under the cap can fail for lack of address space
    import lightning.pytorch.utilities.memory  # noqa: F401
    import torch
    import torch.distributed._tools.mem_tracker  # noqa: F401 - what measure_step_peak_bytes uses on CPU

    import tula.engine.memory  # noqa: F401
    import tula.engine.profile  # noqa: F401

    torch.set_num_threads(cfg["threads"])
    spec = _spec(cfg["model"], cfg["budget"], cfg["num_samples"])
    if cfg["method"] == "check":
        res = child_check(spec, cfg["budget"], cfg["batch"])
    elif cfg["method"] == "tula":
        res = child_tula(spec, cfg["budget"])
    else:
        res = child_lightning(spec, cfg["budget"], cfg["steps_per_trial"])
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))  # lift the cap before writing the result
    Path(cfg["result"]).write_text(json.dumps(res, indent=1))


# =========================================================================== parent
def _run_child(cfg: dict, out: Path, console) -> dict:
    label = f"{cfg['model']}_{cfg['method']}" + (f"_{cfg['batch']}" if cfg["method"] == "check" else "")
    cfg = {**cfg, "result": str(out / f"{label}.json")}
    Path(cfg["result"]).unlink(missing_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(cfg)],
        capture_output=True,
        text=True,
        env={**os.environ, "MEMBOUND_OUT": str(out)},
    )
    wall = time.perf_counter() - t0
    (out / f"{label}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not Path(cfg["result"]).is_file():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        console.print(f"[red]{label}: process exited with {proc.returncode}[/]\n{tail}")
        return {"crashed": True, "returncode": proc.returncode, "tail": tail, "process_wall_s": wall}
    res = json.loads(Path(cfg["result"]).read_text())
    res["process_wall_s"] = wall
    return res


def fresh_search(base: dict, lo: int, hi: int | None, out: Path, console) -> dict:
    """Largest local batch whose training step fits under the cap, each candidate in a fresh
    process: doubling from ``lo`` (known to fit) while ``hi`` (known not to fit) is unknown,
    then bisection.  Returns the answer, the candidates tried and the processes' seconds."""
    tried, errors, seconds = [], [], 0.0

    def fits(b: int) -> bool:
        nonlocal seconds
        r = _run_child({**base, "method": "check", "batch": b}, out, console)
        seconds += r["process_wall_s"]
        ok = bool(r.get("fits")) and not r.get("crashed")
        tried.append((b, ok, bool(r.get("crashed"))))
        errors.extend(r.get("oom_errors", []))
        return ok

    while hi is None:
        if fits(2 * lo):
            lo *= 2
        else:
            hi = 2 * lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return {"max_local_batch": lo, "steps": len(tried), "seconds": seconds, "tried": tried, "oom_errors": errors}


def evaluate(name: str, budget: int, threads: int, steps_per_trial: int, out: Path, console) -> dict:
    base = {
        "model": name,
        "budget": budget,
        "threads": threads,
        "num_samples": WORKLOADS[name]["num_samples"],
        "steps_per_trial": steps_per_trial,
    }
    console.print(
        f"[bold]{name}[/]: cap {budget / 2**20:.0f} MiB -- ground truth (one fresh process per candidate) ..."
    )
    truth = fresh_search(base, WARMUP_BATCH, None, out, console)
    t = truth["max_local_batch"]
    console.print(f"  true max local batch {t} ({truth['steps']} processes, {truth['seconds']:.0f} s)")
    checks = sorted(
        ({"batch": b, "fits": ok} for b, ok, _ in truth["tried"] if b in (t, t + 1)), key=lambda c: c["batch"]
    )
    console.print("  Tula ...")
    tula = _run_child({**base, "method": "tula"}, out, console)
    if not tula.get("crashed") and tula["max_local_batch"] is None and tula.get("model_bound"):
        console.print(f"  Tula's bound {tula['model_bound']} did not fit: bisecting below it in fresh processes ...")
        rest = fresh_search(base, max(tula["probe_batches"]), tula["model_bound"], out, console)
        tula.update(
            max_local_batch=rest["max_local_batch"],
            steps=tula["steps"] + rest["steps"],
            seconds=tula["seconds"] + rest["seconds"],
            fallback_search=rest,
        )
        tula["oom_errors"] = tula.get("oom_errors", []) + rest["oom_errors"]
    console.print("  Lightning BatchSizeFinder (binsearch) ...")
    light = _run_child({**base, "method": "lightning"}, out, console)
    return {
        "model": name,
        "budget_bytes": budget,
        "threads": threads,
        "truth": truth,
        "boundary_checks": checks,
        "tula": tula,
        "lightning": light,
    }


def stat_lines(results: list[dict]) -> list[str]:
    """The accuracy as the field states it (``bench/_stats.py``), over the models: the memory model's
    largest local batch (without and with the safety margin) against the true maximum.  This
    benchmark measures no configuration twice, so it has no noise floor of its own."""
    from _stats import describe, error_stats  # bench/, the folder the script runs from; not in the capped children

    out = []
    for what, key in (("without the safety margin", "model_bound_no_safety"), ("Tula's answer", "max_local_batch")):
        pairs = [
            (r["tula"].get(key), r["truth"].get("max_local_batch")) for r in results if not r["tula"].get("crashed")
        ]
        pairs = [(p, t) for p, t in pairs if p and t]
        if pairs:
            pred, true = zip(*pairs, strict=True)
            out.append(describe(f"largest local batch, {what}, against the true maximum", error_stats(pred, true)))
    return out


def _ratio(ans, truth) -> str:
    if ans is None or not truth:
        return "-"
    return f"{ans / truth:.2f}x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--models", default="small_cnn,resnet18", help="comma-separated: " + ", ".join(WORKLOADS))
    ap.add_argument("--budget-mib", type=float, default=None, help="one cap for every model (default: per model)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads in every process")
    ap.add_argument("--steps-per-trial", type=int, default=3, help="Lightning's steps_per_trial (its default: 3)")
    ap.add_argument("--out", type=Path, default=Path("runs/bench/memory_bound"))
    args = ap.parse_args()
    if args.child:
        child_main(json.loads(args.child))
        return

    import torch
    from rich.console import Console
    from rich.table import Table

    console = Console() if Console().is_terminal or "COLUMNS" in os.environ else Console(width=200)
    args.out.mkdir(parents=True, exist_ok=True)
    import lightning

    console.print(
        f"date {time.strftime('%Y-%m-%d %H:%M %Z')}; machine {platform.machine()} "
        f"{os.cpu_count()} cores, {platform.processor() or 'cpu'}; torch {torch.__version__}; "
        f"lightning {lightning.__version__}; torch threads per process {args.threads}"
    )
    t_start = time.perf_counter()
    results = []
    for m in (s.strip() for s in args.models.split(",")):
        mib = args.budget_mib if args.budget_mib is not None else WORKLOADS[m]["budget_mib"]
        results.append(evaluate(m, int(mib * 2**20), args.threads, args.steps_per_trial, args.out, console))
    (args.out / "results.json").write_text(json.dumps(results, indent=1))

    tab = Table(title="Largest local batch within a memory cap: answer (x true max), training steps, seconds")
    for col in (
        "model",
        "cap",
        "true max",
        "Tula answer",
        "Tula steps",
        "Tula s",
        "Lightning answer",
        "Lightning steps",
        "Lightning s",
    ):
        tab.add_column(col, justify="right")
    for r in results:
        tr, tu, li = r["truth"], r["tula"], r["lightning"]
        t = tr.get("max_local_batch")
        tab.add_row(
            r["model"],
            f"{r['budget_bytes'] / 2**20:.0f} MiB",
            str(t) if t is not None else "crashed",
            f"{tu['max_local_batch']} ({_ratio(tu['max_local_batch'], t)})" if not tu.get("crashed") else "crashed",
            str(tu.get("steps", "-")),
            f"{tu['seconds']:.1f}" if "seconds" in tu else "-",
            (
                f"{li['max_local_batch']} ({_ratio(li['max_local_batch'], t)})"
                if li.get("max_local_batch")
                else ("error" if li.get("error") else "crashed")
            ),
            f"{li['steps']} ({li['steps_completed']} done)" if "steps" in li else "-",
            f"{li['seconds']:.1f}" if "seconds" in li else "-",
        )
    console.print(tab)

    det = Table(title="Details")
    for col in (
        "model",
        "Tula bound (safety 10% / 0%)",
        "Tula confirm step",
        "Tula bytes/sample",
        "Lightning largest passed trial",
        "Lightning trials",
        "truth search steps / s",
        "boundary re-check",
        "steps ratio L/T",
        "seconds ratio L/T",
    ):
        det.add_column(col, justify="right")
    for r in results:
        tr, tu, li = r["truth"], r["tula"], r["lightning"]
        chk = r["boundary_checks"]
        recheck = (
            "-"
            if len(chk) < 2 or any(c.get("crashed") for c in chk)
            else (
                "confirmed"
                if chk[0]["fits"] and not chk[1]["fits"]
                else f"{chk[0]['batch']}: {'fits' if chk[0]['fits'] else 'OOM'}, {chk[1]['batch']}: "
                f"{'fits' if chk[1]['fits'] else 'OOM'}"
            )
        )
        mm = tu.get("memory_model", {})
        det.add_row(
            r["model"],
            f"{tu.get('model_bound')} / {tu.get('model_bound_no_safety')}",
            ", ".join(f"{b}: {'ok' if ok else 'OOM'}" for b, ok in tu.get("confirms", [])),
            f"{(mm.get('activation_bytes_per_sample', 0) + mm.get('batch_bytes_per_sample', 0)) / 1024:.0f} KiB",
            str(li.get("largest_trial_passed")),
            str(len(li.get("trials", []))),
            f"{tr.get('steps')} / {tr.get('seconds', 0):.0f}",
            recheck,
            f"{li['steps'] / tu['steps']:.1f}x" if "steps" in li and tu.get("steps") else "-",
            f"{li['seconds'] / tu['seconds']:.1f}x" if "seconds" in li and tu.get("seconds") else "-",
        )
    console.print(det)

    seen = [
        e
        for r in results
        for e in r["truth"].get("oom_errors", [])
        + r["tula"].get("oom_errors", [])
        + [e for c in r["boundary_checks"] for e in c.get("oom_errors", [])]
    ]
    kinds: dict[str, list[dict]] = {}
    for e in seen:
        kind = (
            "DefaultCPUAllocator: can't allocate memory"
            if "DefaultCPUAllocator" in e["message"]
            else "oneDNN: could not create a primitive"
            if "could not create a primitive" in e["message"]
            else f"{e['type']}: {e['message'][:80]}"
        )
        kinds.setdefault(kind, []).append(e)
    for kind, es in kinds.items():
        console.print(
            f"failures under the cap (truth search, re-checks, Tula's confirm): {len(es)} x {kind!r}; "
            f"counted as out of memory by tula.engine.memory.is_out_of_memory: "
            f"{sum(e['tula_recognises'] for e in es)}, by Lightning's is_oom_error: "
            f"{sum(e['lightning_recognises'] for e in es)}"
        )
    for r in results:
        if r["lightning"].get("error"):
            console.print(f"[yellow]{r['model']}: Lightning's search ended with {r['lightning']['error']}[/]")
    for line in stat_lines(results):
        console.print(line, highlight=False, soft_wrap=True)
    console.print(f"total {time.perf_counter() - t_start:.0f} s; per-process records in {args.out}")


if __name__ == "__main__":
    main()
