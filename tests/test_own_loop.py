"""``tula.AGS`` in a hand-written DDP loop: ``examples/own_loop.py`` under a real ``torchrun
--nproc-per-node 2`` (CPU, gloo) ends with exactly the parameters of ``tula train --method
ags`` on the same job."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import free_port, run_python

from tula.engine.checkpoint import load_checkpoint

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_own_loop_under_torchrun_ends_with_the_parameters_of_tula_train(reference_run, tmp_path):
    """``tula train --method ags --workers 2 --batch 64`` of the job is the session's reference
    run: 3 epochs, the factors measured twice per epoch (update_every 11 of 22 steps), so that
    several updates and scaled steps are compared."""
    d = reference_run.spec_dict()
    assert d["epochs"] == 3 and d["train"]["ags"] == {"b_small": 16, "update_every": 11}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(d))
    r = subprocess.run(
        [str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", str(free_port()),
         str(ROOT / "examples" / "own_loop.py"), str(spec), "--batch", "64", "--out", str(tmp_path / "own.pt")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "epoch 3: train loss" in r.stdout
    t = reference_run.record("train.json")
    assert (t["method"], t["n_workers"], t["global_batch"], len(t["history"])) == ("ags", 2, 64, 3)
    own = torch.load(tmp_path / "own.pt", weights_only=True)
    theirs = load_checkpoint(reference_run.dir, map_location="cpu")["model"]
    assert own.keys() == theirs.keys()
    for k in own:
        assert torch.equal(own[k], theirs[k]), f"{k} differs"
    # AGS did something in both: factors were measured and steps scaled
    scaled = int(r.stdout.split("epoch 3: train loss")[1].split("(rank 0), ")[1].split(" steps scaled")[0])
    assert scaled > 0


def test_tula_AGS_is_the_optimiser_of_tula_optim_and_import_tula_loads_no_torch():
    code = (
        "import sys, tula; assert 'torch' not in sys.modules, 'import tula loaded torch'; "
        "from tula.optim import AGS; assert tula.AGS is AGS; print('ok')"
    )
    r = run_python(code)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
