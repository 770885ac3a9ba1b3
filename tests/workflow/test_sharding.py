"""The memory study's analysis (trainscale.analysis.sharding_report), on a tidy
table whose answer is known: DDP holds 16 bytes a parameter plus 300 MiB;
ZeRO-3 8 bytes plus 700 MiB of buffers, so it starts to save memory between
40 M and 200 M parameters (the lines cross at 105 M)."""

import math

import pandas as pd
import pytest

from trainscale.analysis.sharding_report import (
    crossover_rows,
    memory_limits_mib,
    memory_rows,
    write_sharding,
)
from trainscale.analysis.tidy import COLUMNS

SIZES = [("gpt-tiny", 6e6), ("gpt-mini", 4e7), ("gpt2-small", 2e8), ("gpt2-medium", 4e8)]
SCHEMES = {"torch-ddp": (300, 16), "deepspeed": (700, 8)}


def tidy(limit_gib=None) -> pd.DataFrame:
    rows = []
    for model, parameters in SIZES:
        for framework, (fixed, per_parameter) in SCHEMES.items():
            peak = fixed + per_parameter * parameters / 2**20
            oom = limit_gib and peak > limit_gib * 1024
            rows.append({
                **{column: math.nan for column in COLUMNS},
                "study": "s", "framework": framework, "model": model, "dataset": "synthetic",
                "image_size": 0, "batch_size": 8, "device": "cpu", "nodes": 1,
                "gpus_per_node": 2, "gpus": 2, "repeat": 1, "source": "measured",
                "knobs": "zero_stage=3" if framework == "deepspeed" else "",
                "status": "oom" if oom else "ok",
                "images_per_sec_mean": math.nan if oom else 10.0, "images_per_sec_std": 0.0,
                "tokens_per_sec_mean": math.nan if oom else 640.0,
                "trainable_parameters": parameters,
                "peak_memory_per_replica_mib": math.nan if oom else peak,
                "memory_capacity_per_replica_mib": 6000.0,
            })  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS)


def test_the_crossover_is_bracketed_by_the_sizes_measured_on_either_side():
    memory = memory_rows(tidy().assign(series=lambda f: f["framework"], panel_knobs=""))
    crossover = crossover_rows(memory, {}).set_index("series")
    zero3 = crossover.loc["deepspeed"]
    assert zero3["saves_from_model"] == "gpt2-small"
    assert (zero3["not_yet_at_parameters"], zero3["saves_from_parameters"]) == (4e7, 2e8)
    ddp = memory[memory["series"] == "torch-ddp"]
    assert (ddp["vs_ddp"] == 1).all()
    assert crossover.loc["torch-ddp", "saves_from_model"] == ""


def test_what_ran_out_of_memory_does_not_fit_and_the_limit_defaults_to_the_records():
    frame = tidy(limit_gib=4).assign(series=lambda f: f["framework"], panel_knobs="")
    memory = memory_rows(frame).set_index(["series", "model"])
    # At gpt2-medium DDP needs 6404 MiB and ran out; ZeRO-3 needs 3752.
    assert memory.loc[("torch-ddp", "gpt2-medium"), "status"] == "oom"
    assert memory.loc[("deepspeed", "gpt2-medium"), "status"] == "ok"
    crossover = crossover_rows(memory.reset_index(), {2: 4096}).set_index("series")
    assert crossover.loc["torch-ddp", "largest_fitting_model"] == "gpt2-small"
    assert crossover.loc["deepspeed", "largest_fitting_model"] == "gpt2-medium"
    # Per replica count: on a CPU, 4 replicas share what 2 had (3000 MiB each).
    four = frame.assign(gpus_per_node=4, gpus=4, memory_capacity_per_replica_mib=3000.0)
    both = pd.concat([frame, four])
    assert memory_limits_mib(both, None) == {2: 6000.0, 4: 3000.0}
    assert memory_limits_mib(both, 2) == {2: 2048, 4: 2048}


def test_the_rule_writes_both_tables_and_the_figure(tmp_path):
    path = tmp_path / "throughput.csv"
    tidy().to_csv(path, index=False)
    figures = [str(tmp_path / "figures" / f"sharding_memory.{ext}") for ext in ("png", "pdf")]
    write_sharding(str(path), str(tmp_path), figures)
    table = pd.read_csv(tmp_path / "tables" / "sharding_crossover.csv")
    assert set(table["framework"]) == {"PyTorch DDP", "DeepSpeed (zero_stage=3)"}
    assert all((tmp_path / "figures" / f"sharding_memory.{ext}").exists() for ext in ("png", "pdf"))
    markdown = (tmp_path / "tables" / "sharding_memory.md").read_text()
    assert "gpt2-medium" in markdown
    # No record counted its live tensor bytes: the check's table says so.
    check = (tmp_path / "tables" / "memory_model_check.md").read_text()
    assert "(no run counted them: run the study with tensor_memory: true)" in check


@pytest.mark.parametrize("limit", [None, 1.0])
def test_no_scheme_fits_below_its_smallest_peak(limit):
    memory = memory_rows(tidy().assign(series=lambda f: f["framework"], panel_knobs=""))
    crossover = crossover_rows(memory, {2: 100.0} if limit else {})
    assert (crossover["largest_fitting_model"] == ("" if limit else "gpt2-medium")).all()
