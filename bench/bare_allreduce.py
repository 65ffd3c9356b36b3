"""A bare gloo ``all_reduce`` of 4.5 MB (the mlp's gradients) at N = 2, 3, 4 between emulated
hosts with shaped links, outside DDP and outside Tula, with the ranks free to move between
cores and pinned one core per host: does gloo's ring follow the ring model's byte count
(N = 3 and 4 at 1.33x and 1.50x the N = 2 time) on these links?  A check behind
``bench/network_model.py`` (docs/benchmarks-history.md).  Needs root.

With ``--busy-ms 0,20`` each step first computes (a busy loop) for the mlp's step compute:
ranks that share a core (N = 3, 4 on 2 cores) then contend, and the all-reduce slows by more
than the compute -- the contention that ``bench/network_model.py`` separates from the
network model's error.

Run:  sudo .venv/bin/python bench/bare_allreduce.py [--rate 100] [--repeats 10]
        [--layouts one,buckets] [--pin free,pinned] [--busy-ms 0,20]
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# The mlp's gradients as DDP buckets them (a first bucket of at least 1 MB from the last
# layers: fc3 and the 1024 x 1024 fc2; then fc1), all-reduced asynchronously one after the
# other as DDP's backward pass hands them on, versus one tensor of the same size.
LAYOUTS = {"one": [1_125_000], "buckets": [1_059_850, 66_560]}


def rank_main(rank: int, world: int, master: str, out: str, repeats: int, elements: list[int], busy_s: float) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{master}:29511",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    tensors = [torch.ones(n) for n in elements]

    def step() -> None:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < busy_s:  # a stand-in for the step's compute, on this rank's core
            pass
        for w in [dist.all_reduce(t, async_op=True) for t in tensors]:
            w.wait()

    for _ in range(3):
        step()
    times = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        times.sort()
        Path(out).write_text(f"{times[len(times) // 2]:.6f}")
    dist.destroy_process_group()


def measure(
    h, sizes: list[int], elements: list[int], pin: bool, repeats: int, tmp: Path, busy_s: float = 0.0
) -> dict[int, float]:
    """Rank 0's median seconds of one step -- ``busy_s`` of busy compute, then one all-reduce
    of tensors of ``elements`` float32 values (concurrently, as DDP's buckets) -- after a
    barrier, between hosts 1..n of ``h`` for each n in ``sizes``; ``pin``: rank r on core
    r mod cores, as ``EmulatedHosts(pin_cores=True)`` pins host r + 1's worker."""
    cores = os.cpu_count() or 1
    result = {}
    for n in sizes:
        out = tmp / f"bare-{n}-{pin}-{busy_s}-{'-'.join(map(str, elements))}"
        procs = [
            h.popen(
                r + 1,
                [
                    *(["taskset", "-c", str(r % cores)] if pin else []),
                    sys.executable,
                    __file__,
                    "--rank",
                    str(r),
                    str(n),
                    h.address(1),
                    str(out),
                    str(repeats),
                    ",".join(map(str, elements)),
                    str(busy_s),
                ],
                log=f"bare-rank{r}.log",
                env={"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"},
            )
            for r in range(n)
        ]
        for p in procs:
            p.wait(timeout=600)
        if not out.exists():
            raise SystemExit(f"the bare all-reduce at N={n} failed:\n{h.log_tail()}")
        result[n] = float(out.read_text())
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=100.0, help="link rate in Mbit/s")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument(
        "--layouts",
        default="one",
        help="comma list of: one (one 4.5 MB tensor), buckets "
        "(the mlp's two DDP buckets, 4.24 MB and 0.27 MB, all-reduced concurrently)",
    )
    ap.add_argument("--pin", default="free,pinned", help="comma list of: free, pinned")
    ap.add_argument(
        "--busy-ms",
        default="0",
        help="comma list of busy compute before each all-reduce, in ms "
        "(20: the mlp's step compute; ranks that share a core then contend)",
    )
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    from emulated_hosts import EmulatedHosts, why_unavailable

    why = why_unavailable()
    if why:
        raise SystemExit(f"emulated hosts cannot be made here: {why}")
    print(
        f"date {time.strftime('%Y-%m-%d %H:%M %Z')}; 4 emulated hosts, links {args.rate:g} Mbit/s; "
        f"median of {args.repeats} all_reduces of 4.5 MB (rank 0's)"
    )
    with EmulatedHosts(4, rate_mbit=args.rate, start_dask=False) as h, tempfile.TemporaryDirectory() as tmp:
        for layout, pin, busy_ms in [
            (lay, p == "pinned", float(b))
            for lay in args.layouts.split(",")
            for p in args.pin.split(",")
            for b in args.busy_ms.split(",")
        ]:
            times = measure(h, [2, 3, 4], LAYOUTS[layout], pin, args.repeats, Path(tmp), busy_ms / 1e3)
            base = times[2]
            for n, t in times.items():
                print(
                    f"{layout:8s} busy {busy_ms:4.0f} ms N={n} {'pinned' if pin else 'free  '}: {1e3 * t:7.1f} ms, {t / base:.2f}x N=2 "
                    f"(the ring's bytes per link: {(n - 1) / n / 0.5:.2f}x)",
                    flush=True,
                )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        rank_main(
            int(sys.argv[2]),
            int(sys.argv[3]),
            sys.argv[4],
            sys.argv[5],
            int(sys.argv[6]),
            [int(x) for x in sys.argv[7].split(",")],
            float(sys.argv[8]),
        )
    else:
        main()
