"""A bare gloo ``all_reduce`` of 4.5 MB (the mlp's gradients) at N = 2, 3, 4 between emulated
hosts with shaped links, outside DDP and outside Tula, with the ranks free to move between
cores and pinned one core per host: does gloo's ring follow the ring model's byte count
(N = 3 and 4 at 1.33x and 1.50x the N = 2 time) on these links?  A check behind
``bench/network_model.py`` (docs/benchmarks.md).  Needs root.

Run:  sudo .venv/bin/python bench/bare_allreduce.py [--rate 100] [--repeats 10]
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rank_main(rank: int, world: int, master: str, out: str, repeats: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{master}:29511", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    t = torch.ones(1_125_000)  # 4.5 MB of float32
    for _ in range(3):
        dist.all_reduce(t)
    times = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - t0)
    if rank == 0:
        times.sort()
        Path(out).write_text(f"{times[len(times) // 2]:.6f}")
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=100.0, help="link rate in Mbit/s")
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    from emulated_hosts import EmulatedHosts, why_unavailable

    why = why_unavailable()
    if why:
        raise SystemExit(f"emulated hosts cannot be made here: {why}")
    print(f"date {time.strftime('%Y-%m-%d %H:%M %Z')}; 4 emulated hosts, links {args.rate:g} Mbit/s; "
          f"median of {args.repeats} all_reduces of 4.5 MB (rank 0's)")
    with EmulatedHosts(4, rate_mbit=args.rate, start_dask=False) as h, tempfile.TemporaryDirectory() as tmp:
        for pin in (False, True):
            base = None
            for n in (2, 3, 4):
                out = Path(tmp) / f"{n}-{pin}"
                procs = [h.popen(r + 1, [*(["taskset", "-c", str(r % 2)] if pin else []), sys.executable, __file__,
                                         "--rank", str(r), str(n), h.address(1), str(out), str(args.repeats)],
                                 log=f"rank{r}.log", env={"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"})
                         for r in range(n)]
                for p in procs:
                    p.wait(timeout=600)
                if not out.exists():
                    raise SystemExit(f"the N={n} world failed:\n{h.log_tail()}")
                t = float(out.read_text())
                base = base or t
                print(f"N={n} {'pinned' if pin else 'free  '}: {1e3 * t:7.1f} ms, {t / base:.2f}x N=2 "
                      f"(the ring's bytes per link: {(n - 1) / n / 0.5:.2f}x)", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        rank_main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6]))
    else:
        main()
