"""What a newcomer runs, as a newcomer runs it: a script of the Python API without the
``if __name__ == "__main__":`` guard, as ``python script.py`` and as ``python - < script.py``,
whose model class is defined in the script itself; and the examples, run by their paths."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]

#: a script as a newcomer writes it: top-level code, no main guard, its own model class and data
SCRIPT = """
import torch
from torch import nn

import tula

print("the script runs", flush=True)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3))

    def forward(self, x):
        return self.body(x)


def make_data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 1, 4, 4, generator=g)
    y = (x.flatten(1).sum(1) > 0).long() + (x[:, 0, 0, 0] > 1).long()
    full = torch.utils.data.TensorDataset(x, y)
    return torch.utils.data.Subset(full, range(192)), torch.utils.data.Subset(full, range(192, 256))


job = tula.Job(
    {"name": "no-guard", "search": {"cluster_sizes": [N], "min_batch": 64, "max_batch": 64},
     "profile": {"warmup_steps": 1, "timed_steps": 3, "threads_per_worker": 1, "min_timed_s": 0}},
    model=Net, data=make_data, out="runs/no-guard", cluster=CLUSTER,
)
profile = job.profile()
print("trials", [(t.n_workers, t.global_batch, t.status) for t in profile.trials])
"""


@pytest.mark.parametrize(
    "how, cluster, n", [("file", "local", 2), ("stdin", "local", 2), ("file", "dask", 1)], ids=["file", "stdin", "dask"]
)
def test_a_script_without_the_main_guard_profiles_with_its_own_model_class(how, cluster, n, tmp_path):
    """The ranks -- local processes, or the workers of the Dask LocalCluster Tula starts -- do
    not run the script again (it prints its first line once: they inherit its stdout), and its
    model class, defined in ``__main__``, reaches them by value."""
    script = SCRIPT.replace("CLUSTER", repr(cluster)).replace("[N]", f"[{n}]")
    (tmp_path / "script.py").write_text(script)
    cmd, stdin = ([sys.executable, "script.py"], None) if how == "file" else ([sys.executable, "-"], script)
    r = subprocess.run(cmd, input=stdin, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("the script runs") == 1, r.stdout
    assert f"trials [({n}, 64, 'ok')]" in r.stdout, r.stdout
    assert json.loads((tmp_path / "runs" / "no-guard" / "profile.json").read_text())["trials"][0]["status"] == "ok"


def test_examples_python_api_runs_from_another_directory(tmp_path):
    """``python /path/to/examples/python_api.py --quick`` (one epoch on one worker) from a
    directory that is not the checkout: the whole pipeline, its run directory under ./runs."""
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "python_api.py"), "--quick"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "choice: " in r.stdout and "final test top-1:" in r.stdout, r.stdout
    (run,) = (tmp_path / "runs").iterdir()
    train = json.loads((run / "train" / "train.json").read_text())
    assert run.name.startswith("python-api-") and len(train["history"]) == 1


def test_examples_own_loop_runs_with_plain_python_from_the_checkout():
    """``python examples/own_loop.py src/tula/examples/digits.yaml ...`` from the checkout, without
    torchrun: a world of one process (under torchrun: tests/test_own_loop.py)."""
    r = subprocess.run([sys.executable, "examples/own_loop.py", "src/tula/examples/digits.yaml", "--batch", "256",
                        "--epochs", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "epoch 1: train loss" in r.stdout and "steps scaled" in r.stdout, r.stdout
