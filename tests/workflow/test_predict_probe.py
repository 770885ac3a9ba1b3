"""The step model beside the network probe (trainscale.analysis.predict_probe), on
series made from known parameters and probe records made from a known link.
On the SLURM lab's shaped network: tests/workflow/test_slurm.py."""

import json

import pytest

from trainscale.analysis.predict import Cell, Series, StepModel, fit_step_model
from trainscale.analysis.predict_probe import (
    link_split,
    probe_row,
    probe_table,
    probed_link,
    with_link,
    with_probed_links,
)

GRADIENT = 100_000_000  # bytes
# intra 50 GB/s and 20 µs, inter 1 GB/s and 100 µs per ring step, 10 % overlap.
TRUE = (1 / 50e9, 20e-6, 1 / 1e9, 100e-6, 0.1)


def series(network="eth") -> Series:
    model = StepModel(0.1, TRUE, "ring", GRADIENT, 64)
    cells = [
        Cell(n, g, float(model.images_per_sec([n], [g])[0]), 0.0)
        for n, g in ((1, 1), (1, 2), (1, 4), (2, 1), (2, 4), (4, 4))
    ]
    return Series("torch-ddp", "vgg16", 224, 64, f"network={network}", GRADIENT, tuple(cells))


def probe(network="eth", gb_per_s=1.0, latency=100e-6, link="inter-node", transport="torch"):
    """A probe's record of 2 ranks over a link of `gb_per_s` bus bandwidth."""
    sizes = [4 * 2**k for k in range(0, 28, 3)]
    seconds = [2 * latency + s / (gb_per_s * 1e9) for s in sizes]
    rows = [
        {"bytes": s, "seconds": t, "algbw": s / t, "busbw": s / t} for s, t in zip(sizes, seconds)
    ]
    return {"network": network, "transport": transport, "link": link, "nodes": 2, "ranks": 2,
            "all_reduce": rows, "ping_pong": []}  # fmt: skip


def test_the_probed_link_is_the_bus_bandwidth_at_the_gradients_size_and_the_latency_per_step():
    link = probed_link(series(), [probe(), probe(gb_per_s=9, link="intra-node")])
    # 100 MB against 200 µs of latency: 99.8 % of the link's rate.
    assert link.bandwidth == pytest.approx(1e9 / (1 + 2e-4 * 1e9 / GRADIENT), rel=0.01)
    assert link.latency == pytest.approx(100e-6 + 4 / 1e9 / 2, rel=1e-3)
    assert probed_link(series("ib"), [probe()]) is None  # another network's probe
    assert probed_link(series(), [probe(transport="horovod-mpi")]) is None  # another library's


def test_the_fit_sees_the_network_once_and_is_held_out_on_the_larger_cells():
    fit, held = link_split(series().cells)
    assert [(c.nodes, c.gpus_per_node) for c in fit] == [(1, 1), (1, 2), (1, 4), (2, 1)]
    assert [(c.nodes, c.gpus_per_node) for c in held] == [(2, 4), (4, 4)]


def test_a_fit_with_the_probes_link_recovers_the_rest_of_the_model():
    fit, _ = link_split(series().cells)
    link = probed_link(series(), [probe(latency=100e-6)])
    model, rms = fit_step_model(with_link(series(), link), fit, "ring")
    assert rms < 0.01
    assert model.parameters[2:4] == (1 / link.bandwidth, link.latency)
    # The 1-node cells' exchange hides whole under the backward pass (its
    # link cannot be seen there); the 2-node cell pins the overlap.
    assert model.parameters[4] == pytest.approx(TRUE[4], rel=0.05)


def test_a_probe_that_agrees_is_not_flagged_and_one_that_does_not_is(tmp_path):
    row = probe_row(series(), [probe()])
    # Five parameters, three multi-GPU cells: the fit is not unique, but near.
    assert row["fitted_over_probe"] == pytest.approx(1.0, rel=0.1) and row["agrees"]
    assert row["fitted_held_out_mape_percent"] < 5 and row["probe_link_held_out_mape_percent"] < 5
    wrong = probe_row(series(), [probe(gb_per_s=10.0)])  # 10x the link the steps saw
    assert not wrong["agrees"] and "differ by more than 2x" in wrong["note"]
    assert wrong["fitted_over_probe"] == pytest.approx(0.1, rel=0.1)
    # Fixed to a wrong link, the larger cells are predicted worse than fitted.
    assert wrong["probe_link_held_out_mape_percent"] > 10 * wrong["fitted_held_out_mape_percent"]
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(probe()))
    assert probe_table([series()], [str(path)])["agrees"].tolist() == [True]
    alone = probe_table([series()], [])
    assert alone["note"].tolist() == ["no probe in this study: the fitted link stands alone"]


def test_the_predict_link_setting_fixes_each_series_link_to_its_own_networks_probe(tmp_path):
    path = tmp_path / "n2r1.json"
    path.write_text(json.dumps(probe(gb_per_s=0.5)))
    eth, ib = with_probed_links([series("eth"), series("ib")], [str(path)])
    assert ib.inter_link is None  # no probe of its network: fitted as before
    assert eth.inter_link[0] == pytest.approx(1 / 0.5e9, rel=0.01)
    # The fit keeps the probe's link (half the true rate) and fits the rest.
    model, _ = fit_step_model(eth, eth.cells, "ring")
    assert model.parameters[2:4] == eth.inter_link and "inter" not in model.tied
