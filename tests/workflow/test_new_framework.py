"""A framework that fits a launch kind trainscale has is its registry entry,
its module, its example and its tests, and nothing else: a throwaway one,
`torch-ddp-again` (DDP under another name), added to a copy of the
repository, is taken by the command line and the study schema, trains for
real, plans as a study's train job, has a colour of its own, is in the
reference pages and is measured by the refactoring analysis, with no other
file touched."""

import json
import os
import shutil
import subprocess

import pytest
from conftest import REPO, copy_repository, local_study, snakemake, train_jobs

NAME = "torch-ddp-again"
ENTRY_EXAMPLE = "torch_ddp_again.py"
ENTRY = """    FrameworkSpec(
        "torch-ddp-again",
        "PyTorch DDP again",
        "torch",
        "torch_env",
        TORCHRUN,
        backend="trainscale.frameworks.torch.torch_ddp_again:DistributedDataParallelAgain",
        requires="torch",
        example="torch_ddp_again.py",
        knobs=DDP_KNOBS,
        traffic=ddp_traffic,
    ),
"""
MODULE = '''"""torch-ddp-again: torch-ddp under another name (a test's throwaway)."""

from trainscale.frameworks.torch.torch_ddp import DistributedDataParallel


class DistributedDataParallelAgain(DistributedDataParallel):
    pass
'''
# What the copy asks of its own code (the analysis environment's Python).
CHECKS = """
import json, sys
sys.path.insert(0, "tools")
from docs_reference import frameworks_page
from trainscale.analysis.plotting import framework_style
from trainscale.analysis.refactoring import measure
from trainscale.cli import build_parser
from trainscale.launching.examples import examples_of
from trainscale.catalogue.registry import FRAMEWORKS
from trainscale.study.schema import config_schema
styles = {f: str(framework_style(f)) for f in FRAMEWORKS}
schema = json.dumps(config_schema("workflow/schemas/config.schema.yaml"))
again, ddp = (measure(examples_of(f)[0], "examples") for f in ("torch-ddp-again", "torch-ddp"))
print(json.dumps({
    "own_style": list(styles.values()).count(styles["torch-ddp-again"]) == 1,
    "in_schema": '"torch-ddp-again"' in schema,
    "in_reference": "PyTorch DDP again" in frameworks_page(),
    "in_help": "torch-ddp-again" in build_parser()[1]["run"].format_help(),
    "lines_touched": [again.lines_touched, ddp.lines_touched],
}))
"""


def add_the_framework(repo: str) -> None:
    """The three things a framework is: its entry, its module, its example."""
    registry = os.path.join(repo, "src", "trainscale", "catalogue", "registry.py")
    with open(registry) as handle:
        text = handle.read()
    # The closing parenthesis of the custom loops' entries (the high-level
    # APIs' are appended after them, from trainscale.catalogue.high_level).
    end = text.index("\n)\n# The high-level APIs' frameworks")
    with open(registry, "w") as handle:
        handle.write(text[: end + 1] + ENTRY + text[end + 1 :])
    module = os.path.join(repo, "src", "trainscale", "frameworks", "torch", "torch_ddp_again.py")
    with open(module, "w") as handle:
        handle.write(MODULE)
    examples = os.path.join(repo, "examples")
    shutil.copy(os.path.join(examples, "torch_ddp.py"), os.path.join(examples, ENTRY_EXAMPLE))


@pytest.mark.slow
def test_a_new_framework_is_its_entry_its_module_and_its_example(tmp_path):
    """A real 2-replica run of the new framework, and a dry run of a study of it."""
    repo = copy_repository(str(tmp_path / "repo"))
    shutil.copytree(os.path.join(REPO, "tools"), os.path.join(repo, "tools"))  # the docs' hooks
    add_the_framework(repo)
    env = {**os.environ, "PYTHONPATH": os.path.join(repo, "src")}  # the copy's code

    checks = subprocess.run(
        [os.path.join(REPO, ".venv", "bin", "python"), "-c", CHECKS],
        cwd=repo, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    found = json.loads(checks.stdout)
    assert found["own_style"] and found["in_schema"], found
    assert found["in_reference"] and found["in_help"], found
    # Against torch-single, its example (torch-ddp's, line for line) changes what DDP's does.
    again, ddp = found["lines_touched"]
    assert again == ddp > 0

    record = tmp_path / "record.json"
    run = subprocess.run(
        [os.path.join(REPO, ".venv-torch", "bin", "python"), "-m", "trainscale", "run",
         "--framework", NAME, "--gpus-per-node", "2", "--model", "small_cnn",
         "--dataset", "synthetic", "--image-size", "32", "--device", "cpu",
         "--batch-size", "8", "--warmup-steps", "1", "--blocks", "2",
         "--steps-per-block", "1", "--output", str(record)],
        cwd=repo, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    written = json.loads(record.read_text())
    assert (written["framework"], written["status"], written["processes"]) == (NAME, "ok", 2)

    study = {
        "study": "new-framework",
        "reference": None,
        "grid": {"framework": [NAME], "nodes": [1], "gpus_per_node": [2],
                 "model": ["small_cnn"], "batch_size": [8]},
        "benchmark": {"dataset": "synthetic", "image_size": 32, "device": "cpu"},
    }  # fmt: skip
    dry = snakemake(repo, "-n", *local_study(repo, study))
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert train_jobs(dry.stdout + dry.stderr) == 1
