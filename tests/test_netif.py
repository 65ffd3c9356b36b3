"""Which interface a rank's collectives use, and the peer probe (tula.engine.launch.netif), on this
machine's own interfaces; the same rules across real hosts are tested in test_multihost.py."""

import os
import socket

import psutil
import pytest

from tula.engine.launch.netif import (
    InterfaceChoice,
    choose_interface,
    interface_env,
    interface_of,
    reachable,
    unreachable_peers,
)


@pytest.fixture
def no_ifname(monkeypatch):
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        monkeypatch.delenv(name, raising=False)


def _a_non_loopback_address() -> tuple[str, str] | None:
    for name, addrs in psutil.net_if_addrs().items():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return name, a.address
    return None


def test_the_interface_is_the_one_that_carries_the_workers_address(no_ifname):
    assert interface_of("127.0.0.1") == "lo"
    assert choose_interface("127.0.0.1", "gloo") == InterfaceChoice("lo", "worker address")
    found = _a_non_loopback_address()
    if found is not None:
        name, address = found
        assert interface_of(address) == name
        assert choose_interface(address, "nccl") == InterfaceChoice(name, "worker address")
    # an address no interface here carries: torch's default, said as such
    assert choose_interface("198.51.100.7", "gloo") == InterfaceChoice("", "torch default")  # TEST-NET-2


def test_what_the_user_set_wins_and_the_environment_comes_back(no_ifname, monkeypatch):
    assert choose_interface("127.0.0.1", "gloo", configured="eth9") == InterfaceChoice("eth9", "cluster.interface")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")
    choice = choose_interface("127.0.0.1", "nccl", configured="eth9")
    assert choice == InterfaceChoice("ib0", "NCCL_SOCKET_IFNAME")
    with interface_env(choice, "nccl"):
        # the user's NCCL variable stays; gloo (the stop flag's CPU group) gets the same interface
        assert os.environ["NCCL_SOCKET_IFNAME"] == "ib0" and os.environ["GLOO_SOCKET_IFNAME"] == "ib0"
    assert "GLOO_SOCKET_IFNAME" not in os.environ and os.environ["NCCL_SOCKET_IFNAME"] == "ib0"
    with interface_env(InterfaceChoice("lo", "worker address"), "gloo"):
        assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"
    assert "GLOO_SOCKET_IFNAME" not in os.environ


def test_the_probe_tells_a_listening_peer_from_a_gone_one():
    with socket.socket() as listening, socket.socket() as closed:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        closed.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        up = f"tcp://127.0.0.1:{listening.getsockname()[1]}"
        down = f"127.0.0.1:{closed.getsockname()[1]}"
        assert reachable(up) and not reachable(down, timeout_s=1)
        assert unreachable_peers({1: up, 2: down, 3: up}, timeout_s=1) == [2]
        assert unreachable_peers({}) == []
