"""The published study rebuilds from its cache alone, on a fresh copy, in seconds."""

import os
from pathlib import Path

import pandas as pd
import pytest
from conftest import train_jobs
from runs import show_in_the_log

# Its module fixture is expensive: every test of it on one pytest-xdist
# worker, while the other runs other tests (the run store would share the
# rebuild, but the other worker would sit waiting for it).
pytestmark = pytest.mark.xdist_group("published-cache")

# Seed 000 as printed. Table II: rows = GPUs per node, columns = 1..4 nodes.
TABLE_II = {
    1: [(272.445, 25.582), (472.425, 26.247), (702.127, 26.435), (924.093, 66.829)],
    2: [(451.698, 17.742), (910.767, 42.640), (1321.872, 86.017), (1768.105, 171.072)],
    3: [(677.059, 26.387), (1300.992, 89.301), (1956.980, 130.057), (2436.152, 187.640)],
    4: [(894.088, 41.936), (1734.713, 107.277), (2428.542, 189.716)],
    5: [(1114.151, 52.754), (1855.495, 136.407)],
    6: [(1332.648, 68.411), (2385.434, 197.324)],
    7: [(1487.610, 58.900)],
}
TABLE_I_TENSORFLOW = [(256.676, 33.711), (458.816, 2.550), (694.008, 5.072), (929.747, 6.866)]
TABLE_I_HOROVOD_AS_PRINTED = [
    (272.445, 25.582),
    (472.425, 26.247),
    (702.127, 26.435),
    (924.093, 66.829),
]


@pytest.fixture(scope="module")
def rebuilt(run_store):
    """The published cache rebuilt in a fresh copy, once for the pytest run
    (conftest.rebuilt_cache): the repository, what Snakemake ran, its seconds."""
    from conftest import rebuilt_cache

    rebuild = rebuilt_cache(run_store, "published")
    return rebuild["repo"], rebuild["output"], rebuild["seconds"]


def test_no_training_in_the_dag(rebuilt):
    """Over a minute where it is the first to ask for the rebuild (its fixture):
    every analysis rule of the paper's cached study runs, the step model's
    bootstrap among them (about 11 s alone on a Zen 5 VM, about 30 s on an AVX2
    one), and beside the SLURM lab's jobs that took 73-135 s."""
    repo, ran, seconds = rebuilt
    assert train_jobs(ran) == 0
    assert "collect" in ran and "tables" in ran and "figures" in ran
    # How fast is printed, not asserted: CPUs here differ up to 7x, and the
    # analysis's speed goal lives in `make bench` (workflow at scale).
    print(f"published study rebuilt in {seconds:.1f} s")


def test_table2_is_the_papers_table_ii_cell_for_cell(rebuilt):
    repo, _, _ = rebuilt
    table = pd.read_csv(os.path.join(repo, "results/published/tables/table2.csv"))
    assert list(table["gpus_per_node"]) == list(range(1, 8))
    for _, row in table.iterrows():
        published = TABLE_II[row["gpus_per_node"]]
        for nodes in range(1, 5):
            if nodes <= len(published):
                assert (row[f"n{nodes}_mean"], row[f"n{nodes}_std"]) == published[nodes - 1]
            else:
                assert pd.isna(row[f"n{nodes}_mean"])  # outside the 12-GPU grid: empty


def test_table1(rebuilt):
    repo, _, _ = rebuilt
    table = pd.read_csv(os.path.join(repo, "results/published/tables/table1.csv"))
    first_four = table[table["gpus"] <= 4]
    tensorflow = list(
        zip(first_four["tf-mirrored_mean"], first_four["tf-mirrored_std"], strict=True)
    )
    assert tensorflow == TABLE_I_TENSORFLOW
    # Our Horovod column is Table II's "1 Node" column (Horovod on one node)...
    horovod = list(zip(table["horovod_mean"], table["horovod_std"], strict=True))
    assert horovod == [TABLE_II[g][0] for g in range(1, 8)]
    # ...while the paper's own Table I Horovod column is Table II's "1 GPU" row.
    assert TABLE_II[1] == TABLE_I_HOROVOD_AS_PRINTED
    assert horovod[:4] != TABLE_I_HOROVOD_AS_PRINTED


def test_every_table_and_figure_exists(rebuilt):
    repo, _, _ = rebuilt
    folder = os.path.join(repo, "results/published")
    for name in ("table1", "table2", "efficiency"):
        for ext in ("csv", "md", "tex"):
            assert os.path.getsize(f"{folder}/tables/{name}.{ext}") > 0
    for name in ("weak_scaling_hosts", "weak_scaling_gpus", "efficiency", "frameworks"):
        for ext in ("png", "pdf"):
            assert os.path.getsize(f"{folder}/figures/{name}.{ext}") > 1000
    markdown = Path(f"{folder}/tables/table2.md").read_text()
    # Shown to the spread's two leading digits; the CSV keeps the printed values.
    assert "| 4 | 894 ± 42 | 1735 ± 107 | 2429 ± 190 |  |" in markdown
    latex = Path(f"{folder}/tables/table2.tex").read_text()
    assert r"\toprule" in latex and r"894 $\pm$ 42" in latex
    # The refactoring table for the study's frameworks and their base.
    refactoring = pd.read_csv(f"{folder}/tables/refactoring.csv")
    assert list(refactoring["framework"]) == ["tf-single", "horovod", "tf-mirrored"]


def test_speedup_and_efficiency_against_the_1_gpu_run(rebuilt):
    repo, _, _ = rebuilt
    tidy = pd.read_csv(os.path.join(repo, "results/published/throughput.csv"))
    row = tidy[(tidy.framework == "horovod") & (tidy.nodes == 4) & (tidy.gpus_per_node == 3)]
    assert row["speedup"].item() == pytest.approx(2436.152 / 272.445)
    assert row["efficiency"].item() == pytest.approx(2436.152 / 272.445 / 12)
    mirrored = tidy[(tidy.framework == "tf-mirrored") & (tidy.gpus_per_node == 2)]
    assert mirrored["speedup"].item() == pytest.approx(458.816 / 256.676)
    assert set(tidy["source"].str.split(":").str[0]) == {"published"}


def test_fitted_on_1_to_2_nodes_the_step_model_predicts_3_and_4(rebuilt, record_property):
    repo = rebuilt[0]
    tables = os.path.join(repo, "results", "published", "tables")
    holdout = pd.read_csv(os.path.join(tables, "predicted_holdout.csv")).set_index("framework")
    shown = Path(tables, "predicted_holdout.md").read_text()
    show_in_the_log(record_property, shown + Path(tables, "predicted_parameters.md").read_text())
    horovod = holdout.loc["horovod"]
    # Seed 000's Table II: fitted on 1-2 nodes (13 cells), 7 cells on 3-4 nodes held out.
    assert horovod["fit_on"] == "nodes <= 2" and horovod["held_out_cells"] == 7
    # The goals: MAPE <= 10 % and every held-out cell inside the 95 % band.
    assert horovod["mape_percent"] <= 10
    assert horovod["inside_band"] == horovod["held_out_cells"]
    predicted = pd.read_csv(os.path.join(tables, "predicted.csv"))
    largest = predicted[(predicted["framework"] == "horovod") & (predicted["gpus"] == 512)]
    assert len(largest) == 1  # 128 nodes of 4 GPUs: Horovod's paper's scale
    row = largest.iloc[0]
    assert row["low_efficiency"] <= row["predicted_efficiency"] <= row["high_efficiency"]
    assert os.path.getsize(os.path.join(repo, "results/published/figures/predicted.png")) > 1000
