"""The rendezvous ports trainscale hands its local processes."""

import os
import socket
import time

import pytest

from trainscale.core import ports


def test_ports_differ_and_lie_below_the_ephemeral_range():
    picked = ports.free_ports(8)
    assert len(set(picked)) == 8
    assert all(ports.LOWEST <= port < ports.ephemeral_start() for port in picked)
    with open(ports.EPHEMERAL_RANGE) as kernel:
        assert ports.ephemeral_start() == int(kernel.read().split()[0])


def test_a_port_someone_listens_on_is_not_free():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("", ports.free_ports(1)[0]))
        listener.listen()
        port = listener.getsockname()[1]
        assert not ports.is_free(port)
    assert ports.is_free(port)


def test_a_port_handed_out_is_not_handed_out_again_while_its_claim_holds(monkeypatch, tmp_path):
    # Every port of a small range, then none: each is claimed, though free.
    monkeypatch.setattr(ports, "CLAIMS", str(tmp_path))
    monkeypatch.setattr(ports, "ephemeral_start", lambda: ports.LOWEST + 12)
    picked = ports.free_ports(10)
    assert all(ports.is_free(port) for port in picked)
    others = [p for p in range(ports.LOWEST, ports.LOWEST + 12) if p not in picked]
    assert sorted(ports.free_ports(len(others))) == sorted(others)
    with pytest.raises(RuntimeError, match="no 1 free ports"):
        ports.free_ports(1)
    # An old claim no longer holds.
    old = time.time() - ports.CLAIM_SECONDS - 1
    os.utime(tmp_path / str(picked[0]), (old, old))
    assert ports.free_ports(1) == [picked[0]]
