"""MkDocs hook: the reference pages, generated from the single declarations at
build time (never committed), so they cannot drift from the code:

- reference/settings.md   every setting (trainscale.core.setting declarations):
                          flag, type, default, bounds or choices, help, readers
- reference/frameworks.md every registry entry: label, launch kind,
                          environment, knobs, limits, what it refuses
- reference/cli.md        every `trainscale` command, from its parser
- reference/config.md     the study config's keys, from its JSON schema

mkdocs.yml names this file under `hooks:`; `make docs` builds the site.
"""

from __future__ import annotations

import inspect
import os
import re
import sys

from mkdocs.structure.files import File

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tools/ is in the root
sys.path.insert(0, os.path.join(ROOT, "src"))

from trainscale.catalogue.options import OPTIONS  # noqa: E402
from trainscale.catalogue.registry import REGISTRY  # noqa: E402
from trainscale.catalogue.settings import all_settings, readers  # noqa: E402
from trainscale.cli import build_parser  # noqa: E402
from trainscale.core.setting import REQUIRED  # noqa: E402
from trainscale.study.schema import config_schema  # noqa: E402

GENERATED = "Generated from the declarations when the site is built; edit those, not this page."


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _bounds(setting) -> str:
    if setting.name == "framework":
        return "a name of [Frameworks](frameworks.md)"
    if setting.choices:
        return ", ".join(f"`{c}`" for c in setting.choices)
    if setting.minimum is None:
        return ""
    return f"{'>' if setting.exclusive_minimum else '≥'} {setting.minimum:g}"


def _default(setting) -> str:
    if setting.default is REQUIRED:
        return "(required)"
    return "" if setting.default is None else f"`{setting.default!r}`"


def _readers(setting) -> str:
    who = readers(setting.name)
    if who is None:
        return "every framework"
    return ", ".join(f"`{name}`" for name in sorted(who, key=[s.name for s in REGISTRY].index))


def settings_page() -> str:
    lines = [
        "# Settings",
        "",
        GENERATED,
        "",
        "Each setting is a `trainscale train`/`run` flag and, unless it is part of the",
        "grid point, a `benchmark:` key of a study; a **knob** may also be a grid axis.",
        "A framework is passed only the settings it reads.",
        "",
        "| setting | flag | type | default | allowed | knob | read by | help |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in all_settings():
        lines.append(
            f"| `{s.name}` | `{s.flag}` | {s.type.__name__} | {_default(s)} | {_bounds(s)} "
            f"| {'yes' if s.axis else ''} | {_readers(s)} | {_cell(s.help)} |"
        )
    lines += [
        "",
        "## Run options",
        "",
        "How one run is carried out; none changes what is measured.",
        "",
    ]
    lines += ["| option | flag | type | default | help |", "|---|---|---|---|---|"]
    for s in OPTIONS:
        lines.append(
            f"| `{s.name}` | `{s.flag}` | {s.type.__name__} | {_default(s)} | {_cell(s.help)} |"
        )
    return "\n".join(lines) + "\n"


def _refusal(spec) -> str:
    if not spec.check:
        return ""
    # Its messages, as its check function returns them (their own words).
    messages = re.findall(r'return f?"([^"]+)"', inspect.getsource(spec.check))
    return "; ".join(messages) or f"see `{spec.check.__name__}`"


def frameworks_page() -> str:
    lines = [
        "# Frameworks",
        "",
        GENERATED,
        "",
        "From `trainscale.catalogue.registry`, in table order.",
        "",
    ]
    for spec in REGISTRY:
        knobs = ", ".join(f"`{k.name}`" for k in (*spec.launch.settings, *spec.knobs)) or "none"
        limits = "one device" if spec.one_device else "one node" if spec.one_node else "any nodes"
        lines += [
            f"## `{spec.name}`: {spec.label}",
            "",
            f"- ecosystem: {spec.ecosystem}; runs from `{spec.environment}`; "
            f"needs `{spec.requires}`",
            f"- launch kind: `{type(spec.launch).__name__}`; runs on {limits}",
            f"- training code: `{spec.backend}`"
            + (f"; driver `{spec.driver}`" if spec.driver else ""),
            f"- knobs it reads beyond every framework's: {knobs}",
            "- examples: "
            + ", ".join(f"`examples/{f}`" for f in (spec.example, *spec.example_files) if f)
            + (f"; on a GPT: `examples/{spec.text_example}`" if spec.text_example else ""),
        ]
        if spec.splits_model:
            lines.append("- splits the model over its ranks: runs the text models (gpt-*) only")
        if spec.compared_with:
            lines.append(f"- held against `{spec.compared_with}` in the cross-ecosystem table")
        if spec.check:
            lines.append(f"- refuses: {_refusal(spec)}")
        lines.append("")
    return "\n".join(lines)


def cli_page() -> str:
    parser, commands = build_parser()
    lines = ["# The `trainscale` command", "", GENERATED, "", "```", parser.format_help(), "```"]
    for name, command in commands.items():
        lines += ["", f"## `trainscale {name}`", "", "```", command.format_help().rstrip(), "```"]
    return "\n".join(lines) + "\n"


def _schema_rows(properties: dict, prefix: str, rows: list) -> None:
    for key, spec in properties.items():
        path = f"{prefix}{key}"
        kind = spec.get("type") or (
            "one of " + ", ".join(map(str, spec["enum"])) if "enum" in spec else ""
        )
        if isinstance(kind, list):
            kind = " or ".join(kind)
        default = f"`{spec['default']!r}`" if "default" in spec else ""
        described = _cell(spec.get("description", ""))
        rows.append(f"| `{path}` | {_cell(kind)} | {_cell(default)} | {described} |")
        if spec.get("type") == "object" and "properties" in spec:
            _schema_rows(spec["properties"], f"{path}.", rows)


def config_page() -> str:
    schema = config_schema(os.path.join(ROOT, "workflow", "schemas", "config.schema.yaml"))
    rows: list[str] = []
    _schema_rows(schema["properties"], "", rows)
    return (
        "\n".join(
            [
                "# Study configuration",
                "",
                GENERATED,
                "",
                "The keys of a study's `config.yaml` (`workflow/schemas/config.schema.yaml`, with",
                "the settings' declarations filled in). `grid:` also takes every knob of the",
                "[settings](settings.md) as an axis.",
                "",
                "| key | type | default | description |",
                "|---|---|---|---|",
                *rows,
            ]
        )
        + "\n"
    )


PAGES = {
    "reference/settings.md": settings_page,
    "reference/frameworks.md": frameworks_page,
    "reference/cli.md": cli_page,
    "reference/config.md": config_page,
}


def on_files(files, config):
    for path, make in PAGES.items():
        files.append(File.generated(config, path, content=make()))
    return files
