#!/usr/bin/env python3
"""Print the harness's modules: every trainscale module a training process
imports (what runs on GPU nodes, on Python 3.8+), found by following the
module-level imports of `trainscale train` and `run` (the loop, the
launcher, the examples' launcher) and of each framework's backend module,
as the registry names them. `make lint` checks these with vermin; a new
framework's module is found here without a list to edit. The analysis
(`trainscale predict`, `refactoring`: imported inside functions) is not."""

from __future__ import annotations

import ast
import os
import sys

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
sys.path.insert(0, SRC)

from trainscale.catalogue.registry import REGISTRY  # noqa: E402


def _path(module: str) -> str:
    """A module's file: its .py, or a package's __init__.py."""
    base = os.path.join(SRC, *module.split("."))
    return os.path.join(base, "__init__.py") if os.path.isdir(base) else base + ".py"


def _module_level(tree: ast.Module):
    """The nodes run when the module is imported: not those inside functions."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo += list(ast.iter_child_nodes(node))


def _imports(module: str) -> set[str]:
    """The trainscale modules `module` imports when it is imported."""
    with open(_path(module), encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    found = set()
    for node in _module_level(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("trainscale.")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("trainscale"):
            # `from trainscale.core import records` imports a module too.
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    # A package's parents' __init__.py run too (trainscale.frameworks's).
    found |= {".".join(n.split(".")[:i]) for n in found for i in range(2, n.count(".") + 1)}
    return {name for name in found if os.path.isfile(_path(name))}


def harness_modules() -> list[str]:
    roots = {"trainscale.__main__", "trainscale.cli", "trainscale.launching.examples"}
    roots |= {
        "trainscale.harness.training",
        "trainscale.launching.launch",
    }  # what `train` and `run` import
    roots |= {spec.backend.partition(":")[0] for spec in REGISTRY}
    seen, todo = set(), sorted(roots)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += sorted(_imports(module) - seen)
    return sorted(os.path.relpath(_path(m), os.path.dirname(SRC)) for m in seen)


if __name__ == "__main__":
    print(" ".join(["src/trainscale/__init__.py", *harness_modules()]))
