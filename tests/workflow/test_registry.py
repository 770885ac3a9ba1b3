"""One framework registry that everything else reads (trainscale.registry)."""

import os

import pandas as pd
from conftest import REPO, load_yaml
from test_analysis import row

from trainscale import settings, study
from trainscale.registry import FRAMEWORKS, REGISTRY, framework_spec, label, table_order
from trainscale.settings import RunSettings
from trainscale.tables import cross_ecosystem_table, efficiency_table
from trainscale.tidy import combine_repeats, series_order


def test_the_config_schema_knows_exactly_the_registered_frameworks():
    schema = load_yaml(os.path.join(REPO, "workflow/schemas/config.schema.yaml"))
    assert schema["$defs"]["framework"]["enum"] == list(FRAMEWORKS)
    # Each framework's environment is a key of the study's config.
    for spec in REGISTRY:
        assert spec.environment in schema["properties"], spec.name


def test_settings_and_grid_read_the_registry():
    assert settings.FRAMEWORKS == FRAMEWORKS
    # Knob readers: what each framework's entry lists.
    tensorflow = {"tf-single", "horovod", "tf-mirrored", "tf-multiworker"}
    torch = {"torch-single", "torch-ddp", "horovod-torch"}
    readers = {
        "precision": None,
        "xla": tensorflow,
        "horovod_compression": {"horovod", "horovod-torch"},
        "horovod_fusion_threshold_mb": {"horovod", "horovod-torch"},
        "collective_implementation": {"tf-multiworker"},
        "all_reduce_pack_mb": {"tf-multiworker"},
        "compile": torch,
        "channels_last": torch,
        "ddp_bucket_cap_mb": {"torch-ddp"},
        "ddp_compression": {"torch-ddp"},
    }
    assert readers == study.KNOB_AXES


def test_processes_per_node_follow_each_launch():
    def processes(framework, device):
        point = RunSettings(framework=framework, gpus_per_node=4, device=device)
        return point.processes_per_node()

    assert [processes(f, "gpu") for f in FRAMEWORKS] == [1, 4, 1, 1, 1, 4, 4]
    # On CPU a MultiWorker worker per replica (two replicas in one worker hung).
    assert [processes(f, "cpu") for f in FRAMEWORKS] == [1, 4, 1, 4, 1, 4, 4]
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


def _combined(rows):
    tidy = pd.DataFrame(rows).assign(per_gpu_images_per_sec=0.0, achieved_tflops=None, mfu=None)
    return combine_repeats(tidy)


def test_each_torch_framework_is_held_against_its_tensorflow_counterpart():
    combined = _combined(
        [
            row("horovod", 1, 1, 100.0, 1.0),
            row("horovod", 1, 2, 180.0, 2.0),
            row("torch-ddp", 1, 1, 120.0, 1.0),
            row("torch-ddp", 1, 2, 198.0, 2.0),
            row("horovod-torch", 1, 2, 171.0, 2.0),
            row("tf-mirrored", 1, 2, 190.0, 2.0),  # no torch twin: not in the table
        ]
    )
    table = cross_ecosystem_table(combined).set_index(["framework", "gpus"])
    assert set(table.index) == {("PyTorch DDP", 1), ("PyTorch DDP", 2), ("Horovod (PyTorch)", 2)}
    assert (table["versus"] == "Horovod").all()
    assert table.loc[("PyTorch DDP", 2), "ratio"] == 198.0 / 180.0
    assert table.loc[("Horovod (PyTorch)", 2), "ratio"] == 171.0 / 180.0
    # Each against its own 1-GPU run: DDP 198 / (2 x 120), Horovod-TF 180 / (2 x 100).
    assert table.loc[("PyTorch DDP", 2), "efficiency"] == 198.0 / 240.0
    assert table.loc[("PyTorch DDP", 2), "versus_efficiency"] == 180.0 / 200.0
    assert "shared_knobs" not in table and "panel_knobs" not in table


def test_cross_ecosystem_pairs_match_the_knobs_both_read_and_the_precision():
    fp16 = "horovod_compression=fp16,precision=fp16"
    fp32 = "horovod_compression=none,precision=fp32"
    combined = _combined(
        [
            row("horovod", 1, 2, 180.0, 2.0, knobs=fp16),
            row("horovod", 1, 2, 150.0, 2.0, knobs=fp32),
            row("horovod-torch", 1, 2, 160.0, 2.0, knobs=fp16),
            row("horovod-torch", 1, 2, 140.0, 2.0, knobs=fp32),
        ]
    )
    table = cross_ecosystem_table(combined)
    assert len(table) == 2
    ratios = dict(zip(table["panel_knobs"], table["ratio"], strict=True))
    assert ratios == {"precision=fp16": 160.0 / 180.0, "precision=fp32": 140.0 / 150.0}
