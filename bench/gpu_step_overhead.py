"""Where Tula's training step loses time against the plain loop (issue #25), in one process on
one GPU, interleaved: the plain loop (batch on the device), the same loop with the model wrapped
in DDP on a 1-rank world (as DDP comes, and "quiet": no collective -- a comm hook that returns
the bucket -- and no buffer broadcast), and Tula's own profiling step (``tula.engine.profile._Worker``: the
data path, DDP, the precision).  Per variant, the median step (to a ``synchronize``) and the
median time the host takes to queue the plain and DDP steps (before the ``synchronize``): a host
time close to the step means the step is bound by the host launching kernels, not by the GPU.

    PYTHONPATH=src python bench/gpu_step_overhead.py              # a GPU: ResNet-50/224
    PYTHONPATH=src python bench/gpu_step_overhead.py --dry-run    # the CPU: a tiny model
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from tula.core.spec import ModelSpec, spec_from_dict  # noqa: E402

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _bucket_as_is(state, bucket):  # a one-rank "all-reduce": the bucket is already the average
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def plain_variant(
    model_name: str, classes: int, shape: tuple, b: int, precision: str, device: torch.device, ddp: str = ""
):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from tula.engine.workloads import build_model

    torch.manual_seed(0)
    model: torch.nn.Module = build_model(ModelSpec(name=model_name, kwargs={"num_classes": classes})).to(device)
    if ddp:
        quiet = ddp == "quiet"  # no collective, no buffer broadcast: what is left is DDP's bookkeeping
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=True,
                    broadcast_buffers=not quiet)  # fmt: skip
        if quiet:
            model.register_comm_hook(None, _bucket_as_is)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    dtype = _DTYPES.get(precision)
    x = torch.randn(b, *shape, device=device)
    y = torch.randint(0, classes, (b,), device=device)

    def step() -> tuple[float, float]:
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext():
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t1 = time.perf_counter()
        _sync(device)
        return time.perf_counter() - t0, t1 - t0

    return step


def tula_variant(model_name: str, classes: int, shape: tuple, b: int, precision: str, device: torch.device):
    from tula.engine.launch.base import WorkerContext
    from tula.engine.profile import _Worker

    spec = spec_from_dict(
        {
            "name": "overhead",
            "model": {"name": model_name, "kwargs": {"num_classes": classes}},
            "data": {
                "name": "synthetic",
                "sample_shape": list(shape),
                "num_classes": classes,
                "num_samples": int(b / 0.8) + 8,
            },  # fmt: skip
            "profile": {"device": device.type},
            "train": {"precision": precision},
        }
    )
    ctx = WorkerContext(rank=0, world_size=1, device=device, backend=dist.get_backend())
    w = _Worker(ctx, spec)
    w.load_batch(b)

    def step() -> tuple[float, float]:
        t = w.timed(True)
        return t, float("nan")

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--batches", type=int, nargs="+", default=[32, 64, 128])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.dry_run:
        device, model, classes, shape, batches = torch.device("cpu"), "shufflenet_v2_x0_5", 10, (3, 16, 16), [4, 8]
        args.precisions = ["fp32"]
    else:
        device, model, classes, shape, batches = torch.device("cuda", 0), "resnet50", 1000, (3, 224, 224), args.batches
        torch.cuda.set_device(device)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    print(f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}, torch {torch.__version__}")
    print("| precision | b | plain ms | plain host ms | ddp ms | ddp host ms | quiet ddp ms | quiet host ms | tula ms "
          "| ddp / plain | quiet / plain | tula / plain |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for precision in args.precisions:
        for b in batches:
            steps = {
                "plain": plain_variant(model, classes, shape, b, precision, device, ddp=""),
                "ddp": plain_variant(model, classes, shape, b, precision, device, ddp="default"),
                "quiet": plain_variant(model, classes, shape, b, precision, device, ddp="quiet"),
                "tula": tula_variant(model, classes, shape, b, precision, device),
            }
            for s in steps.values():  # warm-up
                for _ in range(5):
                    s()
            walls: dict[str, list[float]] = {k: [] for k in steps}
            hosts: dict[str, list[float]] = {k: [] for k in steps}
            for _ in range(args.rounds):  # interleaved rounds
                for k, s in steps.items():
                    for _ in range(args.steps):
                        w, h = s()
                        walls[k].append(w)
                        hosts[k].append(h)
            med = {k: statistics.median(v) for k, v in walls.items()}
            host = {k: statistics.median(v) for k, v in hosts.items()}
            print(
                f"| {precision} | {b} | {1e3 * med['plain']:.1f} | {1e3 * host['plain']:.1f} | {1e3 * med['ddp']:.1f} | "
                f"{1e3 * host['ddp']:.1f} | {1e3 * med['quiet']:.1f} | {1e3 * host['quiet']:.1f} | "
                f"{1e3 * med['tula']:.1f} | {med['ddp'] / med['plain']:.2f}x | {med['quiet'] / med['plain']:.2f}x | "
                f"{med['tula'] / med['plain']:.2f}x |",
                flush=True,
            )
            del steps
            if device.type == "cuda":
                torch.cuda.empty_cache()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
