"""Free TCP ports for the rendezvous of processes started on this machine.

Ports come from below the kernel's ephemeral range: every outgoing connection
(each Gloo pair, each test running beside us) takes its source port from that
range, so a port picked there and released can be taken before the rank that
was told it binds it. That happened in CI: a DDP rank's TCPStore failed with
EADDRINUSE on port 42473 while the other pytest worker ran Gloo. Below the
range, only another listener can take the port, and we check that none does.

Two runs started together on one machine could still pick the same free
port before either binds it: each port handed out is claimed for a while
(CLAIM_SECONDS) with a file only one process can create, and a port another
run claimed is not handed out again until its claim is old.
"""

from __future__ import annotations

import os
import random
import socket
import time

EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
# Ports under this are often registered to services (and 10000-ish to
# developer tools); above it and below the ephemeral range, listeners are rare.
LOWEST = 20000
# Claims of the ports handed out (one file a port), shared by every process
# of this machine whatever its TMPDIR; a claim this old no longer holds (a
# rank binds its port within seconds of being told it).
CLAIMS = "/tmp/trainscale-port-claims"
CLAIM_SECONDS = 300


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
        if port not in ports and is_free(port) and claim(port):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise RuntimeError(f"no {count} free ports between {LOWEST} and {highest}")


def claim(port: int) -> bool:
    """Whether this process now holds `port`'s claim: none held it, or an old
    one (or claims cannot be made here: the port is handed out unclaimed)."""
    if not os.path.isdir(CLAIMS):
        try:
            os.makedirs(CLAIMS)
            os.chmod(CLAIMS, 0o1777)  # every user's processes claim here, as in /tmp
        except OSError:
            pass  # made by another process meanwhile, or not ours to make
    path = os.path.join(CLAIMS, str(port))
    try:
        if time.time() - os.path.getmtime(path) > CLAIM_SECONDS:
            os.remove(path)  # a stale claim; two removers: one of them creates below
    except OSError:
        pass  # no claim there, or another process removed it first
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    except OSError:
        return True  # no claims here: the check that nothing listens stands alone
    return True
