"""The refactoring table and a side-by-side diff per framework, written from
trainscale.analysis.refactoring's measurements (the rule refactoring.smk runs
write_refactoring).
"""

from __future__ import annotations

import difflib
import html
import os

from trainscale.analysis.outputs import REFACTORING, REFACTORING_HIGH_LEVEL, TABLE_FORMATS
from trainscale.analysis.refactoring import Refactoring, measure, read_text
from trainscale.catalogue.registry import framework_spec, label, table_order
from trainscale.launching.examples import EXAMPLES_DIR, WORKLOADS, Example, examples_of


def refactoring_frame(measured: list[Refactoring]):
    import pandas as pd

    rows = [
        {
            "framework": m.framework,
            "label": label(m.framework),
            "workload": WORKLOADS[m.workload][1],
            "base": m.base,
            "base_lines": m.base_lines,
            "lines": m.lines,
            "added": m.added,
            "removed": m.removed,
            "changed": m.changed,
            "lines_touched": m.lines_touched,
            "base_share_touched": m.base_share_touched,
            "api_names_introduced": len(m.api_names),
            "concepts_count": len(m.concepts),
            "concepts": "; ".join(m.concepts),
            "api_names": "; ".join(m.api_names),
            "launch_one_node": m.launch_one_node,
            "launch_two_nodes": m.launch_two_nodes,
            "stand_in_lines": m.stand_in_lines,
        }
        for m in sorted(
            measured, key=lambda m: (list(WORKLOADS).index(m.workload), table_order(m.framework))
        )  # fmt: skip
    ]
    return pd.DataFrame(rows)


DISPLAY = {
    "label": "Framework",
    "workload": "Workload",
    "base": "Base",
    "lines": "Code lines",
    "added": "Added",
    "removed": "Removed",
    "changed": "Changed",
    "lines_touched": "Lines touched",
    "base_share_touched": "Base touched",
    "api_names_introduced": "New API names",
    "concepts": "Concepts to learn",
    "launch_one_node": "Launch, 1 node x 4 GPUs",
    "launch_two_nodes": "Launch, 2 nodes x 4 GPUs",
}


# Measured of each example of a pair, the high-level API's and the loop's.
PAIRED = ("base_lines", "lines_touched", "api_names_introduced", "concepts_count", "concepts")


def high_level_frame(table):
    """Seed 000's contrast: each high-level API's example (Keras fit) beside
    the custom loop's it replaces (FrameworkSpec.replaces), each against its
    own single-device base; the bases' own rows compare the two bases."""
    import pandas as pd

    measured = table.set_index(["framework", "workload"])
    rows = []
    for (framework, workload), row in measured.iterrows():
        loop = framework_spec(framework).replaces
        if not loop or (loop, workload) not in measured.index:
            continue
        other = measured.loc[(loop, workload)]
        rows.append(
            {
                "label": row["label"],
                "workload": workload,
                "loop": label(loop),
                **{f"loop_{name}": other[name] for name in PAIRED},
                **{name: row[name] for name in PAIRED},
            }
        )
    if not rows:
        return pd.DataFrame({"note": ["no framework of the study replaces a custom loop"]})
    return pd.DataFrame(rows)


HIGH_LEVEL_DISPLAY = {
    "label": "High-level API",
    "workload": "Workload",
    "loop": "Custom loop it replaces",
    "loop_base_lines": "Loop: base's code lines",
    "loop_lines_touched": "Loop: lines touched",
    "loop_api_names_introduced": "Loop: new API names",
    "loop_concepts": "Loop: concepts to learn",
    "base_lines": "High-level: base's code lines",
    "lines_touched": "High-level: lines touched",
    "api_names_introduced": "High-level: new API names",
    "concepts": "High-level: concepts to learn",
}


def side_by_side_diff(example: Example, examples_dir: str = EXAMPLES_DIR) -> str:
    """An HTML page: the base and the example side by side, changes marked."""
    old = read_text(example.base.path(examples_dir)).splitlines()
    new = read_text(example.path(examples_dir)).splitlines()
    for name in framework_spec(example.framework).example_files:  # after the script, all added
        new += [
            "",
            f"# ---- {name} ----",
            *read_text(os.path.join(examples_dir, name)).splitlines(),
        ]
    script, base_script = example.script, example.base.script
    title = f"{label(example.framework)}: {script} against {base_script}"
    page = difflib.HtmlDiff(wrapcolumn=90).make_file(
        old,
        new,
        fromdesc=html.escape(base_script),
        todesc=html.escape(script),
        context=False,
    )
    return page.replace("<title></title>", f"<title>{html.escape(title)}</title>")


def write_refactoring(
    frameworks: list[str], folder: str, examples_dir: str = EXAMPLES_DIR, diff_folder: str = ""
) -> list[str]:
    """refactoring.csv, .md and .tex in `folder`, and {example}.html (the
    side-by-side diff) in `diff_folder` (default: `folder`/refactoring) for
    every example of `frameworks` that is not a base. Returns the paths written."""
    from trainscale.analysis.rendering import write_table
    from trainscale.core.records import atomic_write_text

    examples = [example for f in frameworks for example in examples_of(f)]
    measured = [measure(example, examples_dir) for example in examples]
    table = refactoring_frame(measured)
    shown = table[list(DISPLAY)].rename(columns=DISPLAY)
    shown["Base touched"] = [f"{share:.0%}" for share in table["base_share_touched"]]
    write_table(
        shown,
        folder,
        REFACTORING,
        "Code refactoring: each framework's example against its single-device base for "
        "the same workload "
        "(code lines: no comments, docstrings or blank lines)",
        # The CSV keeps every measured column, numbers unrounded.
        data=table,
    )
    # The custom loops the high-level APIs replace, for the contrast alone.
    loops = {framework_spec(f).replaces for f in frameworks} - set(frameworks) - {""}
    loop_examples = [example for f in sorted(loops) for example in examples_of(f)]
    measured += [measure(example, examples_dir) for example in loop_examples]
    contrast = high_level_frame(refactoring_frame(measured))
    if "note" not in contrast:  # else the note, as it is
        contrast = contrast[list(HIGH_LEVEL_DISPLAY)].rename(columns=HIGH_LEVEL_DISPLAY)
    write_table(
        contrast,
        folder,
        REFACTORING_HIGH_LEVEL,
        "What a distributed step costs written as a custom loop and with a high-level "
        "API: each example against its own single-device base",
    )
    paths = [
        os.path.join(folder, f"{name}.{ext}")
        for name in (REFACTORING, REFACTORING_HIGH_LEVEL)
        for ext in TABLE_FORMATS
    ]
    diff_folder = diff_folder or os.path.join(folder, REFACTORING)
    for example in examples:
        if not example.is_base:
            path = os.path.join(diff_folder, f"{example.name}.html")
            atomic_write_text(path, side_by_side_diff(example, examples_dir))
            paths.append(path)
    return paths
