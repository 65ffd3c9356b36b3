"""The GPU check (issue #25 item 5): what Tula measures, predicts and trains on one GPU, against
a plain PyTorch loop, in at most 5 minutes.

On a torchvision ResNet-50 at 224x224 (ResNet-18 when the card has under 16 GiB), 1000
classes, Tula's default optimiser (SGD, momentum 0.9, weight decay 5e-4), for each precision
(fp32, bf16, fp16) and local batch b in ``--batches`` (32, 64, 128, 256):

* **plain**: the plain PyTorch loop with the batch already on the device (random tensors made
  there once): ``--warmup`` steps, then ``--timed`` steps, each timed to a
  ``torch.cuda.synchronize``; the median, and ``torch.cuda.max_memory_allocated`` over the
  timed steps (the peak stats reset after the warm-up);
* **tula**: Tula's own profile (``tula.engine.profile.profile``, ``--search full``) of a
  synthetic data set spec at the same batches, one worker on the GPU: the trial's median
  step time (its data path included, as training runs it);
* **predicted**: the models fitted (``tula.core.fit.fit_models``) on the partial subset of that
  profile -- its smallest, middle and largest batch, what ``--search partial`` measures on a
  GPU -- predict
  every b: the step time (``PerfModel.t_step_s``) and the peak memory
  (``MemoryModel.predict_peak_bytes``), against the plain loop's.

Then, from the fp32 memory model: the predicted largest local batch on the card
(``MemoryModel.max_local_batch`` with the card's total memory as the budget and no safety
margin) and one plain step at 0.95x and one at 1.05x of it (expected: fits, out of memory).
And 2 epochs of AGS in fp16 (``tula.engine.train.train``, one worker, GradScaler on CUDA) on a
small synthetic set: its losses, the steps the scaler skipped, the share of AGS-scaled steps;
then the same run in fp32 beside it.

The transformer (#44), in fp32 and bf16 (of ``--precisions``): the built-in ``tiny_gpt`` (6
blocks of width 512, 8 heads of 64, 256 token ids; AdamW) at local batches 8..64 at the sequence
length L = 512, and at b = 8 at L = 256 and 1024:

* **plain**: the plain loop on random token ids made on the device once, next-token targets,
  cross-entropy over the vocabulary (the logits' class dimension second, as Tula's
  ``cross_entropy`` takes them), autocast in bf16; and the same with every attention forced
  through SDPA's flash-attention kernel (``torch.nn.attention.sdpa_kernel``; tiny_gpt's attention
  is ``F.scaled_dot_product_attention``, causal), which says whether flash attention runs there
  and what it gives against torch's own choice of kernel (it cannot run in fp32 on a GPU);
* **tula**: Tula's profile of the ``text`` data set (``--search full``) at L = 512 with
  ``search.sequence_lengths`` 256, 512, 1024 (one trial at each other length, at the largest batch);
* **predicted**: the models fitted on that profile less one batch at L = 512 predict every
  point's step and peak at its (b, L) (``FittedModels.predict``): three points are held out.

The knobs of #25 item 3 (``--tf32``, ``--channels-last``, ``--cudnn-benchmark``) apply to
both loops when given (default: torch's defaults, off).

Every part checks a wall-clock budget (``--budget-s``, 240 s) before it starts, and a part
left out for lack of time says so.  The results print as a table and, on a GPU, replace the
"GPU check" section of docs/benchmarks-history.md (``--doc``), with the card, torch's version and the
date.

``--dry-run``: the same code on the CPU with a tiny torchvision model (ShuffleNetV2 x0.5 at
16x16, 10 classes, b in 4, 8; fp16 on torch's CPU kernels under ``TULA_FP16_ON_CPU=1``), a few
steps -- every path but the CUDA-only ones (the peak-memory counter, the out-of-memory step).
Not ResNet-18: torch's CPU kernels run its fp16 backward at about 1.5 s a step whatever the
batch or image (its 11 M parameters; ShuffleNetV2 x0.5 has 0.35 M), which made the dry run
take 90 s instead of about 30.  The transformer's dry run: one block of width 32, b in 2, 4 at L = 16,
lengths 8, 16, 32 (about 2.5 s of the dry run).  It writes no doc unless ``--doc`` is given.

Run on a GPU machine: ``bench/gpu_prepare.sh`` here (wheels), then ``bench/gpu_run.sh`` there.
Run here:             ``.venv/bin/python bench/gpu.py --dry-run``
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:  # a copy of the project with Tula not installed (PYTHONPATH=src also works)
    sys.path.insert(0, str(ROOT / "src"))
if str(ROOT / "bench") not in sys.path:  # bench/run_prediction.py, when loaded from elsewhere
    sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _stats import summarise  # noqa: E402  (bench/_stats.py: numpy only, nothing a GPU machine lacks)

from tula.core.fit import fit_models  # noqa: E402
from tula.core.memory_model import MemoryModel  # noqa: E402
from tula.core.perfmodel import PerfModel, ranks_per_node_of  # noqa: E402
from tula.core.records import ProfileRecord  # noqa: E402
from tula.core.space import middle_batch  # noqa: E402
from tula.core.spec import JobSpec, ModelSpec, spec_from_dict  # noqa: E402

PRECISIONS = ("fp32", "bf16", "fp16")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
SECTION = "## GPU check (`bench/gpu.py`, issue #25)"
GIB = 2**30
#: the dry run's model: a torchvision model whose fp16 steps on the CPU take tens of ms (see the docstring)
DRY_RUN_MODEL = "shufflenet_v2_x0_5"
#: the transformer on a GPU: tiny_gpt, 6 blocks of width 512 (8 heads of 64: a head size flash attention takes)
GPT_KWARGS = {"n_layers": 6, "d_model": 512, "n_heads": 8, "max_positions": 1024, "dropout": 0.0}
#: ... and in a dry run: one block of width 32
DRY_RUN_GPT_KWARGS = {"n_layers": 1, "d_model": 32, "n_heads": 2, "max_positions": 32, "dropout": 0.0}
#: the transformer's optimiser in both loops (a transformer's usual one; Tula's weight decay)
GPT_OPTIMIZER: dict[str, Any] = {"name": "adamw", "lr": 1e-3, "weight_decay": 5e-4}
#: the precisions the transformer is measured in (of --precisions): fp16's scaler is the images' part
GPT_PRECISIONS = ("fp32", "bf16")


@dataclass
class Setup:
    """What one run measures: the model, the sample, the batches, the step counts."""

    device: torch.device
    model: str
    num_classes: int
    shape: tuple[int, int, int]
    batches: list[int]
    precisions: list[str]
    warmup: int
    timed: int
    knobs: dict = field(default_factory=dict)
    ags_samples: int = 1280
    ags_batch: int = 128
    ags_shape: tuple[int, int, int] = (3, 64, 64)
    ags_model: str = "resnet18"
    threads: int | None = None
    ratio_from_b: int = 64  # Tula / plain is summarised over b >= this (the target: b >= 64)
    # the transformer (#44): tiny_gpt's size, its local batches at the data's own length gpt_length,
    # and the lengths its profile measures (search.sequence_lengths)
    gpt_kwargs: dict = field(default_factory=lambda: dict(GPT_KWARGS))
    gpt_batches: list[int] = field(default_factory=lambda: [8, 16, 32, 64])
    gpt_length: int = 512
    gpt_lengths: list[int] = field(default_factory=lambda: [256, 512, 1024])


@dataclass
class Budget:
    """The wall-clock budget every part checks before it starts."""

    total_s: float
    t0: float = field(default_factory=time.perf_counter)

    def left_s(self) -> float:
        return self.total_s - (time.perf_counter() - self.t0)

    def allows(self, need_s: float) -> bool:
        return self.left_s() >= need_s


# --------------------------------------------------------------------------- the plain loop
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _apply_knobs(s: Setup) -> JobSpec:
    """The knobs as a spec's ``train`` section would set them, applied to this process too."""
    from tula.engine.gpu_knobs import set_backend_knobs

    spec = spec_from_dict({"train": dict(s.knobs)})
    set_backend_knobs(spec.train)
    return spec


def _plain_model(s: Setup) -> torch.nn.Module:
    from tula.engine.gpu_knobs import to_memory_format
    from tula.engine.workloads import build_model

    spec = _apply_knobs(s)
    torch.manual_seed(0)
    model = build_model(ModelSpec(name=s.model, kwargs={"num_classes": s.num_classes})).to(s.device)
    return to_memory_format(model, spec.train)


def plain_steps(s: Setup, precision: str, b: int, warmup: int, timed: int) -> dict:
    """The plain loop at local batch ``b``: median step seconds and the peak bytes allocated
    over the timed steps (CUDA; ``None`` on a CPU)."""
    model = _plain_model(s)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)  # Tula's default
    dtype = _DTYPES.get(precision)
    scaler = torch.amp.GradScaler(s.device.type) if precision == "fp16" else None
    x = torch.randn(b, *s.shape, device=s.device)
    y = torch.randint(0, s.num_classes, (b,), device=s.device)
    model.train()

    def step() -> None:
        ctx = torch.autocast(s.device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
        with ctx:
            loss = F.cross_entropy(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        opt.zero_grad(set_to_none=True)  # as Tula's step: the gradients are gone before the next forward

    try:
        return _time_steps(s.device, step, warmup, timed)
    finally:  # the model, batch and optimiser go with this frame (after an out of memory: with its traceback)
        _free(s.device)


def _time_steps(device: torch.device, step, warmup: int, timed: int) -> dict:
    """``warmup`` steps, then ``timed`` steps each timed to a synchronize: the median step seconds
    and the peak bytes allocated over the timed steps (CUDA; ``None`` on a CPU)."""
    for _ in range(warmup):
        step()
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(timed):
        t0 = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - t0)
    peak = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
    return {"t_step_s": statistics.median(times), "peak_bytes": peak}


def plain_token_steps(
    s: Setup, precision: str, b: int, length: int, warmup: int, timed: int, flash: bool = False
) -> dict:
    """The plain loop of the transformer: tiny_gpt (``s.gpt_kwargs``, Tula's own initialisation)
    at local batch ``b`` of ``length`` random token ids (the batch made on the device once),
    next-token targets, cross-entropy over the vocabulary (the logits' class dimension second, as
    Tula's ``cross_entropy`` loss takes them), AdamW (:data:`GPT_OPTIMIZER`), autocast in bf16.
    ``flash``: every attention through SDPA's flash-attention kernel alone
    (``torch.nn.attention.sdpa_kernel``); where it cannot run (fp32 on a GPU, a head size it
    lacks) torch raises, and this returns ``{"error": ...}``.  Otherwise as :func:`plain_steps`."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tula.engine.workloads import build_model

    _apply_knobs(s)
    torch.manual_seed(0)
    model = build_model(ModelSpec(name="tiny_gpt", kwargs=dict(s.gpt_kwargs))).to(s.device)
    opt = torch.optim.AdamW(model.parameters(), lr=GPT_OPTIMIZER["lr"], weight_decay=GPT_OPTIMIZER["weight_decay"])
    dtype = _DTYPES.get(precision)
    vocab = int(s.gpt_kwargs.get("vocab_size", 256))
    tokens = torch.randint(0, vocab, (b, length + 1), device=s.device)
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    model.train()

    def step() -> None:
        ctx = torch.autocast(s.device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
        kernel = sdpa_kernel(SDPBackend.FLASH_ATTENTION) if flash else contextlib.nullcontext()
        with ctx, kernel:
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    try:
        return _time_steps(s.device, step, warmup, timed)
    except RuntimeError as err:
        if not flash or isinstance(err, torch.OutOfMemoryError):
            raise
        return {"error": str(err).splitlines()[0][:160]}  # no flash kernel for this dtype or shape
    finally:
        if s.device.type == "cuda":  # on a CPU the frame's tensors go with it (a collection takes 0.3 s a call)
            _free(s.device)


def fits_one_step(s: Setup, b: int) -> dict:
    """One plain fp32 step at local batch ``b``: whether it ran, and its peak bytes."""
    try:
        r = plain_steps(s, "fp32", b, warmup=0, timed=1)
        return {"fits": True, "peak_bytes": r["peak_bytes"]}
    except torch.OutOfMemoryError as err:
        return {"fits": False, "peak_bytes": None, "note": str(err).splitlines()[0][:120]}
    finally:
        _free(s.device)


# --------------------------------------------------------------------------- Tula
def tula_spec(s: Setup, precision: str) -> JobSpec:
    """The synthetic job Tula profiles at ``s.batches`` (one worker)."""
    lo, hi = min(s.batches), max(s.batches)
    return spec_from_dict(
        {
            "name": f"gpu-check-{precision}",
            "model": {"name": s.model, "kwargs": {"num_classes": s.num_classes}},
            "data": {
                "name": "synthetic",
                "sample_shape": list(s.shape),
                "num_classes": s.num_classes,
                "num_samples": math.ceil(hi / 0.8) + 8,  # the training split holds the largest batch
            },
            "search": {"cluster_sizes": [1], "min_batch": lo, "max_batch": hi},
            "profile": {
                "device": s.device.type,
                "warmup_steps": max(1, s.warmup // 2),
                "timed_steps": max(2, s.timed // 3),
                "min_timed_s": 0,
                "noise_steps": 0,
                "memory_probe_batches": [max(2, lo // 2), max(4, lo)],  # BatchNorm needs 2 samples
                **({"threads_per_worker": s.threads} if s.threads else {}),
            },
            "train": {"precision": precision, **s.knobs},
        }
    )


def partial_subset(prof: ProfileRecord) -> ProfileRecord:
    """The profile as ``--search partial`` would have measured it on a GPU: each N at its
    smallest and largest batch that ran, and the one nearest their geometric mean
    (``search.partial_middle_batch``, on by default on a GPU)."""
    ok = [t for t in prof.trials if t.status == "ok"]
    keep: set[tuple[int, int | None]] = set()
    for n in {t.n_workers for t in ok}:
        bs = sorted(t.global_batch for t in ok if t.n_workers == n)
        keep |= {(n, bs[0]), (n, bs[-1]), (n, middle_batch(bs))}  # (n, None) matches no trial
    return prof.model_copy(update={"trials": [t for t in prof.trials if (t.n_workers, t.global_batch) in keep]})


def tula_profile(s: Setup, precision: str, launcher) -> tuple[ProfileRecord, MemoryModel, PerfModel, int | None]:
    from tula.engine.profile import profile

    prof = profile(tula_spec(s, precision), "full", launcher=launcher)
    models = fit_models(partial_subset(prof))
    return prof, models.memory, models.perf, ranks_per_node_of(models.trials)


def gpt_spec(s: Setup, precision: str) -> JobSpec:
    """The transformer job Tula profiles: tiny_gpt on ``text`` (bytes of Python's own sources,
    made here, nothing downloaded) at the length ``s.gpt_length``, one worker, its batches
    ``s.gpt_batches`` and the other lengths of ``s.gpt_lengths`` (one trial each, at the largest
    batch), in ``precision``."""
    lo, hi = min(s.gpt_batches), max(s.gpt_batches)
    return spec_from_dict(
        {
            "name": f"gpu-check-gpt-{precision}",
            "model": {"name": "tiny_gpt", "kwargs": dict(s.gpt_kwargs)},
            "data": {"name": "text", "sequence_length": s.gpt_length, "num_samples": math.ceil(hi / 0.8) + 8},
            "optimizer": dict(GPT_OPTIMIZER),
            "search": {
                "cluster_sizes": [1],
                "min_batch": lo,
                "max_batch": hi,
                "sequence_lengths": sorted(set(s.gpt_lengths) | {s.gpt_length}),
            },
            "profile": {
                "device": s.device.type,
                "warmup_steps": max(1, s.warmup // 2),
                "timed_steps": max(2, s.timed // 3),
                "min_timed_s": 0,
                "noise_steps": 0,
                "memory_probe_batches": [max(1, lo // 2), lo],
                **({"threads_per_worker": s.threads} if s.threads else {}),
            },
            "train": {"precision": precision, **s.knobs},
        }
    )


def gpt_subset(prof: ProfileRecord, reference_length: int) -> ProfileRecord:
    """The transformer's profile less one of its batches at the reference length: there, the
    smallest, middle and largest batch (as :func:`partial_subset`), and every trial at another
    length; the rest is held out."""
    at_ref = sorted(t.global_batch for t in prof.trials if t.status == "ok" and t.sequence_length == reference_length)
    keep = {at_ref[0], at_ref[-1], middle_batch(at_ref)} if at_ref else set()
    trials = [t for t in prof.trials if t.sequence_length != reference_length or t.global_batch in keep]
    return prof.model_copy(update={"trials": trials})


def transformer_rows(s: Setup, precision: str, launcher, notes: list[str]) -> list[dict]:
    """The transformer in ``precision``: the plain loop (:func:`plain_token_steps`) at each batch of
    ``s.gpt_batches`` at ``s.gpt_length`` and at the smallest batch at each other length (points
    the profile did not measure), and there again with flash attention forced; Tula's profile of
    :func:`gpt_spec` (its trial's step and measured peak where it ran that point); and the models
    fitted on :func:`gpt_subset` of it predicting each point's step and peak at its (b, L)
    (:meth:`tula.core.fitted.FittedModels.predict`)."""
    from tula.core.fitted import FittedModels
    from tula.engine.profile import profile

    points = [(b, s.gpt_length) for b in s.gpt_batches]
    points += [(min(s.gpt_batches), n) for n in sorted(s.gpt_lengths) if n != s.gpt_length]
    rows = []
    for b, length in points:
        r = plain_token_steps(s, precision, b, length, s.warmup, s.timed)
        f = plain_token_steps(s, precision, b, length, s.warmup, s.timed, flash=True)
        rows.append({"precision": precision, "b": b, "length": length, "plain": r["t_step_s"],
                     "peak_plain": r["peak_bytes"], "flash": f.get("t_step_s"), "flash_error": f.get("error")})  # fmt: skip
        print(f"tiny_gpt {precision} b={b} L={length}: plain {_ms(r['t_step_s'])} ms (flash attention forced: "
              f"{_ms(f.get('t_step_s')) + ' ms' if 'error' not in f else f['error']}), peak {_gib(r['peak_bytes'])} GiB",
              flush=True)  # fmt: skip
    errors = sorted({r["flash_error"] for r in rows if r["flash_error"]})
    if errors:
        notes.append(f"tiny_gpt {precision}: flash attention forced did not run ({'; '.join(errors)}).")
    _free(s.device)
    prof = profile(gpt_spec(s, precision), "full", launcher=launcher)
    fitted_on = gpt_subset(prof, s.gpt_length)
    fitted = FittedModels.from_record(fit_models(fitted_on))
    measured = {(t.local_batch, t.sequence_length): t for t in prof.trials if t.n_workers == 1}
    fit_points = {(t.local_batch, t.sequence_length) for t in fitted_on.trials if t.status == "ok"}
    for row in rows:
        t = measured.get((row["b"], row["length"]))
        p = fitted.predict(n_workers=1, local_batch=row["b"], sequence_length=row["length"])
        row["tula"] = t.t_step_s if t and t.status == "ok" else None
        row["tula_status"] = t.status if t else "not profiled"
        row["peak_tula"] = t.peak_mem_bytes if t else None
        row["predicted"] = float(p.t_step_s[0])
        row["peak_predicted"] = None if p.peak_mem_bytes is None else int(p.peak_mem_bytes[0])
        row["fitted"] = (row["b"], row["length"]) in fit_points
        print(f"tiny_gpt {precision} b={row['b']} L={row['length']}: tula {_ms(row['tula'])} ms "
              f"({row['tula_status']}), predicted {_ms(row['predicted'])} ms, peak predicted "
              f"{_gib(row['peak_predicted'])} GiB{'' if row['fitted'] else ' (held out)'}", flush=True)  # fmt: skip
    _free(s.device)
    return rows


def ags_run(s: Setup, launcher, out: Path, precision: str) -> dict:
    """2 epochs of AGS in ``precision`` on a small synthetic set, one worker."""
    from tula.engine.train import train

    spec = spec_from_dict(
        {
            "name": "gpu-check-ags",
            "model": {"name": s.ags_model, "kwargs": {"num_classes": 10}},
            "data": {"name": "synthetic", "sample_shape": list(s.ags_shape), "num_samples": s.ags_samples},
            "epochs": 2,
            "train": {"precision": precision, "ags": {"b_small": max(2, s.ags_batch // 4)}, **s.knobs},
            "profile": {"device": s.device.type},
        }
    )
    t0 = time.perf_counter()
    rec = train(spec, "ags", 1, s.ags_batch, out, launcher=launcher).to_json_dict()  # the report's JSON holds it
    return {"record": rec, "wall_s": time.perf_counter() - t0}


# --------------------------------------------------------------------------- the doc
def replace_section(doc: str, section: str) -> str:
    """``doc`` with the section headed by ``section``'s first line (this check's, or another
    benchmark's: bench/service_cluster.py), from that heading to the next ``## `` heading,
    replaced by ``section``, or ``section`` appended when it has none."""
    body = section.rstrip("\n") + "\n"
    heading = body.split("\n", 1)[0]
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(doc):
        return pattern.sub(lambda m: body + ("\n" if m.end() < len(doc) else ""), doc, count=1)
    return doc.rstrip("\n") + "\n\n" + body


def _pct(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{100 * (a - b) / b:+.1f} %"


def _ms(t: float | None) -> str:
    return "-" if t is None else f"{1e3 * t:.1f}"


def _less(a: float | None, b: float | None) -> float | None:
    return None if a is None else a - (b or 0)


def _gib(n: float | None) -> str:
    return "-" if n is None else f"{n / GIB:.2f}"


def render(results: dict) -> str:
    """The markdown section of one run."""
    h = results["header"]
    lines = [
        SECTION,
        "",
        f"{h['date']}; {h['card']}; torch {h['torch']}; {h['model']} at {h['shape']}, local batches "
        f"{h['batches']}; knobs {h['knobs'] or 'none (torch defaults)'}; {h['mode']}; wall {h['wall_s']:.0f} s.",
        "",
        "Step time (ms): the plain PyTorch loop with the batch on the device, Tula's training step (its "
        "profile's median, data path included), and the step predicted by the models fitted on the "
        "profile's smallest, middle and largest batch (the partial search on a GPU). Peak memory (GiB): the plain loop's "
        "`max_memory_allocated`, Tula's trial's measured peak, and the memory model's prediction for "
        "Tula's run. Tula keeps an in-memory data set on the GPU (`resident` GiB, counted in the "
        "prediction), which the plain loop does not: the prediction's error is given against Tula's "
        "measured peak, and, with the resident data set left out, against the plain loop's.",
        "",
        "| precision | b | plain | tula | tula / plain | predicted | predicted vs plain | peak plain | "
        "peak tula | peak predicted | resident | peak error vs tula | peak error vs plain |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["rows"]:
        ratio = "-" if r.get("tula") is None or r.get("plain") is None else f"{r['tula'] / r['plain']:.2f}x"
        lines.append(
            f"| {r['precision']} | {r['b']} | {_ms(r.get('plain'))} | {_ms(r.get('tula'))} | {ratio} | "
            f"{_ms(r.get('predicted'))} | {_pct(r.get('predicted'), r.get('plain'))} | "
            f"{_gib(r.get('peak_plain'))} | {_gib(r.get('peak_tula'))} | {_gib(r.get('peak_predicted'))} | "
            f"{_gib(r.get('resident'))} | {_pct(r.get('peak_predicted'), r.get('peak_tula'))} | "
            f"{_pct(_less(r.get('peak_predicted'), r.get('resident')), r.get('peak_plain'))} |"
        )
    for p, s in results.get("summary", {}).items():
        lines.append("")
        lines.append(
            f"{p}: Tula's step / plain loop, median over b >= {s['from_b']}: {s['tula_over_plain']} (largest "
            f"{s['tula_over_plain_max']}); predicted vs plain, median |error|: {s['pred_err']}; peak memory, median "
            f"|error|: {s['mem_err_tula']} against Tula's measured peak, {s['mem_err']} against the plain loop's "
            "(the resident data set left out)."
        )
        if s.get("pred_stats"):
            lines.append("")
            lines.append(f"{p}: predicted step against the plain loop's, {s['pred_stats']}.")
    mb = results.get("max_batch")
    if mb:
        lines += [
            "",
            f"Largest local batch predicted on the card (fp32, budget {_gib(mb['budget_bytes'])} GiB, no safety "
            f"margin): **{mb['b_max']}**. One plain step at 0.95x (b = {mb['lo']['b']}): "
            f"{'fits' if mb['lo']['fits'] else 'out of memory'} (peak {_gib(mb['lo'].get('peak_bytes'))} GiB, "
            f"predicted {_gib(mb['lo']['predicted_bytes'])} GiB); at 1.05x (b = {mb['hi']['b']}): "
            f"{'fits' if mb['hi']['fits'] else 'out of memory'}.",
        ]
    lines += render_transformer(results)
    for ags in results.get("ags", []):
        eps = ags["epochs"]
        lines += [
            "",
            f"AGS in {ags['precision']}, 2 epochs ({ags['model']} at {ags['shape']}, {ags['samples']} samples, B = {ags['batch']}, "
            f"{ags['wall_s']:.0f} s): train loss "
            + ", ".join(f"{e['train_loss']:.3f}" for e in eps)
            + "; steps the scaler skipped "
            + ", ".join(str(e.get("skipped_steps", "-")) for e in eps)
            + "; AGS-scaled share "
            + ", ".join(f"{e['scaled_fraction']:.2f}" if "scaled_fraction" in e else "-" for e in eps)
            + ".",
        ]
    for note in results.get("notes", []):
        lines += ["", note]
    return "\n".join(lines) + "\n"


def render_transformer(results: dict) -> list[str]:
    """The transformer's table (#44) and its summary per precision; nothing where it did not run."""
    rows = results.get("transformer") or []
    if not rows:
        return []
    g = results["header"].get("gpt", {})
    lines = [
        "",
        f"Transformer (#44): tiny_gpt ({g.get('n_layers')} blocks, width {g.get('d_model')}, {g.get('n_heads')} "
        f"heads, 256 token ids), AdamW, attention through `F.scaled_dot_product_attention` (causal). Step time "
        "(ms): the plain loop on random token ids already on the device (cross-entropy over the vocabulary), "
        "the same with every attention forced through SDPA's flash-attention kernel (`flash`; `-` where it "
        "cannot run: fp32 on a GPU), Tula's profile of the `text` data set at the sequence length L "
        f"{g.get('length')} and one trial at each other length {g.get('lengths')} (at its largest batch), and "
        "the prediction of the models fitted on that profile less one batch at L "
        f"{g.get('length')}; `fitted` says whether the point was one of the fit's trials (no: held out).",
        "",
        "| model | precision | b | L | fitted | plain | flash | tula | tula / plain | predicted | predicted vs plain | "
        "peak plain | peak tula | peak predicted | peak error vs tula | peak error vs plain |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ratio = "-" if r.get("tula") is None or r.get("plain") is None else f"{r['tula'] / r['plain']:.2f}x"
        lines.append(
            f"| tiny_gpt | {r['precision']} | {r['b']} | {r['length']} | {'yes' if r.get('fitted') else 'no'} | "
            f"{_ms(r.get('plain'))} | {_ms(r.get('flash'))} | {_ms(r.get('tula'))} | {ratio} | "
            f"{_ms(r.get('predicted'))} | {_pct(r.get('predicted'), r.get('plain'))} | {_gib(r.get('peak_plain'))} | "
            f"{_gib(r.get('peak_tula'))} | {_gib(r.get('peak_predicted'))} | "
            f"{_pct(r.get('peak_predicted'), r.get('peak_tula'))} | {_pct(r.get('peak_predicted'), r.get('peak_plain'))} |"
        )
    for precision in dict.fromkeys(r["precision"] for r in rows):
        mine = [r for r in rows if r["precision"] == precision]
        held = [r for r in mine if not r.get("fitted")]
        step = _median_abs([(r["predicted"] - r["plain"]) / r["plain"] for r in mine if r.get("plain")])
        step_held = _median_abs([(r["predicted"] - r["plain"]) / r["plain"] for r in held if r.get("plain")])
        flash = [r["flash"] / r["plain"] for r in mine if r.get("flash") and r.get("plain")]
        peak = _median_abs([(r["peak_predicted"] - r["peak_plain"]) / r["peak_plain"] for r in mine
                            if r.get("peak_plain") and r.get("peak_predicted") is not None])  # fmt: skip
        lines += [
            "",
            f"tiny_gpt {precision}: predicted vs plain step, median |error| {step} ({step_held} over the "
            f"{len(held)} held-out points); flash forced / default, median "
            f"{f'{statistics.median(flash):.2f}x' if flash else '-'}; peak memory predicted vs plain, median "
            f"|error| {peak}.",
        ]
    return lines


# --------------------------------------------------------------------------- the run, predicted (#26)
PREDICTION_SECTION = "## Predicting the run on a GPU (`bench/gpu.py --run-prediction`, issue #26)"


@dataclass
class PredictionCase:
    """One model of ``--run-prediction``: a synthetic set, the batches its partial profile
    measures (N = 1), and the two other global batches trained beside the plan's choice."""

    model: str
    shape: tuple[int, int, int]
    num_samples: int
    min_batch: int
    max_batch: int
    others: tuple[int, ...]
    num_classes: int = 10


def prediction_cases(dry_run: bool, models: list[str] | None = None) -> list[PredictionCase]:
    if dry_run:
        return [PredictionCase(DRY_RUN_MODEL, (3, 16, 16), 160, 8, 32, (8, 16, 32))]
    cases = [  # the two: ResNet-18 at 32x32 and ResNet-50 at 224x224
        PredictionCase("resnet18", (3, 32, 32), 16000, 64, 1024, (128, 512, 1024)),
        PredictionCase("resnet50", (3, 224, 224), 3200, 32, 256, (64, 128, 256)),
    ]
    return [c for c in cases if not models or c.model in models]


def prediction_job(c: PredictionCase, precision: str, method: str, device: str, epochs: int, knobs: dict) -> dict:
    return {
        "name": f"gpu-pred-{c.model}-{precision}-{method}",
        "model": {"name": c.model, "kwargs": {"num_classes": c.num_classes}},
        "data": {
            "name": "synthetic",
            "sample_shape": list(c.shape),
            "num_classes": c.num_classes,
            "num_samples": c.num_samples,
        },  # fmt: skip
        "epochs": epochs,
        # the middle batch (the GPU's default, set for the dry run's CPU too): the floor under small steps
        "search": {
            "cluster_sizes": [1],
            "min_batch": c.min_batch,
            "max_batch": c.max_batch,
            "partial_middle_batch": True,
        },
        "profile": {"device": device, "memory_probe_batches": [2, 4]},
        "train": {
            "method": method,
            "precision": precision,
            "warmup_epochs": 1,
            "ags": {"b_small": max(2, c.min_batch // 4)},
            **knobs,
        },  # fmt: skip
    }


def run_prediction(
    s: Setup,
    budget: Budget,
    dry_run: bool,
    methods: list[str],
    epochs: int,
    models: list[str] | None = None,
    others: list[int] | None = None,
) -> dict:
    """#26's GPU rows: per case, precision (bf16, fp16 of ``s.precisions``) and method, a partial
    profile with that ``train.method``, the plan's choice (objective knee) and two other batches
    trained ``epochs`` epochs each; measured epoch (median after the first) against predicted
    (bench/run_prediction.py's ``predict_and_train``)."""
    from run_prediction import predict_and_train  # bench/, beside this script

    from tula.engine.launch import LocalLauncher

    launcher = LocalLauncher(device=s.device.type, threads_per_worker=s.threads)
    rows: list[dict] = []
    notes: list[str] = []
    need = 5 if dry_run else 45
    precisions = [p for p in s.precisions if p != "fp32"] or list(s.precisions)
    for c in prediction_cases(dry_run, models):
        for precision in precisions:
            for method in methods:
                what = f"{c.model} {precision} {method}"
                if not budget.allows(need):
                    notes.append(f"{what}: not run, the {budget.total_s:.0f} s budget ran out.")
                    continue
                t0 = time.perf_counter()
                job = prediction_job(c, precision, method, s.device.type, epochs, s.knobs)
                # the other batches: the case's first two that the plan did not choose, or all of ``others``
                got = predict_and_train(job, launcher, [(1, b) for b in others or c.others],
                                        cap_others=None if others else 2)  # fmt: skip
                for r in got:
                    rows.append({"model": c.model, "shape": "x".join(map(str, c.shape)), "precision": precision, **r})
                    if "error" in r:
                        print(f"{what} B={r['global_batch']}{' *' if r['chosen'] else ''}: predicted "
                              f"{r['predicted_epoch_s']:.3f} s, measured {r['measured_epoch_s']:.3f} s "
                              f"({r['error']:+.1%})", flush=True)  # fmt: skip
                    else:
                        print(f"{what} B={r['global_batch']}: skipped, {r['skipped']}", flush=True)
                print(f"{what}: {time.perf_counter() - t0:.0f} s", flush=True)
                _free(s.device)
    return {"rows": rows, "notes": notes}


def render_prediction(results: dict) -> str:
    h = results["header"]
    lines = [
        PREDICTION_SECTION,
        "",
        f"{h['date']}; {h['card']}; torch {h['torch']}; {h['mode']}; {h['epochs']} epochs per run; wall "
        f"{h['wall_s']:.0f} s. Per model, precision and method: a partial profile on one worker (its smallest, "
        "middle and largest batch on a GPU, with that `train.method`'s run trial), the plan's choice (objective knee, `*`) and two "
        "other batches trained with `tula.engine.train.train`; measured is the median `epoch_wall_s` over the "
        "epochs after the first, predicted the plan's epoch at that B (`tula.core.run_costs`).",
        "",
        "| model | precision | method | B | steps/epoch | step predicted ms | step measured ms | predicted s | "
        "measured s | error | end predicted s | end measured s |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    errs = []
    for r in results["rows"]:
        b = f"{r['global_batch']}{' *' if r.get('chosen') else ''}"
        head = f"| {r['model']} {r['shape']} | {r['precision']} | {r['method']} | {b} |"
        if "error" not in r:
            lines.append(f"{head} - | - | - | - | - | skipped: {r['skipped']} | - | - |")
            continue
        errs.append(abs(r["error"]))
        lines.append(
            f"{head} {r.get('steps_per_epoch') or '-'} | {_ms(r.get('predicted_step_s'))} | "
            f"{_ms(r.get('measured_step_s'))} | {r['predicted_epoch_s']:.3f} | {r['measured_epoch_s']:.3f} | "
            f"{r['error']:+.1%} | {r.get('predicted_end_s', float('nan')):.3f} | {r['end_s']:.3f} |"
        )
    if errs:
        lines += ["", f"Median |error| {_median_abs(errs)} (target 5 %), max {100 * max(errs):.1f} % over "
                  f"{len(errs)} configurations."]  # fmt: skip
        # the field's statistics of |predicted / measured - 1| (the table's error is measured / predicted - 1)
        field = [abs(r["predicted_epoch_s"] / r["measured_epoch_s"] - 1) for r in results["rows"] if "error" in r]
        lines += ["", f"As the field states it, predicted against measured epoch: {_stats_text(field)}."]
    for note in results.get("notes", []):
        lines += ["", note]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- the run
def _stats_text(errors: list[float]) -> str:
    """``|error|`` mean, median, 95th percentile and max (``bench/_stats.py``), or "" for none; a GPU run
    measures no configuration twice, so no noise floor."""
    if not errors:
        return ""
    s = summarise(errors)
    return (
        f"|error| over {s['n']} configurations: mean {100 * s['mean']:.1f} %, median {100 * s['median']:.1f} %, "
        f"95th percentile {100 * s['p95']:.1f} %, max {100 * s['max']:.1f} %"
    )


def _median_abs(xs: list[float]) -> str:
    return f"{100 * statistics.median(abs(x) for x in xs):.1f} %" if xs else "-"


def run(s: Setup, budget: Budget, mode: str) -> dict:
    from tula.engine.launch import LocalLauncher

    rows: list[dict] = []
    notes: list[str] = []
    summary: dict = {}
    results: dict = {"rows": rows, "notes": notes, "summary": summary}
    launcher = LocalLauncher(device=s.device.type, threads_per_worker=s.threads)
    mm32: MemoryModel | None = None
    for precision in s.precisions:
        if not budget.allows(40 if s.device.type == "cuda" else 5):
            notes.append(f"{precision}: not run, the {budget.total_s:.0f} s budget ran out.")
            continue
        prec_rows = []
        for b in s.batches:
            r = plain_steps(s, precision, b, s.warmup, s.timed)
            prec_rows.append({"precision": precision, "b": b, "plain": r["t_step_s"], "peak_plain": r["peak_bytes"]})
            print(f"{precision} b={b}: plain {_ms(r['t_step_s'])} ms, peak {_gib(r['peak_bytes'])} GiB", flush=True)
        _free(s.device)
        prof, mm, perf, rpn = tula_profile(s, precision, launcher)
        if precision == "fp32":
            mm32 = mm
        by_b = {t.local_batch: t for t in prof.trials if t.n_workers == 1}
        for row in prec_rows:
            t = by_b.get(row["b"])
            row["tula"] = t.t_step_s if t and t.status == "ok" else None
            row["tula_status"] = t.status if t else "not profiled"
            row["predicted"] = float(perf.t_step_s(row["b"], 1, rpn))
            row["peak_predicted"] = int(mm.predict_peak_bytes(row["b"], 1))
            row["peak_tula"] = t.peak_mem_bytes if t else None
            row["resident"] = int(mm.resident_data_bytes)
            print(f"{precision} b={row['b']}: tula {_ms(row['tula'])} ms ({row['tula_status']}), predicted "
                  f"{_ms(row['predicted'])} ms, peak predicted {_gib(row['peak_predicted'])} GiB", flush=True)  # fmt: skip
        rows.extend(prec_rows)
        big = [r for r in prec_rows if r["b"] >= s.ratio_from_b and r["tula"] is not None]
        summary[precision] = {
            "tula_over_plain": f"{statistics.median(r['tula'] / r['plain'] for r in big):.2f}x" if big else "-",
            "tula_over_plain_max": f"{max(r['tula'] / r['plain'] for r in big):.2f}x" if big else "-",
            "from_b": s.ratio_from_b,
            "pred_err": _median_abs([(r["predicted"] - r["plain"]) / r["plain"] for r in prec_rows]),
            "pred_stats": _stats_text([abs(r["predicted"] / r["plain"] - 1) for r in prec_rows if r["plain"]]),
            "mem_err": _median_abs(
                [
                    (r["peak_predicted"] - r["resident"] - r["peak_plain"]) / r["peak_plain"]
                    for r in prec_rows
                    if r["peak_plain"]
                ]
            ),
            "mem_err_tula": _median_abs(
                [(r["peak_predicted"] - r["peak_tula"]) / r["peak_tula"] for r in prec_rows if r["peak_tula"]]
            ),
        }
        if precision == "fp32" and mm32 is not None:
            results["max_batch"] = max_batch_check(s, mm32, budget, notes)
    results["transformer"] = []
    for precision in [p for p in s.precisions if p in GPT_PRECISIONS]:
        if not budget.allows(40 if s.device.type == "cuda" else 5):
            notes.append(f"tiny_gpt in {precision}: not run, the {budget.total_s:.0f} s budget ran out.")
            continue
        results["transformer"].extend(transformer_rows(s, precision, launcher, notes))
    results["ags"] = []
    for precision in ("fp16", "fp32"):  # fp16's scaler on the GPU, and the same run in fp32 beside it
        if not budget.allows(30 if s.device.type == "cuda" else 5):
            notes.append(f"AGS in {precision}: not run, the {budget.total_s:.0f} s budget ran out.")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            ags = ags_run(s, launcher, Path(tmp) / "ags", precision)
        rec = ags["record"]
        results["ags"].append(
            {
                "precision": precision,
                "model": s.ags_model,
                "shape": "x".join(map(str, s.ags_shape)),
                "samples": s.ags_samples,
                "batch": s.ags_batch,
                "wall_s": ags["wall_s"],
                "epochs": rec["history"],
            }
        )
        losses = [round(e["train_loss"], 3) for e in rec["history"]]
        print(f"AGS {precision}: {len(rec['history'])} epochs, losses {losses}", flush=True)
    if mode == "dry-run":
        notes.append(
            "A dry run on the CPU: no peak-memory counter, and the steps around the largest batch cannot run out "
            "of memory; no figure here is a GPU's."
        )
    return results


def max_batch_check(s: Setup, mm: MemoryModel, budget: Budget, notes: list[str]) -> dict | None:
    if s.device.type == "cuda":
        total = torch.cuda.get_device_properties(s.device).total_memory
    else:  # a dry run: a budget the tiny model's batches reach, so the code runs
        total = int(mm.predict_peak_bytes(max(s.batches) * 2))
    b_max = mm.max_local_batch(total, safety=0.0, n_workers=1)
    if not b_max:
        notes.append("largest batch: the memory model allows no batch on this card.")
        return None
    need = 30 if s.device.type == "cuda" else 2
    if not budget.allows(need):
        notes.append(f"largest batch {b_max}: the steps at 0.95x and 1.05x were not run (budget).")
        return None
    lo, hi = max(1, math.floor(0.95 * b_max)), math.ceil(1.05 * b_max)
    res: dict[str, Any] = {"budget_bytes": total, "b_max": b_max}
    for key, b in (("lo", lo), ("hi", hi)):
        r = fits_one_step(s, b)
        res[key] = {"b": b, **r, "predicted_bytes": int(mm.predict_peak_bytes(b, 1))}
        print(f"largest batch {b_max}: b={b} {'fits' if r['fits'] else 'out of memory'}", flush=True)
    return res


def setup_for(args: argparse.Namespace) -> tuple[Setup, str]:
    knobs = {k: True for k, on in (("tf32", args.tf32), ("channels_last", args.channels_last),
                                    ("cudnn_benchmark", args.cudnn_benchmark)) if on}  # fmt: skip
    if args.dry_run:
        os.environ["TULA_FP16_ON_CPU"] = "1"  # fp16's path on torch's CPU kernels: a test switch
        return (
            Setup(
                device=torch.device("cpu"),
                model=DRY_RUN_MODEL,
                num_classes=10,
                shape=(3, 16, 16),
                batches=[4, 8],
                precisions=list(args.precisions),
                warmup=1,
                timed=2,
                knobs=knobs,
                ags_samples=48,
                ags_batch=16,
                ags_shape=(3, 16, 16),
                ags_model=DRY_RUN_MODEL,
                threads=1,
                ratio_from_b=4,
                gpt_kwargs=dict(DRY_RUN_GPT_KWARGS),
                gpt_batches=[2, 4],
                gpt_length=16,
                gpt_lengths=[8, 16, 32],
            ),  # fmt: skip
            "dry-run",
        )
    if not torch.cuda.is_available():
        raise SystemExit("bench/gpu.py: no CUDA device is visible here; run it with --dry-run on a CPU")
    device = torch.device("cuda", 0)
    small = torch.cuda.get_device_properties(device).total_memory < 16 * GIB
    return (
        Setup(
            device=device,
            model="resnet18" if small else "resnet50",
            num_classes=1000,
            shape=(3, 224, 224),
            batches=list(args.batches),
            precisions=list(args.precisions),
            warmup=args.warmup,
            timed=args.timed,
            knobs=knobs,
        ),  # fmt: skip
        "cuda",
    )


def _batch_list(text: str) -> list[int]:
    """``--others``: comma-separated positive global batches."""
    try:
        out = [int(b) for b in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: each global batch must be at least 1")
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="the CPU path: a tiny model, a few steps")
    ap.add_argument("--batches", type=int, nargs="+", default=[32, 64, 128, 256])
    ap.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--timed", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--cudnn-benchmark", action="store_true")
    ap.add_argument(
        "--doc", type=Path, default=None, help="default: docs/benchmarks-history.md on a GPU, none in a dry run"
    )
    ap.add_argument("--run-prediction", action="store_true",
                    help="only #26's rows: predicted against measured training epochs (bf16, fp16; --methods)")  # fmt: skip
    ap.add_argument("--methods", default="ags,lbt", help="--run-prediction's training methods, comma-separated")
    ap.add_argument("--epochs", type=int, default=4, help="--run-prediction's epochs per training run")
    ap.add_argument("--models", default="resnet18,resnet50", help="--run-prediction's models, comma-separated")
    ap.add_argument("--others", default=None, type=_batch_list,
                    help="--run-prediction's other global batches trained beside the plan's choice, comma-separated "
                         "(default: each model's own, the first two the plan did not choose)")  # fmt: skip
    ap.add_argument("--json", type=Path, default=None,
                    help="also write the results, with each configuration's measured parts, as JSON here")  # fmt: skip
    args = ap.parse_args(argv)
    budget = Budget(args.budget_s)
    s, mode = setup_for(args)
    if s.threads:
        torch.set_num_threads(s.threads)  # the plain loop with the threads a rank gets
    card = (
        torch.cuda.get_device_name(s.device)
        if s.device.type == "cuda"
        else f"CPU ({platform.processor() or platform.machine()})"
    )
    print(f"{mode}: {card}, torch {torch.__version__}, {s.model} at {'x'.join(map(str, s.shape))}", flush=True)
    if args.run_prediction:
        results = run_prediction(s, budget, mode == "dry-run", args.methods.split(","), args.epochs,
                                 args.models.split(","), args.others)  # fmt: skip
    else:
        results = run(s, budget, mode)
    results["header"] = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "card": card
        + (
            f" ({torch.cuda.get_device_properties(s.device).total_memory / GIB:.1f} GiB)"
            if s.device.type == "cuda"
            else ""
        ),
        "torch": torch.__version__,
        "model": s.model,
        "shape": "x".join(map(str, s.shape)),
        "batches": ", ".join(map(str, s.batches)),
        "knobs": ", ".join(f"train.{k}" for k in s.knobs),
        "mode": "one GPU" if mode == "cuda" else "dry run on the CPU",
        "gpt": {**s.gpt_kwargs, "length": s.gpt_length, "lengths": ", ".join(map(str, s.gpt_lengths))},
        "wall_s": time.perf_counter() - budget.t0,
        "epochs": args.epochs,
    }
    text = render_prediction(results) if args.run_prediction else render(results)
    print()
    print(text)
    doc = args.doc if args.doc is not None else (ROOT / "docs" / "benchmarks-history.md" if mode == "cuda" else None)
    if doc is not None:
        doc.write_text(replace_section(doc.read_text() if doc.exists() else "", text))
        print(f"wrote the section into {doc}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1, default=str))
        print(f"wrote the results into {args.json}")
    return results


if __name__ == "__main__":
    main()
