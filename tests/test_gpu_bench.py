"""``bench/gpu.py``, the GPU check (#25 item 5), on the CPU: its doc section replaces the old one
in place (or is appended), and its dry run -- ShuffleNetV2 x0.5 on 3x16x16, fp32, bf16 and fp16 (on
torch's CPU kernels), Tula's real profile and AGS training through real ranks, and the transformer
(#44: a one-block tiny_gpt on token ids, its plain loop with and without flash attention forced,
Tula's profile over sequence lengths, the fitted models at held-out (b, L)) -- runs every path but
the CUDA-only ones and writes the section."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "bench" / "gpu.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_the_section_replaces_the_old_one_in_place_or_is_appended():
    gpu = _bench()
    new = f"{gpu.SECTION}\n\nnew figures\n"
    doc = f"# Benchmarks\n\n## Before\n\na\n\n{gpu.SECTION}\n\nold figures\n\n## After\n\nb\n"
    out = gpu.replace_section(doc, new)
    assert out == f"# Benchmarks\n\n## Before\n\na\n\n{new}\n## After\n\nb\n"
    assert gpu.replace_section(out, new) == out  # again: the same text
    last = gpu.replace_section("# Benchmarks\n\n## Before\n\na\n", new)
    assert last == f"# Benchmarks\n\n## Before\n\na\n\n{new}"
    assert gpu.replace_section(last, new) == last  # the section at the end is replaced, not repeated
    # the doc as committed has the section once
    assert (ROOT / "docs" / "benchmarks-history.md").read_text().count(gpu.SECTION) == 1


@pytest.mark.slow
def test_the_dry_run_exercises_every_cpu_path_and_writes_the_section(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n")
    t0 = time.perf_counter()
    r = subprocess.run(
        # fp32 and fp16 (bf16's profile is tested in test_precision): the dry run's time is the suite's
        [sys.executable, str(ROOT / "bench" / "gpu.py"), "--dry-run", "--precisions", "fp32", "fp16", "--doc", str(doc)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    wall_s = time.perf_counter() - t0
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n") and text.count("## GPU check") == 1
    rows = [line for line in text.splitlines() if line.startswith("| fp") or line.startswith("| bf")]
    assert [row.split("|")[1].strip() for row in rows] == ["fp32", "fp32", "fp16", "fp16"]
    for row in rows:  # the plain loop, Tula's measured step and the prediction are all there
        plain, tula, predicted = (row.split("|")[i].strip() for i in (3, 4, 6))
        assert float(plain) > 0 and float(tula) > 0 and float(predicted) > 0, row
    assert "Largest local batch predicted" in text and "at 1.05x" in text
    # the transformer in fp32 (fp16 is the images' part): each batch at L 16, the smallest at the other lengths
    gpt = [
        [cell.strip() for cell in line.split("|")[1:-1]] for line in text.splitlines() if line.startswith("| tiny_gpt")
    ]
    assert [(row[1], row[2], row[3]) for row in gpt] == [("fp32", "2", "16"), ("fp32", "4", "16"),
                                                        ("fp32", "2", "8"), ("fp32", "2", "32")], gpt  # fmt: skip
    for row in gpt:  # the plain loop, flash attention forced (the CPU's kernel), the prediction
        plain, flash, predicted = (float(row[i]) for i in (5, 6, 9))
        assert plain > 0 and flash > 0 and predicted > 0, row
    assert [row[4] for row in gpt] == ["yes", "yes", "no", "no"]  # the other lengths' trials are at b = 4
    assert all(float(row[7]) > 0 for row in gpt[:2]) and all(row[7] == "-" for row in gpt[2:])  # Tula measured
    assert "tiny_gpt fp32: predicted vs plain step" in text
    assert "AGS in fp16, 2 epochs" in text and "AGS in fp32, 2 epochs" in text and "dry run on the CPU" in text
    assert "budget ran out" not in text and "(budget)" not in text, text  # nothing left out for lack of time
    print(f"dry run: {wall_s:.0f} s")
