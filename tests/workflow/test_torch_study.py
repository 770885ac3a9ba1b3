"""Both ecosystems in one local study, through Snakemake, for real on the CPU.

Each train job runs from the environment its framework's registry entry
names (.venv-train or .venv-torch); the tables put the torch frameworks
beside the TensorFlow ones, and each beside its TensorFlow counterpart.
"""

import json
import os

import pandas as pd
import pytest
from conftest import copy_repository, local_study, snakemake
from test_local_study import study_variant

# test_local_study's tiny CPU study (its benchmark settings, a data folder of
# its own), with Horovod beside the two torch frameworks that mirror it.
STUDY = study_variant(
    "two-ecosystems",
    grid={"framework": ["horovod", "torch-ddp", "horovod-torch"]},
    torch_env=".venv-torch",
)
TORCH = {"torch-ddp", "horovod-torch"}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    repo = copy_repository(str(tmp_path_factory.mktemp("torch") / "repo"))
    result = snakemake(repo, *local_study(repo, STUDY), timeout=1200)
    assert result.returncode == 0, result.stderr[-4000:]
    return os.path.join(repo, "results", "two-ecosystems")


@pytest.mark.slow
def test_each_framework_trains_from_its_own_environment(study):
    tidy = pd.read_csv(os.path.join(study, "throughput.csv"))
    assert len(tidy) == 6 and set(tidy["status"]) == {"ok"}
    repo = os.path.dirname(os.path.dirname(study))
    for path in tidy["record"]:
        with open(os.path.join(repo, path)) as handle:
            record = json.load(handle)
        provenance = record["provenance"]
        if record["framework"] in TORCH:
            assert provenance["torch"].startswith("2.13.0") and "tensorflow" not in provenance
        else:
            assert provenance["tensorflow"] == "2.15.1" and "torch" not in provenance
        assert len(provenance["processes"]) == record["processes"]


@pytest.mark.slow
def test_the_tables_put_the_ecosystems_side_by_side(study):
    with open(os.path.join(study, "tables", "table1.md")) as handle:
        table1 = handle.read()
    for label in ("Horovod", "PyTorch DDP", "Horovod (PyTorch)"):
        assert f"| {label} (images/sec) |" in table1
    cross = pd.read_csv(os.path.join(study, "tables", "cross_ecosystem.csv"))
    pairs = set(zip(cross["framework"], cross["versus"], cross["gpus"], strict=True))
    assert pairs == {
        ("PyTorch DDP", "Horovod", 1),
        ("PyTorch DDP", "Horovod", 2),
        ("Horovod (PyTorch)", "Horovod", 1),
        ("Horovod (PyTorch)", "Horovod", 2),
    }
    ratio = cross["framework_images_per_sec_mean"] / cross["versus_images_per_sec_mean"]
    assert cross["ratio"].to_numpy() == pytest.approx(ratio.to_numpy()) and (ratio > 0).all()
    efficiency = pd.read_csv(os.path.join(study, "tables", "efficiency.csv"))
    one_gpu = efficiency[efficiency["gpus"] == 1]
    # Speed-up against each framework's own 1-GPU run, torch ones too.
    assert set(one_gpu["framework"]) == set(STUDY["grid"]["framework"])
    assert (one_gpu["speedup"] == 1.0).all()
