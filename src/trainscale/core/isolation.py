"""What is known to make a process in a container slower than on the bare
host, as the process itself sees it: recorded for every run, bare or not, so
a difference between runtimes is explained by measurement (the README's
containers section), not assumed.

- /dev/shm: NCCL's and Open MPI's shared-memory transports live there;
  Podman and Docker give a container 64 MB unless told --ipc=host or
  --shm-size (Gloo has none: it runs over TCP loopback on one host);
- the network namespace: a container with one of its own (Podman's bridge,
  rootless slirp4netns) routes every packet through a virtual link, where
  --network=host, Charliecloud and Apptainer share the host's;
- seccomp: a filter checks every system call (Podman's default profile);
- a CPU quota: a cgroup limit on the cores the container may use.
"""

from __future__ import annotations

import json
import os

# What an image built by envs/Containerfile says of itself (its last step).
IMAGE_LABEL = "/etc/trainscale-image.json"


def _first_line(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.readline().strip()
    except OSError:
        return ""


def seccomp_mode() -> int | None:
    """0: none, 1: strict, 2: a filter (/proc/self/status), None if unknown."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("Seccomp:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def cpu_quota_cores() -> float | None:
    """The cores this process's CPU cgroup may use (None: no quota), as
    cgroup v2's cpu.max or v1's cfs_quota_us over cfs_period_us say."""
    v2 = _first_line("/sys/fs/cgroup/cpu.max").split()  # "max 100000": no quota
    if len(v2) == 2 and v2[0] != "max":
        return int(v2[0]) / int(v2[1])
    v1 = _first_line("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
    period = _first_line("/sys/fs/cgroup/cpu/cpu.cfs_period_us")
    if v1 and period and int(v1) > 0:
        return int(v1) / int(period)
    return None


def isolation_facts() -> dict:
    """/dev/shm's size, the network namespace and its interfaces, seccomp and
    the CPU quota, as this process sees them."""
    try:
        shm = os.statvfs("/dev/shm")
        shm_mib = round(shm.f_blocks * shm.f_frsize / 2**20)
    except OSError:
        shm_mib = None
    try:
        namespace = os.readlink("/proc/self/ns/net")
        interfaces = sorted(os.listdir("/sys/class/net"))
    except OSError:
        namespace, interfaces = None, []
    return {
        "dev_shm_mib": shm_mib,
        "network_namespace": namespace,
        "network_interfaces": interfaces,
        "seccomp": seccomp_mode(),
        "cpu_quota_cores": cpu_quota_cores(),
    }


def image_label() -> dict | None:
    """What the image this process runs in says of itself (its recipe's
    digest, its base); None on the bare host."""
    try:
        with open(IMAGE_LABEL) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None
