"""The benchmarks' accuracy statistics (``bench/_stats.py``), the summary of the rerun history
(``bench/summarise_accuracy.py``) and the statistics lines the prediction benchmarks print, on
known numbers; and the benchmarks page's links into its history, which must all resolve."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


def _load(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))  # the scripts import _stats from their own folder
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_statistics_of_known_errors():
    st = _load("_stats")
    s = st.error_stats([110, 90, 100, 150], [100, 100, 100, 100])
    assert s["n"] == 4
    assert s["mean"] == pytest.approx((0.1 + 0.1 + 0.0 + 0.5) / 4)
    assert s["median"] == pytest.approx(0.1)
    assert s["max"] == pytest.approx(0.5)
    assert 0.1 < s["p95"] < 0.5  # interpolated between the two largest
    assert s["p95"] == pytest.approx(0.1 + 0.85 * 0.4)  # numpy's linear rule: rank 0.95 * 3 = 2.85
    # the error is relative to the measured value: predicting 2 for 1 is 100 %, 1 for 2 is 50 %
    assert st.abs_rel_errors([2.0, 1.0], [1.0, 2.0]).tolist() == [1.0, 0.5]


def test_kendall_tau_and_the_noise_verdict():
    st = _load("_stats")
    assert st.kendall_tau([1, 2, 3, 4], [10, 20, 30, 40])[0] == pytest.approx(1.0)
    assert st.kendall_tau([1, 2, 3, 4], [40, 30, 20, 10])[0] == pytest.approx(-1.0)
    assert st.kendall_tau([1, 2, 3, 4], [10, 30, 20, 40])[0] == pytest.approx(4 / 6)
    assert all(math.isnan(x) for x in st.kendall_tau([1.0], [2.0]))
    errs, noise = st.summarise([0.06, 0.07]), st.summarise([0.05, 0.05])
    assert "target <= 1.5x: met" in st.within_noise(errs, noise)
    assert "target <= 1.5x: missed" in st.within_noise(st.summarise([0.2]), noise)
    assert st.within_noise(errs, None) == "noise floor not measured in that run"
    line = st.describe("step", errs, noise, (0.5, 0.2))
    for part in ("mean 6.5 %", "median 6.5 %", "p95", "max 7.0 %", "noise floor", "Kendall's tau 0.50"):
        assert part in line, line


@pytest.mark.parametrize(
    "bad",
    [([1.0, 2.0], [1.0]), ([1.0], [0.0]), ([], []), ([float("nan")], [1.0])],
)
def test_bad_input_is_one_sentence(bad):
    st = _load("_stats")
    with pytest.raises(ValueError):
        st.error_stats(*bad)


def test_the_history_reproduces_the_figures_its_benchmarks_printed():
    sa = _load("summarise_accuracy")
    blocks = {b.claim: b for b in sa.blocks((ROOT / "docs" / "benchmarks-history.md").read_text())}
    loo = blocks["simulated step (and epoch) time, small_cnn on digits, leave one out, 8 configurations"]
    assert sa.summarise(loo.errors)["median"] == pytest.approx(0.022, abs=0.0005)  # printed: 2.2 %
    assert sa.summarise(loo.noise)["median"] == pytest.approx(0.089, abs=0.0005)  # printed: 8.9 %
    gpu = blocks["epoch time of the run, AGS and LBT, fp16 and bf16, ResNet-50 and ResNet-18"]
    assert len(gpu.errors) == 24
    assert sa.summarise(gpu.errors)["median"] == pytest.approx(0.034, abs=0.001)  # printed: 3.4 %
    acc = blocks["step time with accumulation, small_cnn on digits, B = 512, N 1-2 x k 1-4"]
    assert sa.summarise(acc.errors)["median"] == pytest.approx(0.102, abs=0.001)  # printed: 10.2 %


def test_every_link_of_the_benchmarks_page_into_its_history_resolves():
    sa = _load("summarise_accuracy")
    summary = (ROOT / "docs" / "benchmarks.md").read_text()
    assert "benchmarks-history.md#" in summary
    assert sa.check_links(summary, (ROOT / "docs" / "benchmarks-history.md").read_text()) == []
    assert sa.check_links("[x](benchmarks-history.md#no-such-heading)", "## A heading\n") == ["no-such-heading"]
    # the slug is MkDocs' default (Python-Markdown's toc): code spans and punctuation dropped
    assert sa.slug("Dask vs the local launcher (`bench/cluster_overhead.py`)") == (
        "dask-vs-the-local-launcher-benchcluster_overheadpy"
    )


def test_the_prediction_benchmarks_print_the_statistics():
    rows = [
        {"dataset": "digits", "method": "lbt", "n_workers": 1, "global_batch": 128, "repeat": r, "middle": False,
         "predicted_epoch_s": p, "measured_epoch_s": m}
        for r, p, m in ((1, 1.0, 1.1), (2, 1.0, 1.2))
    ] + [
        {"dataset": "digits", "method": "lbt", "n_workers": 2, "global_batch": 512, "repeat": r, "middle": False,
         "predicted_epoch_s": 0.5, "measured_epoch_s": m}
        for r, m in ((1, 0.5), (2, 0.55))
    ]  # fmt: skip
    lines = _load("run_prediction").stat_lines(rows)
    assert len(lines) == 2 and all("noise floor (same configuration twice, n 2)" in x for x in lines), lines
    assert "Kendall's tau 1.00" in lines[0]

    mem = _load("memory_bound").stat_lines(
        [{"tula": {"model_bound_no_safety": 607, "max_local_batch": 547}, "truth": {"max_local_batch": 610}}]
    )
    assert "median 0.5 %" in mem[0] and "median 10.3 %" in mem[1]

    eps = [{"config": (32, 1), "predicted_s": 1.0, "measured_s": m} for m in (1.0, 1.1)]
    pwt = _load("plan_while_training").stat_lines(
        [{"data": "digits", "model": "mlp", "rate_mbit": 100.0, "epochs": eps}]
    )
    assert "n 2" in pwt[0] and "noise floor (same configuration twice, n 1) mean 9.1 %" in pwt[0], pwt

    s = _load("_stats")
    res = {
        "model": "small_cnn",
        "stats": {
            "noise_t_step": s.summarise([0.05]),
            "noise_mem": s.summarise([0.001]),
            "t_step_partial": s.summarise([0.06]),
            "t_step_full": s.summarise([0.1]),
            "mem_partial": s.summarise([0.001]),
            "mem_probe_only": s.summarise([0.003]),
            "tau_partial": (1.0, 0.1),
            "tau_full": (0.5, 0.3),
        },
    }
    lines = _load("perfmodel_accuracy").stat_lines(res)
    assert "target <= 1.5x: met" in lines[0] and "target <= 1.5x: missed" in lines[1]


def test_the_summary_script_runs_on_the_committed_history():
    r = subprocess.run(
        [sys.executable, str(BENCH / "summarise_accuracy.py"), "--check-links"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Kendall's tau" in r.stdout and "noise floor not measured in that run" in r.stdout
    assert r.stdout.rstrip().endswith("every link of docs/benchmarks.md into the history resolves")


def test_the_output_quoted_on_the_benchmarks_page_is_the_scripts_output_today():
    """docs/benchmarks.md quotes bench/summarise_accuracy.py's output: a rerun that changes the history's
    tables must update the summary page too (run the script and paste its output, and the table's rows)."""
    r = subprocess.run(
        [sys.executable, str(BENCH / "summarise_accuracy.py")], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert r.returncode == 0, r.stderr[-2000:]
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    quoted = page.split("```text\n", 1)[1].split("\n```", 1)[0]
    assert quoted == r.stdout.rstrip("\n")
