"""How much a working single-device script must change to run under each
framework: the code-refactoring half of seed 000 (its §III), measured.

Each framework's example (examples/, trainscale.launching.examples) is measured
against its ecosystem's single-device base, on code lines only: comments,
docstrings and blank lines are dropped first, and so are blocks marked as a
CPU stand-in (STAND_IN_BEGIN .. STAND_IN_END), code that lets a multi-device
script run on a machine without GPUs and that no GPU user writes.

- Lines: a line diff (difflib) of the two; a replaced run of lines counts as
  changed up to the shorter side, the rest as added or removed. A line that
  only gained indentation (a block moved into `with strategy.scope():`) is
  changed: the user had to touch it.
- API names: the framework names the script uses and the base does not,
  read from the syntax tree as written (`hvd.DistributedGradientTape`,
  `strategy.run`, `DistributedDataParallel`). A framework name is rooted in
  an import of a framework module, or in a variable assigned from one.
- Concepts: what a user must learn, from the fixed vocabulary CONCEPTS. Each
  example declares its concepts in its docstring ("concepts: a, b"); each
  concept names the API names that are its evidence, and concepts_evidenced
  lets a test hold the declaration to the code both ways.

The table and the side-by-side diffs are written by
trainscale.analysis.refactoring_report.
"""

from __future__ import annotations

import ast
import difflib
import io
import json
import os
import re
import tokenize
from dataclasses import dataclass

from trainscale.catalogue.registry import REGISTRY, framework_spec
from trainscale.launching.examples import EXAMPLES_DIR, Example, user_launch

STAND_IN_BEGIN = "# >>> CPU stand-in"
STAND_IN_END = "# <<< CPU stand-in"
# The modules of each ecosystem: framework names are rooted in imports of
# these, and of each entry's `requires`.
ECOSYSTEM_MODULES = {"tensorflow": ("tensorflow", "keras"), "torch": ("torch",)}


def framework_modules() -> tuple[str, ...]:
    """The top-level modules framework code is imported from (tensorflow,
    keras, torch, horovod, ...): every ecosystem's and every entry's own."""
    modules = [m for ecosystem in ECOSYSTEM_MODULES.values() for m in ecosystem]
    modules += [spec.requires.partition(".")[0] for spec in REGISTRY]
    return tuple(dict.fromkeys(modules))


FRAMEWORK_MODULES = framework_modules()

# Concept -> the names whose use shows a script needs it: one of them must be
# a part of an introduced API name (hvd.init, strategy.run, sampler.set_epoch).
# The paper's words where it has them. A registry entry may add evidence, or a
# concept of its own (FrameworkSpec.concept_evidence): CONCEPTS below.
_VOCABULARY = {
    "process group": ("init", "init_process_group", "destroy_process_group"),
    "rank and size": ("rank", "size", "local_rank", "get_rank", "get_world_size"),
    "device pinning": ("set_visible_devices", "set_memory_growth", "set_device"),
    "data sharding": ("shard", "DistributedSampler", "set_epoch"),
    "distributed dataset": ("experimental_distribute_dataset", "distribute_datasets_from_function"),
    "strategy scope": ("scope",),
    "global-batch loss scaling": ("compute_average_loss",),
    "replicated step": ("run",),
    "gradient all-reduce": (
        "DistributedGradientTape",
        "DistributedOptimizer",
        "DistributedDataParallel",
    ),
    "variable broadcast": (
        "broadcast_variables",
        "broadcast_parameters",
        "broadcast_optimizer_state",
    ),
    "cross-replica reduction": ("allreduce", "all_reduce", "reduce"),
    "cluster set-up": ("cluster_resolver",),
}


def _concepts() -> dict[str, tuple[str, ...]]:
    concepts = dict(_VOCABULARY)
    for spec in REGISTRY:
        for concept, evidence in spec.concept_evidence:
            concepts[concept] = tuple(dict.fromkeys((*concepts.get(concept, ()), *evidence)))
    return concepts


CONCEPTS = _concepts()


@dataclass(frozen=True)
class Refactoring:
    """One framework's example measured against its ecosystem's base for the
    same workload."""

    framework: str
    workload: str  # what the example trains (trainscale.launching.examples.WORKLOADS)
    base: str
    base_lines: int  # code lines of the base
    lines: int  # code lines of the example, and of the files beside it (example_files)
    added: int
    removed: int
    changed: int
    api_names: tuple[str, ...]  # introduced: in the script, not in the base
    concepts: tuple[str, ...]  # declared in the example's docstring
    stand_in_lines: int  # CPU stand-in lines, not counted
    launch_one_node: str
    launch_two_nodes: str

    @property
    def lines_touched(self) -> int:
        return self.added + self.removed + self.changed

    @property
    def base_share_touched(self) -> float:
        """The share of the base's lines removed or changed."""
        return (self.removed + self.changed) / self.base_lines


# --------------------------------------------------------------------------
# Reading a script
# --------------------------------------------------------------------------


def stand_in_free(source: str) -> tuple[str, int]:
    """The source with its CPU stand-in blocks blanked (line numbers kept), and
    how many lines they held."""
    lines, inside, dropped = source.splitlines(), False, 0
    for number, line in enumerate(lines):
        marker = line.strip()
        if marker.startswith(STAND_IN_BEGIN):
            inside = True
        if inside:
            lines[number], dropped = "", dropped + 1
        if marker.startswith(STAND_IN_END):
            inside = False
    if inside:
        raise ValueError(f"a {STAND_IN_BEGIN!r} block has no {STAND_IN_END!r}")
    return "\n".join(lines) + "\n", dropped


def _docstring_lines(tree: ast.Module) -> set[int]:
    """Line numbers of every docstring (module, class, function)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            value = getattr(first, "value", None) if isinstance(first, ast.Expr) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                found.update(range(first.lineno, first.end_lineno + 1))
    return found


def code_lines(source: str) -> list[str]:
    """The lines that are code: no comments, docstrings or blank lines; the
    indentation kept (re-indenting a line is changing it)."""
    lines = source.splitlines()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, column = token.start
            lines[row - 1] = lines[row - 1][:column]
    docstrings = _docstring_lines(ast.parse(source))
    kept = (line.rstrip() for number, line in enumerate(lines, 1) if number not in docstrings)
    return [line for line in kept if line.strip()]


def declared_concepts(source: str) -> tuple[str, ...]:
    """The concepts a script's docstring declares after "concepts:" ("none": none)."""
    docstring = ast.get_docstring(ast.parse(source)) or ""
    match = re.search(r"^concepts:(.*?)(?:\n\s*\n|\Z)", docstring, re.M | re.S)
    if not match:
        raise ValueError('its docstring declares no "concepts:" (write "concepts: none")')
    words = " ".join(match.group(1).split())
    concepts = tuple(c.strip() for c in words.split(",") if c.strip())
    if concepts == ("none",):
        return ()
    unknown = [c for c in concepts if c not in CONCEPTS]
    if unknown:
        raise ValueError(f"unknown concept(s) {unknown}; the vocabulary: {', '.join(CONCEPTS)}")
    return concepts


def _dotted(node) -> str | None:
    """`a.b.c` for an attribute chain rooted in a name, through calls
    (`a.b().c`), else None."""
    parts = []
    while isinstance(node, (ast.Attribute, ast.Call)):
        if isinstance(node, ast.Call):
            parts.append("()")
            node = node.func
        else:
            parts.append("." + node.attr)
            node = node.value
    if not isinstance(node, ast.Name):
        return None
    return node.id + "".join(reversed(parts)).lstrip("()")


def _imported_framework_names(tree: ast.Module) -> set[str]:
    """Names an import of a framework module binds (tf, hvd, dist, DistributedSampler)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            for alias in node.names:
                if (module or alias.name).split(".")[0] in FRAMEWORK_MODULES:
                    names.add((alias.asname or alias.name).split(".")[0])
    return names


def framework_objects(source: str) -> set[str]:
    """Variables bound to the result of calling a framework name (strategy =
    tf.distribute.MirroredStrategy(), with tf.GradientTape() as tape), and
    so on from those, until nothing changes."""
    tree = ast.parse(source)
    bindings = []  # (the call, the names it binds)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            bindings.append((node.value, node.targets))
        elif isinstance(node, ast.withitem) and isinstance(node.context_expr, ast.Call):
            bindings.append((node.context_expr, [node.optional_vars]))
    roots = _imported_framework_names(tree)
    objects = set()
    while True:
        before = len(objects)
        for call, targets in bindings:
            called = _dotted(call.func)
            if called and called.split(".")[0] in roots | objects:
                objects.update(t.id for t in targets if isinstance(t, ast.Name))
        if len(objects) == before:
            return objects


def api_names(source: str, objects: set[str] | None = None) -> set[str]:
    """The framework names a script uses, as written: the longest attribute
    chain rooted in an imported framework name or a framework object, or an
    imported name used on its own (DistributedDataParallel).

    `objects`: the framework objects to follow (default: the script's own).
    Comparing two scripts, pass both scripts' objects: a variable that only
    one of them binds from a framework call (optimizer =
    hvd.DistributedOptimizer(optimizer)) is the same object in both.
    """
    tree = ast.parse(source)
    imported = _imported_framework_names(tree)
    roots = imported | (framework_objects(source) if objects is None else objects)
    inner = set()  # attribute nodes inside a longer chain
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            value = node.value.func if isinstance(node.value, ast.Call) else node.value
            inner.add(id(value))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            dotted = _dotted(node)
            if dotted and dotted.split(".")[0] in roots:
                names.add(dotted)
        elif isinstance(node, ast.Name) and node.id in imported and id(node) not in inner:
            names.add(node.id)
    return names


def introduced_api_names(base_source: str, source: str) -> set[str]:
    """The framework names `source` uses and `base_source` does not."""
    objects = framework_objects(base_source) | framework_objects(source)
    return api_names(source, objects) - api_names(base_source, objects)


def config_keys(config: dict, prefix: str = "") -> set[str]:
    """A JSON config's keys, dotted below their parents (zero_optimization.stage)."""
    keys = set()
    for key, value in config.items():
        keys.add(prefix + key)
        if isinstance(value, dict):
            keys |= config_keys(value, f"{prefix}{key}.")
    return keys


def concepts_evidenced(introduced: set[str]) -> set[str]:
    """The concepts whose evidence is part of an introduced API name."""
    parts = {part.removesuffix("()") for name in introduced for part in name.split(".")}
    return {concept for concept, evidence in CONCEPTS.items() if parts & set(evidence)}


# --------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------


def line_changes(base: list[str], script: list[str]) -> tuple[int, int, int]:
    """(added, removed, changed) lines from `base` to `script`."""
    added = removed = changed = 0
    matcher = difflib.SequenceMatcher(None, base, script, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        old, new = i2 - i1, j2 - j1
        if tag == "replace":
            changed += min(old, new)
            removed += max(0, old - new)
            added += max(0, new - old)
        elif tag == "delete":
            removed += old
        elif tag == "insert":
            added += new
    return added, removed, changed


def read_text(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def measure(example: Example, examples_dir: str = EXAMPLES_DIR) -> Refactoring:
    """`example` against its ecosystem's base for the same workload."""
    framework, path = example.framework, example.path(examples_dir)
    try:
        base_source, _ = stand_in_free(read_text(example.base.path(examples_dir)))
        source, stand_in = stand_in_free(read_text(path))
        concepts = declared_concepts(source)
    except (OSError, ValueError, SyntaxError) as err:
        raise ValueError(f"{framework}'s example {path}: {err}") from None
    base_code, code = code_lines(base_source), code_lines(source)
    added, removed, changed = line_changes(base_code, code)
    spec = framework_spec(framework)
    # Files a user writes beside the script (DeepSpeed's JSON config): every
    # line that is not blank is added, and its keys are API names to learn.
    extra = [read_text(os.path.join(examples_dir, name)) for name in spec.example_files]
    config_lines = sum(len([line for line in text.splitlines() if line.strip()]) for text in extra)
    names = introduced_api_names(base_source, source) | {
        key for text in extra for key in config_keys(json.loads(text))
    }
    one_node, two_nodes = user_launch(example)
    return Refactoring(
        framework=framework,
        workload=example.workload,
        base=example.base.framework,
        base_lines=len(base_code),
        lines=len(code) + config_lines,
        added=added + config_lines,
        removed=removed,
        changed=changed,
        api_names=tuple(sorted(names)),
        concepts=concepts,
        stand_in_lines=stand_in,
        launch_one_node=one_node,
        launch_two_nodes=two_nodes,
    )
