"""The service under load: re-plans answered from a stored model, and a plan from the store
against profiling again.

Starts a real `tula serve` (uvicorn, SQLite store) on a free loopback port, runs the digits
example through it once (profile, fit, plan; no training) so that a fitted model is stored,
then

1. sends ``--requests`` re-plan requests (POST /v1/jobs/{id}/replan, objectives and cluster
   sizes varying) from ``--clients`` concurrent client processes, and prints the throughput, the
   p50 / p99 latency (target: p99 < 100 ms) and the service process's CPU time per request.
   The clients share the machine with the service, so they are kept light: each is a process
   of its own (no GIL shared among clients) holding one keep-alive connection of the standard
   library's ``http.client`` (``--client httpx`` uses httpx, which costs the clients several
   times more CPU per request);
2. times POST /v1/plans for the same spec (answered from the stored model) against profiling
   it again (`tula plan SPEC`: profile, fit, plan), and prints the ratio.

    python bench/service_load.py [--requests 1000] [--clients 16]
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from service_helpers import Service, wait_for  # noqa: E402

SPEC = yaml.safe_load((ROOT / "src" / "tula" / "examples" / "digits.yaml").read_text())


def _warm(_: int) -> None:
    import httpx  # noqa: F401


def _client(url: str, job_id: str, bodies: list[dict], n: int, k: int) -> tuple[list[float], list[str]]:
    """One httpx client: ``n`` re-plans, one after another; their latencies and any errors."""
    latencies, errors = [], []
    with httpx.Client(base_url=url, timeout=60) as h:
        for i in range(n):
            t = time.perf_counter()
            r = h.post(f"/v1/jobs/{job_id}/replan", json=bodies[(k + i) % len(bodies)])
            latencies.append(time.perf_counter() - t)
            if r.status_code != 200:
                errors.append(f"{r.status_code}: {r.text[:120]}")
    return latencies, errors


def _light_client(url: str, job_id: str, bodies: list[dict], n: int, k: int) -> tuple[list[float], list[str]]:
    """One standard-library client on one keep-alive connection: ``n`` re-plans, each answer
    read in full; their latencies and any errors."""
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "localhost", u.port, timeout=60)
    encoded = [json.dumps(b).encode() for b in bodies]
    latencies, errors = [], []
    try:
        for i in range(n):
            t = time.perf_counter()
            conn.request(
                "POST",
                f"/v1/jobs/{job_id}/replan",
                body=encoded[(k + i) % len(encoded)],
                headers={"Content-Type": "application/json"},
            )
            r = conn.getresponse()
            body = r.read()
            latencies.append(time.perf_counter() - t)
            if r.status != 200:
                errors.append(f"{r.status}: {body[:120]!r}")
    finally:
        conn.close()
    return latencies, errors


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument(
        "--client",
        choices=["http.client", "httpx"],
        default="http.client",
        help="the clients' HTTP library (default: the standard library's, the lighter)",
    )
    args = ap.parse_args()
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M')} on {platform.node()} ({platform.machine()}, {os.cpu_count()} cores), "
        f"{args.requests} re-plans from {args.clients} clients"
    )
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        svc = Service(home).start()
        try:
            c = svc.client()
            t0 = time.perf_counter()
            job_id = c.post("/v1/jobs", json={"spec": SPEC, "train": False}).json()["id"]
            job = wait_for(c, job_id, timeout_s=900)
            measured_s = time.perf_counter() - t0
            assert job["state"] == "done", job
            print(f"stored model: job {job_id} profiled, fitted and planned in {measured_s:.1f} s through the service")

            bodies = [
                {"objective": o, "cluster_sizes": cs}
                for o in ("knee", "time", "cost")
                for cs in ([1, 2], [1, 2, 4, 8], [1, 2, 4, 8, 16, 32, 64])
            ]
            per_client = [
                args.requests // args.clients + (i < args.requests % args.clients) for i in range(args.clients)
            ]
            # each client its own process (its own interpreter: no client shares a GIL with another)
            ctx = mp.get_context("spawn")
            with ctx.Pool(args.clients) as pool:
                pool.map(_warm, range(args.clients))  # the processes are up and have imported httpx
                client = _light_client if args.client == "http.client" else _client
                cpu0, t0 = _cpu_s(svc.proc.pid), time.perf_counter()
                results = pool.starmap(client, [(svc.url, job_id, bodies, n, k) for k, n in enumerate(per_client)])
                wall, server_cpu_s = time.perf_counter() - t0, _cpu_s(svc.proc.pid) - cpu0
            latencies = [x for lat_, _ in results for x in lat_]
            errors = [e for _, errs in results for e in errs]
            lat = sorted(latencies)
            p50, p99 = lat[len(lat) // 2], lat[min(len(lat) - 1, int(0.99 * len(lat)))]
            print(
                f"re-plan: {len(lat)} requests in {wall:.2f} s = {len(lat) / wall:.0f} req/s; latency p50 "
                f"{p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, max {lat[-1] * 1e3:.1f} ms "
                f"({'meets' if p99 < 0.1 else 'MISSES'} the p99 < 100 ms target); {len(errors)} error(s); "
                f"the service's CPU {server_cpu_s / len(lat) * 1e3:.2f} ms per request ({args.client} clients)"
            )
            if errors:
                print("  first error:", errors[0])

            # a plan for the same spec from the store vs profiling it again
            times = []
            for _ in range(5):
                t = time.perf_counter()
                r = c.post("/v1/plans", json={"spec": SPEC})
                times.append(time.perf_counter() - t)
                assert r.status_code == 200 and r.json()["reused_models_from"] == job_id, r.text
            from_store = statistics.median(times)
        finally:
            svc.stop()
        spec_path = Path(tmp) / "digits.yaml"
        spec_path.write_text(yaml.safe_dump(SPEC))
        t = time.perf_counter()
        r = subprocess.run(
            [
                str(Path(sys.executable).parent / "tula"),
                "plan",
                str(spec_path),
                "--out",
                str(Path(tmp) / "again" / "plan.json"),
            ],
            capture_output=True,
            text=True,
        )
        again_s = time.perf_counter() - t
        assert r.returncode == 0, r.stderr
        print(
            f"POST /v1/plans from the stored model: median {from_store * 1e3:.1f} ms (5 calls; the first, which "
            f"reads the hardware facts once, {times[0] * 1e3:.0f} ms); profiling again "
            f"(tula plan SPEC: profile, fit, plan): {again_s:.1f} s; ratio {again_s / from_store:.0f}x"
        )


if __name__ == "__main__":
    main()
