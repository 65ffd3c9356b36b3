"""AGS in your own DDP training loop.

    torchrun --nproc-per-node 2 examples/own_loop.py src/tula/examples/digits.yaml --batch 256 --epochs 3
    python examples/own_loop.py src/tula/examples/digits.yaml --batch 256 --epochs 3   # one process

``tula.AGS`` wraps any ``torch.optim.Optimizer``.  What it needs from the loop:

1. every step, as with any optimiser: ``zero_grad()``, the forward and backward of the large
   batch through the DDP model (its gradients are synchronised), then ``step()`` -- AGS
   gates and scales the gradients there, on the device, without a host sync;
2. every ``update_every`` steps (once per epoch is Tula's default), between the backward and
   ``step()``: :meth:`tula.AGS.measure_factors` with a closure that returns the loss of this
   rank's share of a small batch through the *bare* model (not the DDP wrapper), e.g. the
   first ``b_small / world_size`` samples of its local batch.  AGS takes that gradient,
   averages it over the ranks and compares it with the large-batch gradient to set its
   factors; BatchNorm statistics are put back.

The model, the data and the hyper-parameters come from a Tula spec here only so that this loop
and ``tula train --method ags`` train the same job: same seed, same data order
(:func:`tula.engine.data.epoch_order`), same optimiser -- and end with the same parameters
(``tests/test_own_loop.py`` checks it).  In your code they are your own.
"""

from __future__ import annotations

import argparse
import gc
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from tula import AGS
from tula.core.schedules import steps_per_epoch
from tula.core.spec import load_spec
from tula.engine.data import epoch_order
from tula.engine.workloads import build_loss, build_model, build_optimizer, load_dataset


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("spec", help="a Tula job spec (model, data, optimizer, train.ags)")
    ap.add_argument("--batch", type=int, required=True, help="global batch B")
    ap.add_argument("--epochs", type=int, default=None, help="default: the spec's")
    ap.add_argument("--out", default=None, help="save the trained parameters here (rank 0)")
    args = ap.parse_args()

    if "RANK" in os.environ:  # torchrun's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
        dist.init_process_group("gloo")
    else:  # plain `python examples/own_loop.py ...`: a world of this one process
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = load_spec(args.spec)
    epochs = args.epochs or spec.epochs

    # --- the job: in your code, your own model, data, loss and optimiser
    torch.manual_seed(spec.seed)
    data = load_dataset(spec.data, spec.seed)
    model = build_model(spec.model)
    ddp = DDP(model, gradient_as_bucket_view=True)
    loss_fn = build_loss(spec.train.loss)
    big_b, local_b = args.batch, args.batch // world
    n_steps = steps_per_epoch(data.train_size, big_b)

    # --- AGS around the optimiser
    a = spec.train.ags
    small_local = max(1, a.b_small // world)  # this rank's share of the small batch
    optimizer = AGS(
        build_optimizer(model, spec),
        b_large=big_b,
        b_small=small_local * world,
        delta=a.delta,
        s_min=a.s_min,
        granularity=a.granularity,
    )
    update_every = a.update_every or n_steps

    # --- the loop
    for epoch in range(epochs):
        model.train()
        order = epoch_order(spec.seed, epoch, data.train_size)
        loss_sum = 0.0
        for i in range(n_steps):
            start = i * big_b + rank * local_b
            x, y = data.take(order[start : start + local_b])  # this rank's slice of global batch i
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(x), y)
            loss.backward()
            if (epoch * n_steps + i) % update_every == 0:  # AGS's factors from a small batch
                small = (x[:small_local], y[:small_local])  # this rank's share of the small batch
                optimizer.measure_factors(lambda: loss_fn(model(small[0]), small[1]), model)  # noqa: B023 (called now)
            optimizer.step()
            loss_sum += loss.item()
        if rank == 0:
            print(
                f"epoch {epoch + 1}: train loss {loss_sum / n_steps:.4f} (rank 0), {optimizer.scaled_steps} steps scaled"
            )
    if rank == 0 and args.out:
        torch.save(model.state_dict(), args.out)
    # tear down in order: DDP's reducer holds the group, so it goes while the group is alive
    # (freed at exit after it, gloo's threads can abort the process: "terminate called without
    # an active exception"), and no rank leaves while another still talks
    del ddp, optimizer
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
