"""The pip requirements of a conda environment file (its `pip:` list), one a
line: what tools/install-*-env.sh installs for `make setup GPU=1`, so that the
GPU build's pins are written once, in envs/*-gpu.yaml, for conda and make alike.

    python3 tools/environment-pins.py envs/torch-gpu.yaml

No YAML library: the files are conda's plain form (a `- pip:` item, then its
`- requirement` lines, indented deeper).
"""

from __future__ import annotations

import sys


def pip_requirements(text: str) -> list[str]:
    requirements, depth = [], None
    for line in text.splitlines():
        stripped = line.split("#", 1)[0].rstrip()
        if not stripped:
            continue
        indent = len(stripped) - len(stripped.lstrip())
        if stripped.strip() == "- pip:":
            depth = indent
        elif depth is not None and indent > depth and stripped.strip().startswith("- "):
            requirements.append(stripped.strip()[2:].strip())
        elif depth is not None and indent <= depth:
            depth = None
    return requirements


if __name__ == "__main__":
    with open(sys.argv[1]) as handle:
        print("\n".join(pip_requirements(handle.read())))
