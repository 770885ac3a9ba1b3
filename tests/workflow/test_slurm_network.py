"""The SLURM lab's two networks (tests/slurm-lab/network.yaml): the probe on
each, and DDP across nodes over each, on the lab of conftest.slurm_lab.

Alone (make test runs it last, with nothing beside it): its cells are
compared across jobs minutes apart, and another test's training beside them
took a 2-node cell on the fast network from about 1000 images/s to 347 in
CI, under the shaped network's 454.
"""

import json
import os
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO, copy_repository, snakemake
from lab_studies import assert_hosts_follow, profile_args, records
from runs import show_in_the_log

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.xdist_group("slurm-lab")]

SHAPED_RATE = 200e6 / 8  # bytes/s: lab.sh's SHAPED_RATE, 200mbit


@pytest.mark.alone
def test_the_shaped_network_is_probed_at_its_rate_and_slows_training_across_nodes(
    slurm_lab, tmp_path, record_property
):
    """Minutes: 5 training jobs and 2 probes, one at a time and alone on this
    machine, each a whole SLURM job, so that their timings compare."""
    # tests/slurm-lab/network.yaml: DDP over the lab's two networks, chosen by
    # interface (GLOO_SOCKET_IFNAME), with the probe on each. One job at a
    # time (cluster.one_job_at_a_time): the lab's nodes share this machine's
    # cores, and a job beside another would measure the other's load.
    repo = copy_repository(str(tmp_path / "repo"))
    with open(os.path.join(REPO, "tests", "slurm-lab", "network.yaml")) as handle:
        config = yaml.safe_load(handle)
    args = profile_args(repo, "network.yaml", config)
    result = snakemake(repo, *args, timeout=1200)
    assert result.returncode == 0, result.stderr[-4000:]
    folder = Path(repo, "results", "slurm-lab-network")

    got = records(repo, "slurm-lab-network")
    assert {r["settings"]["network"] for r in got.values()} == {"fast", "shaped"}
    probes = {
        (p.parts[-4], p.stem): json.loads(p.read_text())
        for p in folder.glob("network/*/none/*/*.json")
    }
    assert set(probes) == {("fast", "n2r1"), ("shaped", "n2r1")}
    shaped, fast = probes["shaped", "n2r1"], probes["fast", "n2r1"]
    assert_hosts_follow(shaped["hosts"], "ab") and shaped["link"] == "inter-node"
    assert shaped["environment"]["GLOO_SOCKET_IFNAME"] == "eth1"
    # The configured rate, within 20 %, at the largest message (1 MiB);
    # unshaped, the same path moves several times more.
    assert 0.8 * SHAPED_RATE < shaped["ping_pong"][-1]["bandwidth"] < 1.2 * SHAPED_RATE
    assert fast["ping_pong"][-1]["bandwidth"] > 5 * SHAPED_RATE
    # No delay is added (the kernel has no netem): a byte's one-way trip is
    # the veth path's and the scheduler's, under 5 ms on this shared machine.
    assert shaped["ping_pong"][0]["latency"] < 5e-3

    # Training across the two nodes is slower over the shaped network: 2
    # nodes of 1 rank, 0.57 of the fast rate here (0.72 MB a step at 25 MB/s
    # is 29 ms beside 24 ms of compute).
    tidy = pd.read_csv(folder / "throughput.csv").set_index(["knobs", "nodes", "gpus_per_node"])
    rate = tidy["images_per_sec_mean"]
    assert rate["network=shaped", 2, 1] < 0.8 * rate["network=fast", 2, 1], rate
    efficiency = (folder / "tables" / "efficiency.md").read_text()
    assert "network=fast" in efficiency and "network=shaped" in efficiency
    # The step model, fitted on the 1-node cells and 2 nodes of 1 rank,
    # recovers the configured rate within 2x and agrees with the probe
    # (issue 23's test of the traffic model), and its error on the held-out
    # cell (2 nodes of 2) is reported both ways.
    (compared,) = (
        pd.read_csv(folder / "tables" / "predicted_vs_probe.csv")
        .query("knobs == 'network=shaped'")
        .to_dict("records")
    )
    assert 0.5 < compared["fitted_inter_gb_per_s"] / (SHAPED_RATE * 1e-9) < 2, compared
    # The probe's bus bandwidth at the gradient's 0.72 MB: under the rate
    # (latency still counts at that size), never over it.
    assert 0.5 < compared["probe_inter_gb_per_s"] / (SHAPED_RATE * 1e-9) < 1.05, compared
    assert compared["agrees"] and compared["held_out_cells"] == 1, compared
    for held_out in ("fitted_held_out_mape_percent", "probe_link_held_out_mape_percent"):
        assert 0 <= compared[held_out] < 100, compared
    # predict.link: probe: the study's predictions use the probe's link.
    (parameters,) = (
        pd.read_csv(folder / "tables" / "predicted_parameters.csv")
        .query("knobs == 'network=shaped'")
        .to_dict("records")
    )
    assert parameters["inter_gb_per_s"] == pytest.approx(compared["probe_inter_gb_per_s"])
    assert "inter-node link fixed to the network probe's" in parameters["note"]
    tables = [
        (folder / "tables" / f"{name}.md").read_text()
        for name in ("network", "efficiency", "predicted_vs_probe", "predicted_parameters")
    ]
    show_in_the_log(record_property, "\n".join(tables))
