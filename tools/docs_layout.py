"""MkDocs hook: the package's layout, generated from the code at build time
(never committed), so it cannot drift as modules come and go:

- reference/modules.md    every module of src/trainscale, layer by layer:
                          what its docstring says first, its lines
- explanation/architecture.md's `<!-- generated: layers -->`: the layers,
  bottom to top (trainscale.LAYERS, which tests/workflow/test_layers.py
  holds), each with its modules and what it may import
- development/tests.md's `<!-- generated: tests -->`: every file of tests/,
  with what its docstring says first

mkdocs.yml names this file under `hooks:`; `make docs` builds the site.
"""

from __future__ import annotations

import ast
import os
import re
import sys

from mkdocs.structure.files import File

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tools/ is in the root
PACKAGE = os.path.join(ROOT, "src", "trainscale")
sys.path.insert(0, os.path.join(ROOT, "src"))

from trainscale import LAYERS  # noqa: E402

GENERATED = "Generated from the code when the site is built; edit the code, not this page."
LAYERS_MARK = "<!-- generated: layers -->"
TESTS_MARK = "<!-- generated: tests -->"


def summary(path: str) -> str:
    """The first sentence of a module's docstring, on one line."""
    with open(path, encoding="utf-8") as handle:
        docstring = ast.get_docstring(ast.parse(handle.read())) or ""
    paragraph = " ".join(docstring.split("\n\n")[0].split())
    sentence = re.split(r"(?<=\.)\s", paragraph, maxsplit=1)[0]
    return sentence.rstrip(".").replace("|", "\\|")


def layer_modules(layer: str) -> list[tuple[str, str, int]]:
    """(module path under the layer, summary, lines) of every module of a
    layer (a subpackage, or a module such as cli.py), its __init__ first."""
    if os.path.isfile(os.path.join(PACKAGE, f"{layer}.py")):
        files = [os.path.join(PACKAGE, f"{layer}.py")]
    else:
        files = sorted(
            os.path.join(folder, name)
            for folder, _, names in os.walk(os.path.join(PACKAGE, layer))
            for name in names
            if name.endswith(".py")
        )
    rows = []
    for path in files:
        relative = os.path.relpath(path, os.path.join(PACKAGE, layer))
        name = layer if relative.startswith("..") else relative[:-3].replace(os.sep, "/")
        with open(path, encoding="utf-8") as handle:
            lines = sum(1 for _ in handle)
        rows.append((name, summary(path), lines))
    return sorted(rows, key=lambda row: (not row[0].endswith("__init__"), row[0]))


def layers_table() -> str:
    """The layers, top to bottom as a reader meets them: what each is, its
    modules, what it may import."""
    rows = ["| layer | what it is | its modules | may import |", "|---|---|---|---|"]
    for index in reversed(range(len(LAYERS))):
        layer = LAYERS[index]
        rows_of_layer = layer_modules(layer)  # its __init__ (or its one module) first
        # A subpackage's modules; a one-module layer (cli): that module.
        own = [name for name, _, _ in rows_of_layer if not name.endswith("__init__")]
        modules = ", ".join(f"`{name}`" for name in own)
        below = ", ".join(LAYERS[:index]) or "nothing of trainscale"
        rows.append(f"| `trainscale.{layer}` | {rows_of_layer[0][1]} | {modules} | {below} |")
    return "\n".join(rows) + "\n"


def modules_page() -> str:
    lines = ["# Modules", "", GENERATED, ""]
    lines += [
        "Every module of `src/trainscale/`, layer by layer from the top (the",
        "[architecture](../explanation/architecture.md) says why there are layers).",
        "",
    ]
    for layer in reversed(LAYERS):
        lines += [f"## trainscale.{layer}", "", "| module | what it is | lines |", "|---|---|---|"]
        lines += [f"| `{name}` | {text} | {count} |" for name, text, count in layer_modules(layer)]
        lines.append("")
    return "\n".join(lines)


def tests_table() -> str:
    """Every Python file of tests/ (helpers first, then folder by folder)."""
    tests = os.path.join(ROOT, "tests")
    paths = sorted(
        (os.path.relpath(os.path.join(folder, name), tests) for folder, _, names in os.walk(tests)
         for name in names if name.endswith(".py")),
        key=lambda path: (os.sep in path, path),
    )  # fmt: skip
    rows = ["| file | what it holds |", "|---|---|"]
    rows += [f"| `tests/{path}` | {summary(os.path.join(tests, path))} |" for path in paths]
    return "\n".join(rows) + "\n"


def on_files(files, config):
    files.append(File.generated(config, "reference/modules.md", content=modules_page()))
    return files


def on_page_markdown(markdown, page, config, files):
    if LAYERS_MARK in markdown:
        markdown = markdown.replace(LAYERS_MARK, layers_table())
    if TESTS_MARK in markdown:
        markdown = markdown.replace(TESTS_MARK, tests_table())
    return markdown
