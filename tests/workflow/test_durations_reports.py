"""Every test that a committed per-test time report (bench/test-durations/)
shows at a minute or more says in its docstring why it needs that long.

The reports are `pytest --durations` lines ("12.34s call  tests/x.py::test_y[id]"),
some commented out with "# ". A minute in any report counts, however slow its
machine: the slowest machine seen is the one a newcomer may have. A test the
tree no longer has (renamed, folded into another) is history, not checked.
"""

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REPORTS = REPO / "bench" / "test-durations"
LONG_SECONDS = 60
DURATION = re.compile(r"^(?:# )?\s*([\d.]+)s (?:call|setup|teardown)\s+(\S+?\.py)::(\w+)", re.M)


def long_tests(text: str, at_least: float = LONG_SECONDS) -> dict[tuple[str, str], float]:
    """(file, test function) -> its longest phase in one report's text, for
    each at `at_least` seconds or more (a parametrised test's cases as one)."""
    found: dict[tuple[str, str], float] = {}
    for seconds, path, name in DURATION.findall(text):
        if float(seconds) >= at_least:
            found[path, name] = max(found.get((path, name), 0.0), float(seconds))
    return found


def docstrings(path: Path) -> dict[str, str | None]:
    """Each test function of a test file: its docstring, or None."""
    tree = ast.parse(path.read_text())
    return {
        node.name: ast.get_docstring(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    }


def test_the_report_reader_finds_the_long_tests_of_a_report():
    text = (
        "# 61.50s call     tests/a.py::test_slow[x]\n"
        "60.00s setup    tests/a.py::test_slow[y]\n"
        "59.99s call     tests/a.py::test_quick\n"
        "72.10s teardown tests/b/c.py::test_lab@slurm-lab\n"
        "=== 3 passed in 200.00s ===\n"
    )
    expected = {("tests/a.py", "test_slow"): 61.5, ("tests/b/c.py", "test_lab"): 72.1}
    assert long_tests(text) == expected


def test_every_test_a_report_shows_over_a_minute_says_why_in_its_docstring():
    reports = sorted(REPORTS.glob("*.txt"))
    assert len(reports) > 10, REPORTS  # the reports are there to read
    longest: dict[tuple[str, str], tuple[float, str]] = {}
    for report in reports:
        for key, seconds in long_tests(report.read_text()).items():
            if seconds > longest.get(key, (0.0, ""))[0]:
                longest[key] = (seconds, report.name)
    assert longest, "no report shows a test of a minute or more"
    files = {path for path, _ in longest if (REPO / path).exists()}
    docs = {path: docstrings(REPO / path) for path in files}  # each file parsed once
    silent = [
        f"{path}::{name} ({seconds:.0f} s in {report})"
        for (path, name), (seconds, report) in sorted(longest.items())
        if path in docs and name in docs[path] and docs[path][name] is None
    ]
    assert not silent, "no docstring says why these take over a minute:\n" + "\n".join(silent)
