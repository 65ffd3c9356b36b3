"""Where a rank's collectives go on the network: the interface, derived from the address the
cluster knows the rank's worker by, and a reachability probe of the other ranks.

torch's gloo, left to itself, binds to the address the machine's *host name* resolves to.
On many Debian-based nodes (and on this project's test machines) that is 127.0.0.1 or
127.0.1.1, so a rank on another host is told to meet it on loopback and fails with
"Connection refused".  The address a cluster knows a worker by (Dask's worker address,
SLURM's node list, torchrun's MASTER_ADDR) is reachable by the others by construction: the
interface that carries it is the one to use.

The rule, in one place (:func:`choose_interface`):

1. an interface the user set wins: ``GLOO_SOCKET_IFNAME`` (gloo) or ``NCCL_SOCKET_IFNAME``
   (NCCL) in the worker's environment, else the spec's ``cluster.interface``;
2. else the interface that carries the rank's address (``lo`` for a loopback address);
3. else (the address is not on any interface of this machine, e.g. behind a NAT) nothing is
   set and torch's default applies; the profile records ``interface_source: torch default``.

:func:`interface_env` sets the chosen interface for one world and restores the environment
after it, so a Dask worker that later runs another world starts from what the user gave.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

#: the environment variable each backend reads for its interface
IFNAME_ENV = {"gloo": "GLOO_SOCKET_IFNAME", "nccl": "NCCL_SOCKET_IFNAME"}


@dataclass(frozen=True)
class InterfaceChoice:
    """The interface a rank's collectives use, and why that one."""

    interface: str  # "" when none could be chosen (torch's default applies)
    source: (
        str  # "GLOO_SOCKET_IFNAME" | "NCCL_SOCKET_IFNAME" | "cluster.interface" | "worker address" | "torch default"
    )


def resolve(host: str) -> str:
    """``host`` as an IP address (a name is resolved here; an address is returned as it is)."""
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(host.strip("[]")))
    return str(socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)[0][4][0])


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(resolve(host)).is_loopback
    except (OSError, ValueError):
        return host == "localhost"


def interface_of(address: str) -> str | None:
    """The name of this machine's network interface that carries ``address`` (an IP or a
    name), or None when no interface here has it."""
    try:
        ip = ipaddress.ip_address(resolve(address))
    except (OSError, ValueError):
        return None
    interfaces = _interfaces()
    if ip.is_loopback and "lo" in interfaces:  # 127.0.0.2 and the like are lo's too, though not listed
        return "lo"
    return next((name for name, addrs in interfaces.items() if ip in addrs), None)


def _interfaces() -> dict[str, set]:
    """Interface name -> its IPv4 and IPv6 addresses."""
    import psutil

    out: dict[str, set] = {}
    for name, addrs in psutil.net_if_addrs().items():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                with contextlib.suppress(ValueError):
                    out.setdefault(name, set()).add(ipaddress.ip_address(a.address.split("%")[0]))
    return out


def choose_interface(address: str, backend: str, configured: str | None = None) -> InterfaceChoice:
    """The interface for a rank whose worker is known by ``address`` (see the module's rule)."""
    env = IFNAME_ENV.get(backend, "GLOO_SOCKET_IFNAME")
    if os.environ.get(env):
        return InterfaceChoice(os.environ[env], env)
    if configured:
        return InterfaceChoice(configured, "cluster.interface")
    found = interface_of(address)
    return InterfaceChoice(found, "worker address") if found else InterfaceChoice("", "torch default")


@contextlib.contextmanager
def interface_env(choice: InterfaceChoice, backend: str) -> Iterator[None]:
    """Set the backend's interface variable (and gloo's, which the stop flag's CPU group
    uses) to ``choice`` for the block; restore the environment after it."""
    names = {IFNAME_ENV.get(backend, "GLOO_SOCKET_IFNAME"), "GLOO_SOCKET_IFNAME"}
    saved = {n: os.environ.get(n) for n in names}
    try:
        if choice.interface:
            for n in names:
                if not saved[n]:  # a variable the user set stays as they set it
                    os.environ[n] = choice.interface
        yield
    finally:
        for n, v in saved.items():
            if v is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = v


def local_address_towards(host: str, port: int) -> str:
    """This machine's address on its route to ``host`` (the address a peer there sees this
    one by): a UDP socket's local end after ``connect``, which sends nothing.  ``127.0.0.1``
    when there is no route."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((resolve(host), port))
            return s.getsockname()[0]
    except (OSError, ValueError):
        return "127.0.0.1"


def reachable(address: str, timeout_s: float = 2.0) -> bool:
    """Whether a TCP connection to ``address`` (``host:port`` or ``tcp://host:port``) opens
    within ``timeout_s``.  A refused connection (the host answers, nothing listens) is
    False too: the peer's process is gone."""
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def unreachable_peers(peers: dict[int, str], timeout_s: float = 2.0) -> list[int]:
    """The ranks among ``peers`` (rank -> a listening ``host:port`` of its worker) that do
    not answer, probed in parallel (at most ``timeout_s`` in all, give or take)."""
    if not peers:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(peers))) as pool:
        answers = dict(zip(peers, pool.map(lambda a: reachable(a, timeout_s), peers.values())))
    return sorted(r for r, ok in answers.items() if not ok)
