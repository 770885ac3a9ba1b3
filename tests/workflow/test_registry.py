"""One framework registry that everything else reads (trainscale.registry)."""

import os

import pandas as pd
from conftest import REPO, load_yaml
from test_analysis import row

from trainscale import settings, study
from trainscale.analysis import combine_repeats, efficiency_table, series_order
from trainscale.registry import FRAMEWORKS, REGISTRY, framework_spec, label, table_order
from trainscale.settings import RunSettings


def test_the_config_schema_knows_exactly_the_registered_frameworks():
    schema = load_yaml(os.path.join(REPO, "workflow/schemas/config.schema.yaml"))
    assert schema["$defs"]["framework"]["enum"] == list(FRAMEWORKS)
    # Each framework's environment is a key of the study's config.
    for spec in REGISTRY:
        assert spec.environment in schema["properties"], spec.name


def test_settings_and_grid_read_the_registry():
    assert settings.FRAMEWORKS == FRAMEWORKS
    # Knob readers: what each framework's entry lists.
    readers = {
        "precision": None,
        "xla": None,
        "horovod_compression": {"horovod"},
        "horovod_fusion_threshold_mb": {"horovod"},
        "collective_implementation": {"tf-multiworker"},
        "all_reduce_pack_mb": {"tf-multiworker"},
    }
    assert readers == study.KNOB_AXES


def test_processes_per_node_follow_each_launch():
    def processes(framework, device):
        point = RunSettings(framework=framework, gpus_per_node=4, device=device)
        return point.processes_per_node()

    assert [processes(f, "gpu") for f in FRAMEWORKS] == [1, 4, 1, 1]
    # On CPU a MultiWorker worker per replica (two replicas in one worker hung).
    assert [processes(f, "cpu") for f in FRAMEWORKS] == [1, 4, 1, 4]
    assert framework_spec("tf-single").one_device and framework_spec("tf-mirrored").one_node
    assert not framework_spec("horovod").one_node


def test_a_framework_the_registry_no_longer_has_goes_last_instead_of_failing():
    # Records outlive frameworks: efficiency_table crashed on FRAMEWORK_ORDER.index.
    tidy = pd.DataFrame([row("horovod", 1, 1, 100.0, 1.0), row("retired", 1, 1, 90.0, 1.0)]).assign(
        per_gpu_images_per_sec=0.0, achieved_tflops=None, mfu=None
    )
    tidy["speedup"], tidy["efficiency"] = 1.0, 1.0
    table = efficiency_table(combine_repeats(tidy))
    assert list(table["framework"]) == ["horovod", "retired"]
    assert table_order("retired") == len(FRAMEWORKS) and label("retired") == "retired"
    assert series_order("retired") > series_order("tf-multiworker")
    assert label("horovod") == "Horovod"
