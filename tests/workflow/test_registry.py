"""One framework registry that everything else reads (trainscale.catalogue.registry), and
settings declared once (trainscale.core.setting): what a new framework or knob
touches, checked."""

import dataclasses
import os
import re

import pandas as pd
import pytest
from conftest import REPO
from test_analysis import row

from trainscale.analysis.repeats import combine_repeats
from trainscale.analysis.tables import cross_ecosystem_table, efficiency_table
from trainscale.analysis.tidy import series_order
from trainscale.catalogue import settings
from trainscale.catalogue.registry import FRAMEWORKS, REGISTRY, framework_spec, label, table_order
from trainscale.catalogue.settings import RunSettings, SettingsError, validate
from trainscale.study.schema import config_schema

# The source a knob may be named in (tests, docs and study configs aside).
SOURCE = ["src", "workflow", "Snakefile", "bench", "tools", "Makefile"]


def _source_files():
    for entry in SOURCE:
        path = os.path.join(REPO, entry)
        if os.path.isfile(path):
            yield path
            continue
        for folder, _, names in os.walk(path):
            for name in names:
                if name.endswith((".py", ".smk", ".yaml", ".sh")):
                    yield os.path.join(folder, name)


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def _framework_knobs():
    return [s for s in settings.all_settings() if s not in settings.SETTINGS]


@pytest.mark.parametrize("knob", [s.name for s in _framework_knobs()])
def test_a_knob_is_named_in_its_declaration_and_its_reader_only(knob):
    # The seam's promise: a framework's knob is declared once (its registry
    # entry or launch kind) and read once (its framework's module); the CLI,
    # the checks and the study schema are made from the declaration.
    named = re.compile(rf"\b{knob}\b")
    files = sorted(
        os.path.relpath(path, REPO) for path in _source_files() if named.search(_read(path))
    )
    assert len(files) <= 2, files


def test_every_knob_a_framework_declares_is_read_by_exactly_its_frameworks():
    for setting in _framework_knobs():
        declared = {
            spec.name for spec in REGISTRY if setting in (*spec.knobs, *spec.launch.settings)
        }
        assert settings.readers(setting.name) == declared, setting.name
    # Ecosystem settings are read by every framework of the ecosystem.
    torch = {spec.name for spec in REGISTRY if spec.ecosystem == "torch"}
    assert settings.readers("compile") == torch
    assert settings.readers("precision") is None


def test_a_declared_check_refuses_in_one_line_naming_the_flag():
    with pytest.raises(SettingsError, match="^--collective-implementation nccl needs --device"):
        validate(RunSettings(framework="tf-multiworker", device="cpu",
                             collective_implementation="nccl", dataset="synthetic"))  # fmt: skip
    with pytest.raises(SettingsError, match="^--ddp-compression 'gzip' is unknown; choose one of"):
        validate(RunSettings(framework="torch-ddp", ddp_compression="gzip", dataset="synthetic"))
    # A framework's own refusals, from its entry.
    with pytest.raises(SettingsError, match="^--framework deepspeed: --precision fp16: DeepSpeed"):
        validate(RunSettings(framework="deepspeed", precision="fp16", device="cpu",
                             dataset="synthetic"))  # fmt: skip
    with pytest.raises(SettingsError, match="^--framework torch-fsdp: --channels-last: FSDP2"):
        validate(RunSettings(framework="torch-fsdp", channels_last=True, dataset="synthetic"))
    on_gpu = RunSettings(framework="deepspeed", precision="fp16", device="gpu", dataset="synthetic")
    assert validate(on_gpu) is on_gpu


def test_a_pipeline_is_refused_what_torch_would_raise_in_every_rank():
    def pipeline(**knobs):
        return RunSettings(framework="torch-pipeline", model="gpt-mini", gpus_per_node=4,
                           batch_size=2, dataset="synthetic", **knobs)  # fmt: skip

    # 1F1B needs a microbatch per stage (torch's Schedule1F1B raises otherwise).
    with pytest.raises(SettingsError, match="^--framework torch-pipeline: --pipeline-microba"
                       r"tches 2: 1F1B needs one per stage at least \(4 stages\)"):  # fmt: skip
        validate(pipeline(pipeline_microbatches=2))
    validate(pipeline(pipeline_microbatches=2, pipeline_schedule="gpipe"))
    # 0: one per stage, which splits the global batch of 8 here...
    validate(pipeline(pipeline_microbatches=0))
    # ...and 3 does not.
    with pytest.raises(SettingsError, match="--pipeline-microbatches 3 does not split a pipeline"):
        validate(pipeline(pipeline_microbatches=3, pipeline_schedule="gpipe"))
    with pytest.raises(SettingsError, match="8 stages, but gpt-mini has 4 blocks to split"):
        validate(dataclasses.replace(pipeline(), gpus_per_node=8))
    # Two pipelines of 2 stages (PP x DP): each cuts its half of the batch,
    # 4 sequences, and 1F1B needs 2 microbatches, not 4.
    validate(pipeline(pipeline_stages=2, pipeline_microbatches=2))
    with pytest.raises(SettingsError, match="--pipeline-microbatches 8 does not split a pipeline's"
                       " batch of 4"):  # fmt: skip
        validate(pipeline(pipeline_stages=2, pipeline_microbatches=8))
    with pytest.raises(SettingsError, match="--pipeline-stages 3 does not divide the 4 ranks"):
        validate(pipeline(pipeline_stages=3))


# The study config's keys that name a training environment (the schema's).
SCHEMA = config_schema(os.path.join(REPO, "workflow", "schemas", "config.schema.yaml"))
ENVIRONMENT_KEYS = [key for key in SCHEMA["properties"] if key.endswith("_env")]


@pytest.mark.parametrize("spec", REGISTRY, ids=FRAMEWORKS)
def test_each_entry_names_what_exists(spec):
    # Its example, the files beside it, and its environment's config key.
    examples = os.path.join(REPO, "examples")
    for name in filter(None, (spec.example, spec.text_example, *spec.example_files)):
        assert os.path.isfile(os.path.join(examples, name)), name
    # Its environment: a key of the study config, with a conda file of its own.
    assert spec.environment.endswith("_env") and spec.environment in ENVIRONMENT_KEYS
    conda = os.path.join(REPO, "envs", f"{spec.environment.removesuffix('_env')}.yaml")
    assert os.path.isfile(conda), conda
    assert spec.compared_with in ("", *FRAMEWORKS)
    # What one step moves is said for every configuration the defaults make.
    moved = spec.traffic(RunSettings(framework=spec.name).to_dict())
    assert moved.passes >= 0 and moved.bytes_per_element in (2, 4)


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
    assert framework_spec("tf-single").one_device and framework_spec("tf-mirrored").one_node


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
    fp16 = "horovod_compression=fp16+precision=fp16"
    fp32 = "horovod_compression=none+precision=fp32"
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
