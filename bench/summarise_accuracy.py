"""The accuracy of Tula's predictions, from the per-configuration rows the history records.

Reads the tables of ``docs/benchmarks-history.md`` (nothing is rerun), and prints, per prediction
claim, the mean, median, 95th percentile and worst absolute relative error (``bench/_stats.py``),
the noise floor where the same run measured the same configuration twice, and Kendall's tau
between the predicted and the measured ranking of configurations where a plan ranks them.
Each block names the run's date and machine and the section (its anchor) the rows come from.
``docs/benchmarks.md`` quotes this script's output.

    python bench/summarise_accuracy.py                 # the statistics
    python bench/summarise_accuracy.py --check-links   # also: every history link of the summary resolves

Only sections whose tables give one row per configuration are read; the runs that recorded only
a median and a maximum are quoted on the summary page as recorded.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stats import kendall_tau, summarise, within_noise  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HISTORY = ROOT / "docs" / "benchmarks-history.md"
SUMMARY = ROOT / "docs" / "benchmarks.md"
CPU = "x86_64 VM, 2 cores, CPU only, torch 2.14.1"
H100 = "one NVIDIA H100 80GB HBM3, torch 2.11.0+cu130"


# --------------------------------------------------------------------------- reading the page
def slug(heading: str) -> str:
    """The anchor MkDocs gives a heading (Python-Markdown's ``toc`` slugify, its default)."""
    from markdown.extensions.toc import slugify

    text = re.sub(r"[`*]", "", heading)
    return slugify(text, "-")


def sections(text: str) -> dict[str, str]:
    """Each heading's line (``## ...``) -> the text up to the next heading of any level."""
    out: dict[str, str] = {}
    parts = re.split(r"^(#{1,6} .*)$", text, flags=re.M)
    for head, body in zip(parts[1::2], parts[2::2], strict=True):
        out[head.strip()] = body
    return out


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)

    def col(self, name: str, nth: int = 0) -> int:
        hits = [i for i, h in enumerate(self.header) if h == name]
        if len(hits) <= nth:
            raise KeyError(f"no column {name!r} (occurrence {nth}) in {self.header}")
        return hits[nth]


def tables(body: str) -> list[Table]:
    """The markdown tables of a section, in order."""
    out: list[Table] = []
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|[\s:|-]+\|$", lines[i + 1].strip()):
            t = Table([c.strip() for c in lines[i].strip().strip("|").split("|")])
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                t.rows.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
                i += 1
            out.append(t)
        else:
            i += 1
    return out


def num(cell: str) -> float | None:
    """A table cell as a number (``*`` marks, bold, ``%`` and signs dropped); None for ``-`` or text."""
    s = cell.replace("*", "").replace("%", "").replace("\u2212", "-").strip()
    try:
        return float(s)
    except ValueError:
        return None


def flip(measured_over_predicted_minus_1: float) -> float:
    """An error printed as ``measured / predicted - 1`` restated as ``|predicted / measured - 1|``."""
    e = measured_over_predicted_minus_1
    return abs(1.0 / (1.0 + e) - 1.0)


def pct(cell: str) -> float | None:
    """A percentage cell (``+19.2 %``, ``-1.5%``) as a fraction."""
    x = num(cell)
    return None if x is None else x / 100.0


def val(cell: str) -> float:
    """A table cell that must be a number (:func:`num`)."""
    x = num(cell)
    if x is None:
        raise SystemExit(f"the table cell {cell!r} is not a number: update bench/summarise_accuracy.py")
    return x


def pct_val(cell: str) -> float:
    """A percentage cell that must be a number, as a fraction (:func:`pct`)."""
    return val(cell) / 100.0


# --------------------------------------------------------------------------- the claims
@dataclass
class Block:
    claim: str
    setting: str
    heading: str
    errors: list[float]
    noise: list[float] | None = None
    tau: tuple[float, float] | None = None
    tau_of: str = ""
    note: str = ""


def _section(secs: dict[str, str], heading: str) -> str:
    if heading not in secs:
        raise SystemExit(f"the history has no heading {heading!r}: update bench/summarise_accuracy.py")
    return secs[heading]


def gpu_check(secs) -> list[Block]:
    h = "## GPU check (`bench/gpu.py`, issue #25)"
    t = tables(_section(secs, h))[0]
    out = []
    for prec in ("fp32", "bf16", "fp16", None):
        rows = [r for r in t.rows if prec is None or r[0] == prec]
        b = [val(r[t.col("b")]) for r in rows]
        pred = [val(r[t.col("predicted")]) for r in rows]
        plain = [val(r[t.col("plain")]) for r in rows]
        errs = [abs(pct_val(r[t.col("predicted vs plain")])) for r in rows]  # as the benchmark printed it
        # a plan ranks batches by time per sample: the step over b
        tau = kendall_tau([p / x for p, x in zip(pred, b, strict=True)], [m / x for m, x in zip(plain, b, strict=True)])
        label = prec or "all precisions"
        out.append(
            Block(
                f"step time (partial search), ResNet-50/224, {label}",
                f"2026-11-26 12:50 UTC, {H100}",
                h,
                errs,
                tau=tau if prec else None,  # a plan ranks the batches of one precision
                tau_of="time per sample over b = 32..256",
            )  # fmt: skip
        )
    mem = [abs(pct_val(r[t.col("peak error vs tula")])) for r in t.rows]
    out.append(Block("peak memory, ResNet-50/224, fp32/bf16/fp16", f"2026-11-26 12:50 UTC, {H100}", h, mem))
    return out


def accumulation(secs) -> list[Block]:
    h = "### Accumulation at a fixed B (`bench/accumulation.py`)"
    t = tables(_section(secs, h))[0]
    pred = [val(r[t.col("predicted ms")]) for r in t.rows]
    meas = [val(r[t.col("measured ms")]) for r in t.rows]
    return [
        Block(
            "step time with accumulation, small_cnn on digits, B = 512, N 1-2 x k 1-4",
            f"2026-11-25 20:46 UTC, {CPU}",
            h,
            list(map(abs, (p / m - 1 for p, m in zip(pred, meas, strict=True)))),
            tau=kendall_tau(pred, meas),
            tau_of="step time of the 6 (N, k) at fixed B",
        )  # fmt: skip
    ]


def simulator(secs) -> list[Block]:
    h = "## Simulating held-out configurations (`bench/simulate_accuracy.py`, issue #11)"
    ts = tables(_section(secs, h))
    loo, n2 = ts[1], ts[2]
    key = lambda t, r: (int(val(r[t.col("N")])), int(val(r[t.col("B")])))  # noqa: E731
    noise = {key(loo, r): pct_val(r[loo.col("noise A-B")]) for r in loo.rows}
    out = []
    for t, what in ((loo, "leave one out, 8 configurations"), (n2, "N = 2 held out (a one-worker fit)")):
        sim = [val(r[t.col("simulated")]) for r in t.rows]
        meas = [val(r[t.col("measured (A)")]) for r in t.rows]
        steps = [1437 // key(t, r)[1] for r in t.rows]  # digits' 1437 training samples (the section's own rule)
        tau = kendall_tau(
            [s * k for s, k in zip(sim, steps, strict=True)], [m * k for m, k in zip(meas, steps, strict=True)]
        )
        out.append(
            Block(
                f"simulated step (and epoch) time, small_cnn on digits, {what}",
                f"2026-11-24 04:19 UTC, {CPU}",
                h,
                [abs(s / m - 1) for s, m in zip(sim, meas, strict=True)],
                noise=[noise[key(t, r)] for r in t.rows],
                tau=tau,
                tau_of="epoch time of the configurations",
            )  # fmt: skip
        )
    return out


def run_prediction_cpu(secs) -> list[Block]:
    h = "## Predicting the run that trains (`bench/run_prediction.py`, issue #26)"
    t = tables(_section(secs, h))[0]
    rows = [r for r in t.rows if num(r[t.col("measured s")]) is not None]
    out = []
    for data in ("digits", "mnist1d", None):
        sel = [r for r in rows if data is None or r[0] == data]
        errs = [flip(pct_val(r[t.col("error")])) for r in sel]  # printed as measured / predicted - 1
        pred = [val(r[t.col("predicted s")]) for r in sel]
        meas = [val(r[t.col("measured s")]) for r in sel]
        label = data or "both data sets"
        out.append(
            Block(
                f"epoch time of the run, 8 methods, {label}",
                f"2026-11-26 04:19 UTC, {CPU}, --repeats 1",
                h,
                errs,
                # pooled over the data sets the ranking would mostly be digits' shorter epochs against MNIST-1D's
                tau=kendall_tau(pred, meas) if data else None,
                tau_of="epoch time over (method, N, B)",
            )  # fmt: skip
        )
    return out


def run_prediction_gpu(secs) -> list[Block]:
    h1 = "## Predicting the run on a GPU (`bench/gpu.py --run-prediction`, issue #26)"
    h2 = (
        "## Predicting the run on a GPU, in context (issue #26, 2026-11-26, one NVIDIA H100 80GB HBM3, "
        "torch 2.11.0+cu130)"
    )
    t1 = tables(_section(secs, h1))[0]
    t2 = tables(_section(secs, h2))[1]  # 15:41, the floor and the middle batch; its bf16 rows were not rerun
    rows = [
        (r[0], pct_val(r[t1.col("error")]), val(r[t1.col("predicted s")]), val(r[t1.col("measured s")]))
        for r in t1.rows
    ]
    rows += [
        (r[0], pct_val(r[t2.col("error")]), val(r[t2.col("predicted s")]), val(r[t2.col("measured s")]))
        for r in t2.rows
        if r[t2.col("precision")] == "bf16"
    ]
    out = []
    for model in ("resnet50", "resnet18", None):
        sel = [r for r in rows if model is None or r[0].startswith(model)]
        tau = kendall_tau([r[2] for r in sel], [r[3] for r in sel])
        out.append(
            Block(
                f"epoch time of the run, AGS and LBT, fp16 and bf16, {model or 'ResNet-50 and ResNet-18'}",
                f"2026-11-26 15:41 and 18:25-18:28 UTC, {H100}",
                h1,
                [flip(r[1]) for r in sel],  # printed as measured / predicted - 1
                tau=tau if model else None,  # pooled, it would mostly rank ResNet-50 against ResNet-18
                tau_of="epoch time over (precision, method, B)",
            )  # fmt: skip
        )
    return out


def generations(secs) -> list[Block]:
    runs = [
        ("### MNIST-1D with world starts counted (2026-11-27 05:23-05:32 UTC)", 0, "MNIST-1D, cores shared",
         "2026-11-27 05:23 UTC"),
        ("### Digits with world starts counted (2026-11-27 08:05-08:18 UTC)", 0, "digits, cores shared",
         "2026-11-27 08:05 UTC"),
        ("### MNIST-1D with its data set cached (2026-11-27 08:27-08:34 UTC)", 0, "MNIST-1D, cores shared",
         "2026-11-27 08:27 UTC"),
    ]  # fmt: skip
    pin = (
        "### Each host on a core of its own (`--pin`), against the same runs sharing the cores "
        "(2026-11-27 13:45-14:08 UTC)"
    )
    runs += [
        (pin, 0, "MNIST-1D, each host on a core of its own", "2026-11-27 13:45 UTC"),
        (pin, 1, "MNIST-1D, cores shared", "2026-11-27 13:53 UTC"),
        (pin, 2, "digits, each host on a core of its own", "2026-11-27 13:58 UTC"),
    ]
    out = []
    for h, i, what, when in runs:
        t = tables(_section(secs, h))[i]
        c = t.col("measured / predicted (seeds)")
        ratios = [float(x) for r in t.rows for x in r[c].split(",")]
        out.append(
            Block(
                f"each generation's epoch while training, {what} ({len(t.rows)} cells x 3 seeds)",
                f"{when}, {CPU}, 2 emulated hosts",
                h,
                [abs(1 / x - 1) for x in ratios],  # printed as measured / predicted
            )  # fmt: skip
        )
    return out


def time_to_accuracy(secs) -> list[Block]:
    out = []
    for h, data in (
        ("### digits (`small_cnn` width 32, 3 seeds)", "digits"),
        ("### MNIST-1D (`small_cnn1d` width 32, 3 seeds)", "MNIST-1D"),
    ):
        t = tables(_section(secs, h))[0]
        rows = [r for r in t.rows if num(r[t.col("B")]) != 32]  # B = 32 is the reference: 0 by construction
        pred = [val(r[t.col("predicted E/E0")]) for r in rows]
        for method, nth in (("lbt", 0), ("ags", 1)):
            meas = [val(r[t.col("measured E/E0", nth)]) for r in rows]
            out.append(
                Block(
                    f"relative epochs to target (B_noise), {data}, {method}, B = 64..1024",
                    f"2026-11-25 20:10 UTC, {CPU} (AMD EPYC)",
                    h,
                    [abs(pct_val(r[t.col("error", nth)])) for r in rows],
                    tau=kendall_tau(pred, meas),
                    tau_of="epochs to target over B",
                )  # fmt: skip
            )
    return out


READERS = (gpu_check, accumulation, simulator, run_prediction_cpu, run_prediction_gpu, generations, time_to_accuracy)


def blocks(text: str) -> list[Block]:
    secs = sections(text)
    return [b for reader in READERS for b in reader(secs)]


def _p(x: float) -> str:
    return f"{100 * x:.1f} %"


def render(b: Block) -> str:
    s = summarise(b.errors)
    lines = [
        f"{b.claim}",
        f"  setting: {b.setting}; rows: benchmarks-history.md#{slug(b.heading.lstrip('# '))}",
        f"  |error| n {s['n']}: mean {_p(s['mean'])}, median {_p(s['median'])}, p95 {_p(s['p95'])}, max {_p(s['max'])}",
    ]
    nf = None
    if b.noise is not None:
        nf = summarise(b.noise)
        lines.append(
            f"  noise floor (same configuration twice, same run) n {nf['n']}: mean {_p(nf['mean'])}, "
            f"median {_p(nf['median'])}, p95 {_p(nf['p95'])}, max {_p(nf['max'])}"
        )
    if "CPU" in b.setting:
        lines.append(f"  {within_noise(s, nf)}")
    if b.tau is not None:
        t, p = b.tau
        lines.append(f"  Kendall's tau ({b.tau_of}): " + ("-" if math.isnan(t) else f"{t:.2f} (p = {p:.2g})"))
    return "\n".join(lines)


def check_links(summary: str, history: str) -> list[str]:
    """The ``benchmarks-history.md#anchor`` links of the summary that name no heading of the history."""
    anchors = {slug(h.lstrip("# ")) for h in sections(history)}
    links = re.findall(r"benchmarks-history\.md#([A-Za-z0-9_-]+)", summary)
    return sorted({a for a in links if a not in anchors})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--history", type=Path, default=HISTORY)
    ap.add_argument("--check-links", action="store_true", help="check the summary page's links into the history")
    args = ap.parse_args()
    text = args.history.read_text()
    for b in blocks(text):
        print(render(b))
        print()
    if args.check_links:
        bad = check_links(SUMMARY.read_text(), text)
        if bad:
            raise SystemExit(f"docs/benchmarks.md links to anchors the history lacks: {', '.join(bad)}")
        print("every link of docs/benchmarks.md into the history resolves")


if __name__ == "__main__":
    main()
