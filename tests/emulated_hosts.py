"""Emulated hosts: Linux network namespaces on a bridge, each with its own network stack,
address and shaped link, a Dask scheduler on a head host and Dask workers on the others.

Used by the multi-host tests (``tests/test_multihost.py``) and by ``bench/network_model.py``::

    with EmulatedHosts(n_hosts=2, rate_mbit=100) as hosts:
        hosts.run(["tula", "train", "spec.yaml", "--cluster", hosts.scheduler_address])

Layout (``<id>`` is short and unique per instance; interface names stay within 15 characters)::

    root namespace:   bridge tb<id>  (no address: nothing in the root namespace is reachable)
                          |-- veth t<id>h0 -- namespace tula-<id>-h0  eth0 10.A.B.1   head: Dask scheduler,
                          |                                                           where commands run
                          |-- veth t<id>h1 -- namespace tula-<id>-h1  eth0 10.A.B.2   host 1: Dask worker(s)
                          ...

Each host's link is shaped to ``rate_mbit`` in both directions with an ``htb`` class: on the
namespace's ``eth0`` (what the host sends) and on the bridge side of its veth (what it
receives).  The head's link is not shaped (it carries only the scheduler's messages).  The
host name inside every namespace is this machine's, which here resolves to 127.0.0.1: the
trap a real multi-host world falls into when a rank trusts it.

Tear-down (:meth:`stop`, also on an exception inside the ``with`` block, and from an
``atexit`` hook) kills every process inside the namespaces (``ip netns pids``), deletes the
namespaces, the veths, the bridge and the processes' logs, and checks that none is left.  Namespaces left by a
killed earlier run (their owner pid is gone) are swept at start.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

PREFIX = "tula-"  # every namespace this helper makes starts with it
REQUIRE_ENV = "TULA_REQUIRE_NETNS"  # =1: a test that cannot make namespaces fails instead of skipping

#: Dask settings of the workers (what ``tula.engine.launch.clusters.WORKER_CONFIG`` sets for workers
#: Tula starts itself): not daemonic, no stack sampling
WORKER_ENV = {
    "DASK_DISTRIBUTED__WORKER__DAEMON": "False",
    "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
    "DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__GIL__ENABLED": "False",
    "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "0",
    "OMP_NUM_THREADS": "1",
}

#: Dask settings of the commands run on the head: a worker lock (a lease, tula.engine.launch.dask)
#: of a command killed with kill -9 expires after 6 s instead of Dask's 30 s.  The lease timeout is
#: the holder's setting (sent when the lock registers), not the scheduler's.
COMMAND_ENV = {"DASK_DISTRIBUTED__SCHEDULER__LOCKS__LEASE_TIMEOUT": "6s"}


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no ``ip``, no veth/bridge support)."""


def _ip(*args: str, check: bool = True, ns: str | None = None) -> subprocess.CompletedProcess:
    cmd = ["ip", *(("-n", ns) if ns else ()), *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=30)


def _tc(*args: str, ns: str | None = None, check: bool = True) -> None:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + ["tc", *args]
    subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=30)


def why_unavailable() -> str | None:
    """None when namespaces can be made here, else one sentence saying why not."""
    if os.name != "posix" or not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "making network namespaces needs root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the '{tool}' command (iproute2) is not installed"
    name = f"{PREFIX}probe-{os.getpid()}"
    try:
        _ip("netns", "add", name)
    except subprocess.CalledProcessError as err:
        return f"'ip netns add' failed: {err.stderr.strip()}"
    finally:
        _ip("netns", "del", name, check=False)
    return None


def _owner_alive(ns: str) -> bool:
    m = re.match(rf"{PREFIX}(\d+)x", ns)
    if not m:
        return True  # not ours to judge
    try:
        os.kill(int(m.group(1)), 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _kill_namespace_processes(ns: str) -> None:
    for _ in range(20):
        pids = [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split() if p.strip().isdigit()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def sweep_stale() -> list[str]:
    """Delete namespaces (and their bridge) left by an earlier run whose process is gone."""
    gone = []
    for ns in _namespaces():
        if ns.startswith(PREFIX) and not _owner_alive(ns):
            _kill_namespace_processes(ns)
            _ip("netns", "del", ns, check=False)
            gone.append(ns)
    for line in _ip("-o", "link", "show", "type", "bridge", check=False).stdout.splitlines():
        m = re.match(r"\d+: (tb\d+x\d+)[:@]", line)
        if m and not _owner_alive(f"{PREFIX}{m.group(1)[2:]}"):
            _ip("link", "del", m.group(1), check=False)
    return gone


class EmulatedHosts:
    """``n_hosts`` hosts (namespaces) plus a head namespace, on one bridge.

    Parameters
    ----------
    n_hosts : hosts that run Dask workers
    rate_mbit : each host's link rate in Mbit/s, both directions (None: not shaped)
    workers_per_host : Dask workers per host (each one rank of a world)
    start_dask : start the scheduler and the workers (False: only the network)
    worker_env : extra environment for the workers
    pin_cores : pin host k's workers to CPU core (k - 1) mod cores (``taskset``): the hosts
        still share this machine's cores, but a rank no longer migrates between them
        mid-collective, which here slowed gloo's ring at N >= 3 beyond the ring's byte count
        (docs/benchmarks.md, the network model)
    """

    def __init__(
        self,
        n_hosts: int = 2,
        rate_mbit: float | None = None,
        workers_per_host: int = 1,
        start_dask: bool = True,
        worker_env: dict[str, str] | None = None,
        python: str | None = None,
        pin_cores: bool = False,
        worker_niceness: int = 0,
        cluster_cpus: str | None = None,
    ):
        self.n_hosts = n_hosts
        self.rate_mbit = rate_mbit
        self.workers_per_host = workers_per_host
        self.start_dask = start_dask
        self.worker_env = dict(worker_env or {})
        self.python = python or sys.executable
        self.pin_cores = pin_cores
        self.worker_niceness = worker_niceness  # > 0: the workers yield the CPU to the head's processes
        # a CPU list (taskset -c): the scheduler and workers run there only, leaving the other
        # CPUs to the head's own processes, as separate machines would
        self.cluster_cpus = cluster_cpus
        if cluster_cpus and pin_cores:
            raise ValueError("pin_cores and cluster_cpus both place the workers: give one")
        self.id = f"{os.getpid()}x{random.randrange(100, 1000)}"  # the owner's pid first: see sweep_stale
        self.subnet = f"10.{random.randrange(100, 250)}.{random.randrange(0, 250)}"
        self.bridge = f"tb{self.id}"[:15]
        self.namespaces: list[str] = []
        self.procs: list[subprocess.Popen] = []
        self.worker_procs: dict[int, list[subprocess.Popen]] = {}
        self.logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"tula-hosts-{self.id}"
        self.scheduler_port = random.randrange(20000, 30000)
        self._stopped = True
        self._n_started = 0

    # ------------------------------------------------------------------ names and addresses
    def ns(self, host: int) -> str:
        """Namespace of host ``host`` (0 is the head)."""
        return f"{PREFIX}{self.id}-h{host}"

    def address(self, host: int) -> str:
        return f"{self.subnet}.{host + 1}"

    def veth(self, host: int) -> str:
        """The bridge side of host ``host``'s link (in the root namespace)."""
        return f"t{self.id}h{host}"[:15]

    @property
    def head(self) -> str:
        return self.ns(0)

    @property
    def hosts(self) -> list[int]:
        return list(range(1, self.n_hosts + 1))

    @property
    def scheduler_address(self) -> str:
        return f"tcp://{self.address(0)}:{self.scheduler_port}"

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> EmulatedHosts:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> EmulatedHosts:
        why = why_unavailable()
        if why:
            raise NetnsUnavailable(why)
        sweep_stale()
        self._stopped = False
        atexit.register(self.stop)
        try:
            self.logs.mkdir(parents=True, exist_ok=True)
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("link", "set", self.bridge, "up")
            for h in range(self.n_hosts + 1):
                self._add_host(h)
            if self.start_dask:
                self._start_scheduler()
                for h in self.hosts:
                    self.worker_procs[h] = [self.start_worker(h) for _ in range(self.workers_per_host)]
                self.wait_for_workers(self.n_hosts * self.workers_per_host)
        except BaseException:
            self.stop()
            raise
        return self

    def _add_host(self, h: int) -> None:
        ns, veth = self.ns(h), self.veth(h)
        _ip("netns", "add", ns)
        self.namespaces.append(ns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", veth, "master", self.bridge)
        _ip("link", "set", veth, "up")
        _ip("addr", "add", f"{self.address(h)}/24", "dev", "eth0", ns=ns)
        _ip("link", "set", "eth0", "up", ns=ns)
        _ip("link", "set", "lo", "up", ns=ns)
        if self.rate_mbit and h > 0:
            self.shape(h, self.rate_mbit)

    def shape(self, host: int, rate_mbit: float) -> None:
        """Shape host ``host``'s link to ``rate_mbit`` in both directions (htb)."""
        rate = f"{int(rate_mbit * 1000)}kbit"
        # quantum: htb's default (rate / r2q) is far above the MTU at these rates and it warns
        quantum = "1514"
        for dev, ns in ((self.veth(host), None), ("eth0", self.ns(host))):
            _tc("qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "10", ns=ns)
            _tc(
                "class",
                "replace",
                "dev",
                dev,
                "parent",
                "1:",
                "classid",
                "1:10",
                "htb",
                "rate",
                rate,
                "ceil",
                rate,
                "quantum",
                quantum,
                ns=ns,
            )

    def unshape(self, host: int) -> None:
        """Host ``host``'s link back to the veth's own speed (the ``htb`` qdiscs removed; a link
        that was not shaped is left as it is)."""
        for dev, ns in ((self.veth(host), None), ("eth0", self.ns(host))):
            _tc("qdisc", "del", "dev", dev, "root", ns=ns, check=False)

    def link(self, host: int, up: bool) -> None:
        """Take host ``host``'s link down (inside its namespace, as a broken cable) or up."""
        _ip("link", "set", "eth0", "up" if up else "down", ns=self.ns(host))

    def popen(
        self, host: int, cmd: Sequence[str], log: str | None = None, env: dict[str, str] | None = None, **kw
    ) -> subprocess.Popen:
        """Start ``cmd`` inside host ``host``'s namespace (its own session: a signal to it
        reaches only it), logging to ``logs/<log>``."""
        out = open(self.logs / log, "ab") if log else subprocess.DEVNULL
        try:
            p = subprocess.Popen(
                ["ip", "netns", "exec", self.ns(host), *cmd],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
                **kw,
            )
        finally:
            if log:
                out.close()  # the child holds its own copy
        self.procs.append(p)
        return p

    def run(
        self, cmd: Sequence[str], host: int = 0, timeout: float = 600, env: dict[str, str] | None = None, **kw
    ) -> subprocess.CompletedProcess:
        """Run ``cmd`` to its end inside host ``host`` (default: the head), capturing its output."""
        return subprocess.run(
            ["ip", "netns", "exec", self.ns(host), *cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **COMMAND_ENV, **(env or {})},
            **kw,
        )

    def _on_cluster_cpus(self) -> list[str]:
        return ["taskset", "-c", self.cluster_cpus] if self.cluster_cpus else []

    def _start_scheduler(self) -> None:
        # worker locks are leases (tula.engine.launch.dask): a killed command's workers are free again
        # after its lease timeout (COMMAND_ENV), checked here every 2 s
        self.popen(
            0,
            [
                *self._on_cluster_cpus(),
                self.python,
                "-m",
                "distributed.cli.dask_scheduler",
                "--host",
                self.address(0),
                "--port",
                str(self.scheduler_port),
                "--no-dashboard",
            ],
            log="scheduler.log",
            env={
                "OMP_NUM_THREADS": "1",
                "DASK_DISTRIBUTED__SCHEDULER__LOCKS__LEASE_VALIDATION_INTERVAL": "2s",
            },
        )

    def start_worker(self, host: int) -> subprocess.Popen:
        """One more Dask worker on host ``host``, under a nanny (as ``dask worker`` starts
        one by default: a worker stuck in a collective can be restarted); its own session, so
        ``os.killpg`` on the returned process kills the nanny and the worker."""
        k = self._n_started
        self._n_started += 1
        pin = ["taskset", "-c", str((host - 1) % (os.cpu_count() or 1))] if self.pin_cores else self._on_cluster_cpus()
        nice = ["nice", "-n", str(self.worker_niceness)] if self.worker_niceness else []
        return self.popen(
            host,
            [
                *nice,
                *pin,
                self.python,
                "-m",
                "distributed.cli.dask_worker",
                self.scheduler_address,
                "--host",
                self.address(host),
                "--nthreads",
                "1",
                "--no-dashboard",
                "--name",
                f"h{host}-w{k}",
            ],
            log=f"worker-h{host}-{k}.log",
            env={**WORKER_ENV, **self.worker_env},
        )

    def wait_for_workers(self, n: int, timeout_s: float = 120) -> None:
        """Wait (from the head) until the scheduler knows ``n`` workers."""
        code = (
            "import sys; from distributed import Client\n"
            f"c = Client({self.scheduler_address!r}, timeout={timeout_s})\n"
            f"c.wait_for_workers({n}, timeout={timeout_s}); c.close()"
        )
        r = self.run([self.python, "-c", code], timeout=timeout_s + 30)
        if r.returncode != 0:
            raise RuntimeError(
                f"the emulated hosts' {n} Dask workers did not register: {r.stderr[-2000:]}\n{self.log_tail()}"
            )

    def log_tail(self, chars: int = 3000) -> str:
        """The end of every process log (for a failing test's message)."""
        parts = []
        for p in sorted(self.logs.glob("*.log")) if self.logs.exists() else []:
            parts.append(f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Kill every process in the namespaces, delete them, the veths and the bridge."""
        if self._stopped:
            return
        self._stopped = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
        for ns in self.namespaces:
            _kill_namespace_processes(ns)
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.wait(timeout=10)
        for ns in self.namespaces:
            _ip("netns", "del", ns, check=False)  # takes the veth pair with it
        for h in range(self.n_hosts + 1):
            _ip("link", "del", self.veth(h), check=False)
        _ip("link", "del", self.bridge, check=False)
        shutil.rmtree(self.logs, ignore_errors=True)  # read (log_tail) before stop, if at all
        left = self.leftovers()
        self.namespaces = []
        if left:
            raise RuntimeError(f"emulated hosts left behind: {', '.join(left)}")

    def leftovers(self) -> list[str]:
        """Namespaces, links and processes of this instance still present (empty after stop)."""
        left = [ns for ns in _namespaces() if ns.startswith(f"{PREFIX}{self.id}-")]
        links = _ip("-o", "link", "show", check=False).stdout
        left += [
            name
            for name in [self.bridge, *(self.veth(h) for h in range(self.n_hosts + 1))]
            if re.search(rf"\d+: {re.escape(name)}[:@]", links)
        ]
        left += [f"pid {p.pid}" for p in self.procs if p.poll() is None]
        return left
