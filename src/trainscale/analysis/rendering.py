"""Rendering tables: CSV holds the numbers; Markdown and LaTeX show "mean ± std"."""

from __future__ import annotations

import math
import os

import pandas as pd


def decimals(mean: float, std: float) -> int:
    """Decimals that show a spread's two leading digits (267.047 -> 0 decimals,
    0.0213 -> 4), or three significant digits of a number with no spread."""
    if not pd.isna(std) and std > 0:
        return max(0, 1 - math.floor(math.log10(std)))
    if mean == 0 or pd.isna(mean):
        return 0
    return max(0, 2 - math.floor(math.log10(abs(mean))))


def _cell(mean, std, status=None) -> str:
    if mean is None or pd.isna(mean):
        # No number: say why (OOM, TIMEOUT, FAILED), or nothing outside the grid.
        return status.upper() if isinstance(status, str) and status != "ok" else ""
    places = decimals(mean, std)
    return f"{mean:.{places}f} ± {std:.{places}f}" if not pd.isna(std) else f"{mean:.{places}f}"


def display_frame(table: pd.DataFrame, labels: dict[str, str] | None = None) -> pd.DataFrame:
    """Fold every `<x>_mean`/`<x>_std` pair into one "mean ± std" column."""
    labels = labels or {}
    shown = {}
    for column in table.columns:
        if column.endswith(("_std", "_status")) and (
            column.rsplit("_", 1)[0] + "_mean" in table.columns
        ):
            continue
        if column.endswith("_mean") and column[:-5] + "_std" in table.columns:
            stem = column[:-5]
            statuses = table.get(stem + "_status", pd.Series([None] * len(table)))
            shown[labels.get(stem, stem)] = [
                _cell(m, s, st)
                for m, s, st in zip(table[column], table[stem + "_std"], statuses, strict=True)
            ]
        elif pd.api.types.is_float_dtype(table[column]):
            # A column of whole numbers (epochs, say) that NaN made float.
            whole = (table[column].dropna() % 1 == 0).all()
            shown[labels.get(column, column)] = [
                "" if pd.isna(v) else f"{v:.0f}" if whole else f"{v:.{decimals(v, math.nan)}f}"
                for v in table[column]
            ]
        else:
            shown[labels.get(column, column)] = [str(v) for v in table[column]]
    return pd.DataFrame(shown)


def to_markdown(shown: pd.DataFrame, caption: str) -> str:
    header = "| " + " | ".join(shown.columns) + " |"
    rule = "|" + "|".join("---:" for _ in shown.columns) + "|"
    rows = ["| " + " | ".join(row) + " |" for row in shown.astype(str).to_numpy().tolist()]
    return f"**{caption}**\n\n" + "\n".join([header, rule, *rows]) + "\n"


_LATEX_SPECIAL = str.maketrans({"&": r"\&", "%": r"\%", "_": r"\_", "#": r"\#", "±": r"$\pm$"})


def to_latex(shown: pd.DataFrame, caption: str) -> str:
    """A booktabs table (needs \\usepackage{booktabs})."""

    def escape(text):
        return str(text).translate(_LATEX_SPECIAL)

    lines = [
        r"\begin{table}[ht]",
        r"\centering",
        rf"\caption{{{escape(caption)}}}",
        r"\begin{tabular}{" + "r" * len(shown.columns) + "}",
        r"\toprule",
        " & ".join(escape(c) for c in shown.columns) + r" \\",
        r"\midrule",
        *(" & ".join(escape(v) for v in row) + r" \\" for row in shown.to_numpy().tolist()),
        r"\bottomrule",
        r"\end{tabular}",
        r"\end{table}",
    ]
    return "\n".join(lines) + "\n"


def write_table(table: pd.DataFrame, folder: str, name: str, caption: str, labels=None, data=None):
    """`name`.csv, .md and .tex in `folder`, each written atomically; the CSV
    holds `data` where given (every measured column, unrounded), else `table`."""
    shown = display_frame(table, labels)
    csv = table if data is None else data
    write_formats(folder, name, csv, to_markdown(shown, caption), to_latex(shown, caption))


def write_formats(folder: str, name: str, table: pd.DataFrame, markdown: str, latex: str):
    """A table's three files (outputs.TABLE_FORMATS): every number as CSV, and
    its Markdown and LaTeX renderings."""
    from trainscale.analysis.outputs import TABLE_FORMATS
    from trainscale.core.records import atomic_write_text

    texts = {"csv": table.to_csv(index=False), "md": markdown, "tex": latex}
    for ext in TABLE_FORMATS:
        atomic_write_text(os.path.join(folder, f"{name}.{ext}"), texts[ext])
