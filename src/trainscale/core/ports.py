"""Free TCP ports for the rendezvous of processes started on this machine.

Ports come from below the kernel's ephemeral range: every outgoing connection
(each Gloo pair, each test running beside us) takes its source port from that
range, so a port picked there and released can be taken before the rank that
was told it binds it. That happened in CI: a DDP rank's TCPStore failed with
EADDRINUSE on port 42473 while the other pytest worker ran Gloo. Below the
range, only another listener can take the port, and we check that none does.
"""

from __future__ import annotations

import random
import socket

EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
# Ports under this are often registered to services (and 10000-ish to
# developer tools); above it and below the ephemeral range, listeners are rare.
LOWEST = 20000


def ephemeral_start() -> int:
    """The first port the kernel hands out to outgoing connections."""
    try:
        with open(EPHEMERAL_RANGE) as handle:
            return int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default, and what other systems use too


def is_free(port: int) -> bool:
    """Whether a listener could bind the port on every address now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """`count` different ports no one listens on, from below the ephemeral range."""
    highest = ephemeral_start() - 1
    if highest < LOWEST + count:
        raise RuntimeError(f"no ports below the ephemeral range ({EPHEMERAL_RANGE})")
    # Random, so two runs started together rarely try the same port.
    ports: list[int] = []
    for _ in range(1000):
        port = random.randint(LOWEST, highest)
        if port not in ports and is_free(port):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise RuntimeError(f"no {count} free ports between {LOWEST} and {highest}")
