"""The refactoring analysis (trainscale.analysis.refactoring) on the real examples, and
its parts on small scripts whose answer is known.

The examples themselves run, and train as the harness does, in
tests/harness/test_examples.py and tests/torch/test_examples.py.
"""

import os
import subprocess
import sys

import pandas as pd
import pytest

from trainscale.analysis.refactoring import (
    CONCEPTS,
    api_names,
    code_lines,
    concepts_evidenced,
    declared_concepts,
    introduced_api_names,
    line_changes,
    measure,
    stand_in_free,
)
from trainscale.analysis.refactoring_report import write_refactoring
from trainscale.catalogue.registry import FRAMEWORKS, REGISTRY, base_of, framework_spec
from trainscale.launching.examples import (
    EXAMPLES_DIR,
    WORKLOADS,
    Example,
    example_path,
    examples_of,
    user_launch,
)

EXAMPLES = [example for framework in FRAMEWORKS for example in examples_of(framework)]
IDS = [example.name for example in EXAMPLES]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_registered_framework_has_its_example(framework):
    examples = examples_of(framework)
    assert examples, f"{framework} has no example: add examples/<script>.py and its registry entry"
    for example in examples:
        assert os.path.isfile(example.path()), f"{framework}: no {example.script} in examples/"
        assert example.base.script, f"{example.base.framework} has no {example.workload} example"


@pytest.mark.parametrize("example", EXAMPLES, ids=IDS)
def test_each_example_declares_exactly_the_concepts_its_code_uses(example):
    measured = measure(example)
    assert set(measured.concepts) == concepts_evidenced(set(measured.api_names)), example.name


def test_a_base_is_its_own_base_and_changes_nothing():
    for spec in REGISTRY:
        base = base_of(spec.name)
        assert framework_spec(base).one_device
        assert framework_spec(base).ecosystem == spec.ecosystem
    for base in ("tf-single", "torch-single"):
        for example in examples_of(base):
            measured = measure(example)
            assert (measured.added, measured.removed, measured.changed) == (0, 0, 0)
            assert measured.api_names == () and measured.concepts == ()
            assert measured.lines == measured.base_lines > 50


def test_the_papers_ordering_horovod_changes_less_than_mirroredstrategy():
    # Seed 000, section III: Horovod "swap the tape, init, broadcast, shard";
    # MirroredStrategy needs more of the single-GPU code changed.
    horovod, mirrored = measure(Example("horovod")), measure(Example("tf-mirrored"))
    assert horovod.lines_touched < mirrored.lines_touched
    assert horovod.base_share_touched < mirrored.base_share_touched
    # The paper's words for what MirroredStrategy asks, as concepts.
    assert {
        "distributed dataset",
        "strategy scope",
        "global-batch loss scaling",
        "replicated step",
    } <= set(mirrored.concepts)
    assert {"gradient all-reduce", "variable broadcast", "data sharding", "process group"} <= set(
        horovod.concepts
    )


def test_multiworker_is_mirroredstrategy_plus_cluster_set_up():
    # "as simple as reassigning the strategy object", plus knowing which worker is the chief.
    mirrored, multiworker = measure(Example("tf-mirrored")), measure(Example("tf-multiworker"))
    assert multiworker.concepts == (*mirrored.concepts, "cluster set-up")

    def code(framework):
        with open(example_path(framework)) as handle:
            return code_lines(stand_in_free(handle.read())[0])

    added, removed, changed = line_changes(code("tf-mirrored"), code("tf-multiworker"))
    print(f"tf-mirrored -> tf-multiworker: +{added} -{removed} ~{changed}")
    assert added + removed + changed <= 6
    assert multiworker.lines_touched >= mirrored.lines_touched


# ---- the parts, on scripts whose answer is known -----------------------------

BASE = '''"""A base.

concepts: none
"""
import tensorflow as tf


def main():
    # a comment line, not code
    model = tf.keras.Sequential()  # a trailing comment
    optimizer = tf.keras.optimizers.SGD(0.1)

    for step in range(3):
        model.fit(step)
'''

CHANGED = '''"""Changed.

concepts: strategy scope, replicated step
"""
import tensorflow as tf


def main():
    strategy = tf.distribute.MirroredStrategy()
    with strategy.scope():
        model = tf.keras.Sequential()
        optimizer = tf.keras.optimizers.SGD(0.1)
    # >>> CPU stand-in
    devices = ["cpu"]
    # <<< CPU stand-in
    for step in range(3):
        strategy.run(model.fit, args=(step,))
'''


def test_code_lines_drop_comments_docstrings_and_blank_lines_and_keep_indentation():
    assert code_lines(BASE) == [
        "import tensorflow as tf",
        "def main():",
        "    model = tf.keras.Sequential()",
        "    optimizer = tf.keras.optimizers.SGD(0.1)",
        "    for step in range(3):",
        "        model.fit(step)",
    ]


def test_line_changes_count_a_reindented_line_as_changed():
    source, stand_in = stand_in_free(CHANGED)
    assert stand_in == 3 and "devices" not in source
    # +strategy, +with: added; model/optimizer re-indented and the loop body: changed.
    assert line_changes(code_lines(BASE), code_lines(source)) == (2, 0, 3)


def test_api_names_are_the_framework_names_as_written():
    assert introduced_api_names(BASE, CHANGED) == {
        "tf.distribute.MirroredStrategy",
        "strategy.scope",
        "strategy.run",
    }
    snippet = (
        "import horovod.torch as hvd\nimport os\nfrom torch.nn.parallel import "
        "DistributedDataParallel\nmodel = DistributedDataParallel(m)\nhvd.init()\n"
        "x = os.environ.get('A')\nopt = hvd.DistributedOptimizer(o)\nopt.step()\n"
    )
    assert api_names(snippet) == {
        "DistributedDataParallel",
        "hvd.init",
        "hvd.DistributedOptimizer",
        "opt.step",
    }
    assert concepts_evidenced({"hvd.init", "opt.step"}) == {"process group"}


def test_declared_concepts_come_from_the_fixed_vocabulary():
    assert declared_concepts(CHANGED) == ("strategy scope", "replicated step")
    assert declared_concepts(BASE) == ()
    with pytest.raises(ValueError, match="unknown concept"):
        declared_concepts('"""x\n\nconcepts: telepathy\n"""\n')
    with pytest.raises(ValueError, match="declares no"):
        declared_concepts('"""x"""\n')
    assert "telepathy" not in CONCEPTS


def test_each_launch_has_its_commands_and_one_node_frameworks_no_multi_node_one():
    for example in EXAMPLES:
        one_node, two_nodes = user_launch(example)
        assert example.script in one_node
        assert bool(two_nodes) == (not framework_spec(example.framework).one_node), example.name
    assert user_launch(Example("torch-ddp"))[1].startswith("torchrun --nnodes=2")
    assert "-H node1:4,node2:4" in user_launch(Example("horovod"))[1]


def test_the_command_writes_the_table_and_a_diff_per_framework(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "trainscale", "refactoring", "--output-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    table = pd.read_csv(tmp_path / "refactoring.csv")
    # The image examples in table order, then the text ones.
    assert list(zip(table["framework"], table["workload"])) == [
        (e.framework, WORKLOADS[e.workload][1])
        for e in sorted(EXAMPLES, key=lambda e: list(WORKLOADS).index(e.workload))
    ]
    touched = table["added"] + table["removed"] + table["changed"]
    assert (table["lines_touched"] == touched).all()
    markdown = (tmp_path / "refactoring.md").read_text()
    assert "| Horovod | VGG-16 on CIFAR-100 | tf-single |" in markdown
    for example in EXAMPLES:
        diff = tmp_path / "refactoring" / f"{example.name}.html"
        assert diff.exists() == (not example.is_base)
    page = (tmp_path / "refactoring" / "torch-ddp.html").read_text()
    assert "torch_single.py" in page and "torch_ddp.py" in page
    assert "DistributedDataParallel" in page
    page = (tmp_path / "refactoring" / "torch-pipeline-text.html").read_text()
    assert "torch_gpt_single.py" in page and "PipelineStage" in page


def test_model_parallelism_changes_more_of_a_gpt_script_than_data_parallelism():
    # The same GPT script, changed for DDP, for a pipeline, for tensor parallelism.
    ddp, pipeline, tensor = (
        measure(Example(f, "text")) for f in ("torch-ddp", "torch-pipeline", "torch-tp")
    )
    # Measured: 62 and 52 lines touched against DDP's 28. A pipeline needs
    # fewer concepts than DDP (no sharded data, no all-reduce) but other ones.
    for parallel in (pipeline, tensor):
        assert parallel.lines_touched > 1.5 * ddp.lines_touched
    assert {"pipeline stages", "microbatch schedule"} <= set(pipeline.concepts)
    assert {"device mesh", "layer sharding plan"} <= set(tensor.concepts)


def test_a_missing_example_is_one_line_naming_it(tmp_path):
    (tmp_path / "tf_single.py").write_text(BASE)
    with pytest.raises(ValueError, match="horovod's example .*tf_horovod.py"):
        write_refactoring(["horovod"], str(tmp_path / "out"), examples_dir=str(tmp_path))
    assert EXAMPLES_DIR.endswith("examples")
