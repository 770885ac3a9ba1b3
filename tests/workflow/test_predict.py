"""The step model (trainscale.analysis.predict) recovers known parameters from records
made with them, and needs neither TensorFlow nor torch. On the published
study (held-out cells of seed 000's Table II): tests/workflow/test_published.py."""

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from conftest import REPO, load_yaml

from trainscale.analysis.predict import (
    PREDICT_GPUS_PER_NODE,
    PREDICT_NODES,
    Cell,
    PredictError,
    Series,
    StepModel,
    best_fit,
    bootstrap,
)
from trainscale.analysis.predict_series import holdout_split, traffic

# 500 MB of gradient, 100 ms of compute per step: 50 and 10 GB/s, 20 and 100 µs
# per ring step, a tenth of the backward pass overlapped. Every multi-GPU
# cell shows communication (none is hidden whole).
TRUE = (1 / 50e9, 20e-6, 1 / 10e9, 100e-6, 0.1)


def synthetic_series(
    algorithm: str, noise: float, seed: int = 1, framework="horovod", passes=2.0
) -> Series:
    model = StepModel(0.1, TRUE, algorithm, 500_000_000, 64, passes=passes)
    rng = np.random.default_rng(seed)
    cells = []
    for nodes in (1, 2, 4, 8):
        for gpus in (1, 2, 4, 8):
            rate = float(model.images_per_sec([nodes], [gpus])[0])
            drawn = rate * (1 + noise * rng.standard_normal(10))  # ten timed blocks
            cells.append(Cell(nodes, gpus, float(drawn.mean()), float(drawn.std()), tuple(drawn)))
    return Series(framework, "vgg16", 224, 64, "", 500_000_000, tuple(cells), passes)


@pytest.mark.parametrize("algorithm", ["ring", "hierarchical"])
def test_a_fit_recovers_the_parameters_its_records_were_made_with(algorithm):
    exact = synthetic_series(algorithm, noise=0.0)
    model, rms = best_fit(exact)
    assert model.algorithm == algorithm and rms < 1e-9
    np.testing.assert_allclose(model.parameters, TRUE, rtol=1e-6)
    # With 1 % noise per block, the network's bandwidth, which most cells
    # show, is still recovered within 10 %, and the bootstrap's range of the
    # network's parameters holds the truth. (A latency of 100 µs a ring step is
    # under 1 % of these steps: its point estimate moves by tens of %.)
    noisy = bootstrap(synthetic_series(algorithm, noise=0.01), fits=40)
    assert noisy.model.parameters[2] == pytest.approx(TRUE[2], rel=0.1)
    for index in (2, 3):
        refits = [refit.parameters[index] for refit in noisy.refits]
        print(algorithm, index, TRUE[index], min(refits), max(refits))
        assert min(refits) <= TRUE[index] <= max(refits)


def record(framework: str, device: str, **settings) -> dict:
    return {"framework": framework, "device": device, "trainable_parameters": 1000,
            "settings": settings}  # fmt: skip


def test_what_a_step_moves_is_the_registrys_and_a_sharded_fit_is_not_pretended():
    # Bytes on the wire and ring passes per step, as each entry says.
    assert traffic(record("horovod", "gpu", horovod_compression="fp16"), "vgg16", 32)[0] == 2000
    assert traffic(record("horovod", "gpu"), "vgg16", 32)[0] == 4000
    passes = {
        stage: traffic(record("deepspeed", "gpu", zero_stage=stage), "vgg16", 32)[1].passes
        for stage in (0, 1, 2, 3)
    }
    assert passes == {0: 2.0, 1: 2.0, 2: 2.0, 3: 3.0}  # ZeRO-3: two all-gathers, a reduce-scatter
    fsdp = traffic(record("torch-fsdp", "gpu", fsdp_reshard_after_forward=False), "vgg16", 32)
    assert fsdp[1].passes == 2.0
    # On CPU gloo runs a reduce-scatter as a whole all-reduce: no passes to fit with.
    _, cpu = traffic(record("torch-fsdp", "cpu"), "vgg16", 32)
    assert cpu.refused
    refused = Series("torch-fsdp", "vgg16", 32, 4, "", 1, synthetic_series("ring", 0.0).cells,
                     refused=cpu.refused)  # fmt: skip
    with pytest.raises(PredictError, match="^not fitted: FSDP on CPU"):
        best_fit(refused)


@pytest.mark.parametrize(
    ("framework", "moves"),
    [("torch-pipeline", "activations between neighbouring stages"), ("torch-tp", "activations")],
)
def test_model_parallelism_is_never_fitted_as_a_gradient_all_reduce(framework, moves):
    # On GPUs too: what these move is not the gradient over a ring.
    _, moved = traffic(record(framework, "gpu"), "gpt2-small", 0)
    assert moves in moved.refused
    series = Series(framework, "gpt2-small", 0, 4, "", 1, synthetic_series("ring", 0.0).cells,
                    refused=moved.refused)  # fmt: skip
    with pytest.raises(PredictError, match=f"^not fitted: {framework}: a step"):
        best_fit(series)


def test_a_fit_with_three_passes_recovers_the_links_a_zero3_step_crossed():
    # Records made with ZeRO-3's traffic, fitted with it: the same links back.
    # Fitted as an all-reduce instead, the bandwidths would come out 2/3 of the truth.
    exact = synthetic_series("ring", 0.0, framework="deepspeed", passes=3.0)
    model, rms = best_fit(exact)
    assert rms < 1e-9
    np.testing.assert_allclose(model.parameters, TRUE, rtol=1e-6)


def parameter_server_series(servers: int) -> Series:
    """tf-ps cells made with TRUE's links (exchange 2 p/s x B per server link),
    its compute from tf-single's 1-device cell."""
    model = StepModel(0.1, TRUE, "parameter-server", 500_000_000, 64, servers=servers)
    cells = tuple(
        Cell(n, g, float(model.images_per_sec([n], [g])[0]), 0.0)
        for n in (1, 2, 4)
        for g in (1, 2, 4)
    )
    base = (Cell(1, 1, 64 / 0.1, 0.0),)
    return Series("tf-ps", "vgg16", 224, 64, f"ps_servers={servers}", 500_000_000, cells,
                  servers=servers, single_cells=base)  # fmt: skip


@pytest.mark.parametrize("servers", [1, 2])
def test_a_parameter_server_fit_recovers_its_links_and_crosses_the_ring(servers):
    from trainscale.analysis.predict_crossover import crossover_table

    model, rms = best_fit(parameter_server_series(servers))
    assert model.algorithm == "parameter-server" and rms < 1e-6
    # The bandwidths are recovered. Its latency term (2 a step) and the hidden
    # share of the backward pass are both the same at every size: only their
    # difference is known, and the predictions with it.
    np.testing.assert_allclose(model.parameters[0::2][:2], TRUE[0::2][:2], rtol=1e-4)
    true = StepModel(0.1, TRUE, "parameter-server", 500_000_000, 64, servers=servers)
    np.testing.assert_allclose(
        model.images_per_sec([16, 32], [4, 4]), true.images_per_sec([16, 32], [4, 4]), rtol=1e-4
    )
    # Without its base's single device the compute time is unknown: refused.
    with pytest.raises(PredictError, match="base"):
        best_fit(dataclasses.replace(parameter_server_series(servers), single_cells=()))
    # Against the ring on the same links: the servers' links carry p/s x 2B,
    # the ring's 2(p-1)/p B, so the all-reduce is the faster from 2 workers on
    # (at 1 the ring moves nothing); the table says so, per pair.
    ring = dataclasses.replace(synthetic_series("ring", 0.0), framework="tf-multiworker")
    fitted = {s: bootstrap(s, fits=4) for s in (parameter_server_series(servers), ring)}
    holdout = pd.DataFrame({"framework": [], "model": [], "batch_size": [], "knobs": []})
    [row] = crossover_table(fitted, holdout, [1, 2, 4, 8], [4]).to_dict("records")
    assert (row["parameter_server"], row["all_reduce"], row["servers"]) == (
        "tf-ps", "tf-multiworker", servers)  # fmt: skip
    assert row["faster_at_most"] == "all-reduce" and row["most_workers"] == 32
    exchange = 32 * 2 * 500e6 / servers * TRUE[2]  # over the network at 8 nodes
    assert row["ps_images_per_sec_at_most"] == pytest.approx(
        32 * 64 / (0.1 + max(0, exchange + 2 * TRUE[3] - 0.1 * 2 / 3 * 0.1)), rel=1e-6)  # fmt: skip


def test_the_held_out_split_keeps_the_larger_cells_back():
    cells = synthetic_series("ring", 0.0).cells
    fit, held, rule = holdout_split(cells)
    assert rule == "nodes <= 4" and {c.nodes for c in held} == {8}
    assert len(fit) + len(held) == len(cells)
    one_node = [c for c in cells if c.nodes == 1]
    fit, held, rule = holdout_split(one_node)
    assert rule == "GPUs <= 4" and [c.gpus_per_node for c in held] == [8]


def test_the_schema_defaults_are_predicts():
    schema = load_yaml(os.path.join(REPO, "workflow/schemas/config.schema.yaml"))
    grid = schema["properties"]["predict"]["properties"]
    assert grid["nodes"]["default"] == list(PREDICT_NODES)
    assert grid["gpus_per_node"]["default"] == list(PREDICT_GPUS_PER_NODE)


def test_predict_needs_neither_tensorflow_nor_torch(tmp_path):
    # .venv runs this suite: it has neither; the command imports neither.
    published = os.path.join(REPO, "results", "published", "runs")
    script = (
        "import glob, sys\n"
        "from trainscale.analysis.tidy import collect\n"
        f"paths = sorted(glob.glob('{published}/*/*/*/*.json'))\n"
        f"collect('published', paths).to_csv('{tmp_path}/throughput.csv', index=False)\n"
        "from trainscale.cli import main\n"
        f"code = main(['predict', '{tmp_path}/throughput.csv', '--output-dir', '{tmp_path}',"
        " '--nodes', '1', '2', '8', '--gpus-per-node', '4'])\n"
        "assert code == 0, code\n"
        "assert not {'tensorflow', 'torch', 'keras'} & set(sys.modules), 'imported a framework'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert result.returncode == 0, result.stderr[-3000:]
    predicted = pd.read_csv(tmp_path / "predicted.csv")
    assert set(predicted["nodes"]) == {1, 2, 8}
    # tf-mirrored is one node only: no multi-node prediction for it.
    assert set(predicted[predicted["framework"] == "tf-mirrored"]["nodes"]) == {1}


def test_a_throughput_is_printed_whatever_its_size_and_only_a_bandwidth_is_unbounded():
    # The demo's predicted.md once printed "unbounded (134201 to unbounded)"
    # for a throughput at 128 GPUs: the bandwidths' marker, applied to it.
    from trainscale.analysis.predict_report import UNBOUNDED_GB_PER_S, _band

    assert _band(134201.4, 120000.2, 150000.3, digits=0) == "134201 (120000 to 150000)"
    assert _band(5.6, 5.6, 2e9, spec=".3g", unbounded_above=UNBOUNDED_GB_PER_S) == (
        "5.6 (5.6 to unbounded)"
    )


def test_a_prediction_past_the_measured_cells_says_what_it_assumed():
    # One node's cells (1 to 8 GPUs): inside them nothing is assumed; past
    # them the table says which reach and which never-measured link it took.
    from trainscale.analysis.predict_report import predicted_table

    full = synthetic_series("ring", noise=0.01)
    one_node = dataclasses.replace(full, cells=tuple(c for c in full.cells if c.nodes == 1))
    table = predicted_table({one_node: bootstrap(one_node, fits=10)}, [1, 2], [4, 16])
    assumed = {(row.nodes, row.gpus_per_node): row.assumed for row in table.itertuples()}
    assert assumed[1, 4] == ""
    assert assumed[1, 16] == "more GPUs per node than measured (8)"
    assert assumed[2, 4] == (
        "more nodes than measured (1); inter-node link never measured: taken equal to the other"
    )
