"""What a newcomer can read in an afternoon, held: no module of the package
over 400 lines, no function or method over 60 (its docstring and comments
count). A module that grows past it splits by concept; a function, into
steps with names. The workflow's common.smk is validation and small input
functions (what a study runs is trainscale.workflow's), as the anchor
workflow's (snakemake-workflows/rna-seq-star-deseq2: about 200 lines)."""

import ast
import os

from conftest import REPO

PACKAGE = os.path.join(REPO, "src", "trainscale")
MODULE_LINES = 400
FUNCTION_LINES = 60
COMMON_SMK_LINES = 200


def _sources():
    for folder, _, names in os.walk(PACKAGE):
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as handle:
                    yield os.path.relpath(path, REPO), handle.read()


def test_no_module_is_over_400_lines():
    long = {path: text.count("\n") for path, text in _sources()}
    assert {path: n for path, n in long.items() if n > MODULE_LINES} == {}
    assert len(long) > 50  # the walk found the package


def test_no_function_is_over_60_lines():
    long = {}
    for path, text in _sources():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > FUNCTION_LINES:
                    long[f"{path}:{node.lineno} {node.name}"] = lines
    assert long == {}


def test_common_smk_is_validation_and_small_input_functions():
    with open(os.path.join(REPO, "workflow", "rules", "common.smk"), encoding="utf-8") as handle:
        assert handle.read().count("\n") <= COMMON_SMK_LINES
