"""Where a command's CPU time goes, process by process.

    python3 bench/cpu_by_process.py [--cwd] OUT.txt -- COMMAND [ARGS...]

Runs COMMAND and, every 0.5 s until it ends, reads every process's user and
system time from /proc: processes that SLURM, Ray or mpirun start outside
COMMAND's own tree (which `time` would miss) are counted too. OUT.txt gets
one line per kind of process, most CPU first: CPU-seconds, how many such
processes there were, and the kind (a `trainscale` subcommand and its
framework, else the first words of the command line, file names only;
with --cwd, a trainscale process's working directory too: which study's
copy of the workflow it ran in, on the SLURM lab).
Whatever else the machine runs meanwhile is counted as well: run it alone.
A process that lives less than one sampling interval may be missed.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections import Counter

TICKS = os.sysconf("SC_CLK_TCK")


def _processes(by_cwd: bool = False) -> dict[str, tuple[int, str]]:
    """pid:start -> (user + system ticks, kind), for every process now."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as handle:
                stat = handle.read()
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                argv = handle.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        name, fields = (
            stat[stat.find("(") + 1 : stat.rfind(")")],
            stat[stat.rfind(")") + 2 :].split(),
        )
        kind = _kind(argv, name)
        if by_cwd and kind.startswith("trainscale "):
            with contextlib.suppress(OSError):
                kind += " in " + os.readlink(f"/proc/{pid}/cwd")
        found[f"{pid}:{fields[19]}"] = (int(fields[11]) + int(fields[12]), kind)
    return found


def _kind(argv: list[str], name: str) -> str:
    line = " ".join(argv)
    match = re.search(r"trainscale (train|run|example)\b.*?--framework[ =](\S+)", line)
    if match:
        return f"trainscale {match[1]} {match[2]}"
    if not argv[0]:
        return f"[{name}]"  # a kernel thread
    return " ".join(os.path.basename(word) for word in argv[:3] if word)[:80]


def main() -> int:
    ours, command = sys.argv[1 : sys.argv.index("--")], sys.argv[sys.argv.index("--") + 1 :]
    by_cwd = "--cwd" in ours
    out = [arg for arg in ours if arg != "--cwd"][0]
    before = {key: ticks for key, (ticks, _) in _processes().items()}
    used, seen, kinds = Counter(), {}, {}
    child = subprocess.Popen(command)
    while True:
        ended = child.poll() is not None
        for key, (ticks, kind) in _processes(by_cwd).items():
            kinds.setdefault(key, kind)  # a process's kind as first seen (exec may rename it)
            last = seen.get(key, before.get(key, 0))
            used[kinds[key]] += (ticks - last) / TICKS
            seen[key] = ticks
        if ended:
            break
        time.sleep(0.5)
    counts = Counter(kinds[key] for key in seen if seen[key] > before.get(key, 0))
    with open(out, "w") as handle:
        for kind, seconds in used.most_common():
            if seconds > 0:
                handle.write(f"{seconds:8.1f} {counts[kind]:4d} {kind}\n")
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
