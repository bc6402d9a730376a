"""`find_free_port` draws rendezvous ports outside the kernel's ephemeral range, so an
outgoing connection cannot take the port between the check and rank 0's bind."""

from __future__ import annotations

import random
import socket

from rl_core.single_controller import host


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
        return True


def test_ports_are_free_and_below_the_ephemeral_range():
    random.seed(0)  # a seeded global RNG (as every training process has) changes nothing
    ports = [host.find_free_port() for _ in range(20)]
    assert all(20000 <= p <= 32767 for p in ports), ports
    assert all(_bindable(p) for p in ports)
    assert len(set(ports)) > 15  # drawn, not the same port every time


def test_a_taken_range_falls_back_to_a_kernel_port(monkeypatch):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        monkeypatch.setattr(host, "_RENDEZVOUS_PORTS", (busy, busy))
        port = host.find_free_port()
        assert port != busy and _bindable(port)
