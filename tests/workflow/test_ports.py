"""The rendezvous ports trainscale hands its local processes."""

import socket

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
