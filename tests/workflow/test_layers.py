"""The package's layers (docs: explanation/architecture.md), held: no module
imports one of a higher layer, at the top of a file or inside a function, nor
through importlib.import_module; and no two modules import each other,
however indirectly."""

import ast
import os

from conftest import REPO

from trainscale import LAYERS
from trainscale.catalogue.parameter_server_kind import SERVE
from trainscale.catalogue.registry import REGISTRY

SRC = os.path.join(REPO, "src")
# The modules that import a module named at run time, and what they may name:
# the registry's training code and drivers. Any other run-time import of
# trainscale must be a literal, so this test sees it.
DYNAMIC = {
    "trainscale.frameworks": {spec.backend.partition(":")[0] for spec in REGISTRY},
    # A driver's and a role's function (a parameter server's serve).
    "trainscale.launching.train_process": {
        function.partition(":")[0]
        for function in (*(spec.driver for spec in REGISTRY if spec.driver), SERVE)
    },
    "trainscale.harness.backend": set(),  # Horovod's own modules (horovod.tensorflow)
}


def modules() -> dict[str, str]:
    """Every module of the package: dotted name -> file."""
    found = {}
    for folder, _, names in os.walk(os.path.join(SRC, "trainscale")):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, SRC)[:-3].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else len(LAYERS) - 1


def imports(module: str, path: str, known: set[str]) -> set[str]:
    """The trainscale modules `module` imports anywhere in its file."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            argument = node.args[0] if node.args else None
            if isinstance(argument, ast.Constant):
                found.add(argument.value)
            else:
                assert module in DYNAMIC, f"{module} imports a module it names at run time"
                found |= DYNAMIC[module]
    return {name for name in found if name in known and name != module}


def graph() -> dict[str, set[str]]:
    files = modules()
    return {module: imports(module, path, set(files)) for module, path in files.items()}


def test_no_module_imports_a_higher_layer():
    upward = [
        f"{module} ({LAYERS[layer(module)]}) imports {target} ({LAYERS[layer(target)]})"
        for module, targets in graph().items()
        for target in targets
        if layer(target) > layer(module)
    ]
    assert not upward, "\n".join(upward)


def test_every_subpackage_is_a_layer():
    packages = {m.split(".")[1] for m in modules() if m.count(".") >= 1}
    assert packages - {"cli", "__main__"} == set(LAYERS) - {"cli"}


def test_no_import_circle():
    edges = graph()
    state: dict[str, str] = {}

    def visit(module, path):
        state[module] = "open"
        for target in sorted(edges[module]):
            if state.get(target) == "open":
                raise AssertionError(" -> ".join([*path, module, target]))
            if target not in state:
                visit(target, [*path, module])
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [])
