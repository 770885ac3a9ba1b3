"""The documentation site: built with --strict (no broken link, no missing
page), then opened in headless Chromium as a reader would. The settings
reference lists every declared setting, and the first tutorial's commands are
the ones the Makefile runs."""

import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser

import pytest
from conftest import REPO

from trainscale.catalogue.options import OPTIONS
from trainscale.catalogue.registry import REGISTRY
from trainscale.catalogue.settings import all_settings

MKDOCS = os.path.join(os.path.dirname(sys.executable), "mkdocs")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    folder = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [MKDOCS, "build", "--strict", "--site-dir", str(folder)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    return folder


def rendered(site, page: str) -> str:
    """The page's DOM after Chromium has loaded it (scripts run)."""
    assert CHROMIUM, "no Chromium (make docs-browser installs Debian's)"
    url = f"file://{site}/{page}/index.html"
    shown = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert shown.returncode == 0 and "</html>" in shown.stdout, shown.stderr[-2000:]
    return shown.stdout


class _Cells(HTMLParser):
    """Each table row's first cell, and each code block's text."""

    def __init__(self):
        super().__init__()
        self.first_cells, self.blocks = [], []
        self._cell = self._block = None
        self._column = 0

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self._column = 0
        elif tag == "td":
            self._column += 1
            self._cell = "" if self._column == 1 else None
        elif tag == "pre":
            self._block = ""

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self.first_cells.append(self._cell.strip())
            self._cell = None
        elif tag == "pre" and self._block is not None:
            self.blocks.append(self._block)
            self._block = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data
        if self._block is not None:
            self._block += data


def parsed(html: str) -> _Cells:
    cells = _Cells()
    cells.feed(html)
    return cells


def test_the_settings_reference_lists_every_declared_setting(site):
    rows = parsed(rendered(site, "reference/settings")).first_cells
    declared = [s.name for s in (*all_settings(), *OPTIONS)]
    assert sorted(rows) == sorted(declared)
    assert len(declared) > 40  # every framework's knobs among them


def test_the_frameworks_reference_has_every_registry_entry(site):
    page = rendered(site, "reference/frameworks")
    for spec in REGISTRY:
        assert f"{spec.name}</code>: {spec.label}" in page, spec.name


def commands(blocks: list[str]) -> list[str]:
    """The shell commands of a page's code blocks, comments dropped."""
    lines = (line.split("#")[0].strip() for block in blocks for line in block.splitlines())
    return [line for line in lines if line]


def makefile_recipe(target: str) -> list[str]:
    """What `make TARGET` runs, as make itself expands it (its installs left out)."""
    installs = ["train-env", "torch-env", "analysis-env", "system"]
    # --no-print-directory: under a make of its own (CI's), make says where it is.
    make = ["make", "--no-print-directory", "-n", *(f"--assume-old={i}" for i in installs)]
    dry = subprocess.run([*make, target], cwd=REPO, capture_output=True, text=True, check=True)
    return [line for line in dry.stdout.splitlines() if line and not line.startswith("echo")]


def test_the_first_tutorials_commands_are_the_ones_the_makefile_runs(site):
    shown = commands(parsed(rendered(site, "tutorials/first-study")).blocks)
    targets = [line.split()[1] for line in shown if line.startswith("make ")]
    assert targets[:1] == ["demo"] and "demo-accuracy" in targets
    with open(os.path.join(REPO, "Makefile")) as handle:
        defined = set(re.findall(r"^([a-z][a-z-]*):", handle.read(), re.M))
    assert set(targets) <= defined, set(targets) - defined
    # What `make demo` runs is what the tutorial says it runs.
    for line in makefile_recipe("demo"):
        assert line in shown, f"make demo runs {line!r}; the tutorial does not show it"
