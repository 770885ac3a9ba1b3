"""The network as a study's axis and its probes as jobs: which probes a study
runs, with which environment, on which nodes (trainscale.network.probe, the `probe`
and `network` rules). The probe's ranks run for real in tests/torch/test_probe.py
and on the SLURM lab's shaped link in tests/workflow/test_slurm.py."""

import copy
import os
import re

import pytest
from conftest import REPO, load_yaml, snakemake

from trainscale.network.probe import ProbeJob, probe_point, study_probes
from trainscale.study.jobs import network_environment, slurm_resources
from trainscale.study.study import check_config, run_settings


def seed002():
    return load_yaml(os.path.join(REPO, "studies", "seed002.yaml"))


def test_a_study_probes_each_network_and_transport_on_one_node_and_across_two():
    config = seed002()
    probes = study_probes(config, check_config(config, root=REPO))
    # Horovod's MPI all-reduce and MultiWorker's collective ops.
    assert probes == [
        ProbeJob(network, "none", transport, nodes, ranks)
        for network in ("eth", "ib")
        for transport in ("horovod-mpi", "tf")
        for nodes, ranks in ((1, 2), (2, 1))
    ]
    assert probes[0].stem() == "network/eth/none/horovod-mpi/n1r2"


def test_the_lab_parameter_server_study_probes_the_incast_across_two_nodes():
    config = load_yaml(os.path.join(REPO, "tests", "slurm-lab", "parameter-server.yaml"))
    probes = study_probes(config, check_config(config, root=REPO))
    # The ring's link (2 ranks) and a server with 3 workers, 2 of them remote;
    # tf-ps's own kind has no probe transport: its gRPC has no probe of its own.
    assert probes == [
        ProbeJob("shaped", "none", transport, 2, ranks)
        for transport in ("tf", "torch")
        for ranks in (1, 2)
    ]


def test_the_probes_follow_the_frameworks_launchers_and_shapes():
    config = copy.deepcopy(seed002())
    config["grid"].update(framework=["torch-ddp", "horovod-torch", "tf-single"], nodes=[1])
    config["grid"].pop("network")
    config["grid"].pop("dataset")  # torch reads no TFRecord shards: synthetic alone
    config["benchmark"]["horovod_launcher"] = "gloo"
    config["constraints"] = {"exclude": [{"framework": "tf-single", "gpus_per_node": {"min": 2}}]}
    probes = study_probes(config, check_config(config, root=REPO))
    # One node: its own link only; the default route; a single device talks to no one.
    assert probes == [
        ProbeJob("default", "none", "horovod-gloo", 1, 2),
        ProbeJob("default", "none", "torch", 1, 2),
    ]
    config["probe"]["links"] = ["inter-node"]  # and no point spans two nodes
    assert study_probes(config, check_config(config, root=REPO)) == []
    config["probe"]["enabled"] = False
    assert study_probes(config, check_config(config, root=REPO)) == []


def test_a_probe_job_runs_on_its_networks_environment_and_the_nodes_it_spans():
    config = seed002()
    job = ProbeJob("eth", "none", "horovod-mpi", 2, 1)
    point = probe_point(config, job)
    settings = run_settings(config, point)
    assert (settings.framework, settings.horovod_launcher, settings.network) == (
        "horovod-torch",
        "mpi",
        "eth",
    )
    assert network_environment(config, settings.network)["OMPI_MCA_btl_tcp_if_include"] == "eth0"
    slurm = slurm_resources(config, point)
    assert (slurm["nodes"], slurm["tasks"], slurm["mpi"], slurm["gres"]) == (2, 2, "srun", "gpu:1")


def test_seed_002s_study_dry_runs_with_its_probe_jobs_on_each_network():
    dry = snakemake(
        REPO, "-n", "-p", "--profile", "profiles/slurm", "--configfile", "studies/seed002.yaml"
    )
    assert dry.returncode == 0, dry.stderr[-3000:]
    out = dry.stdout
    # 2 frameworks x 2 batches x 2 networks x 2 inputs (synthetic, TFRecord) x 7 shapes
    assert out.count("rule train:") == 112
    assert out.count("rule probe:") == 8 and out.count("rule network:") == 1
    ethernet = [line for line in out.splitlines() if "trainscale probe" in line and "eth" in line]
    assert len(ethernet) == 4
    for line in ethernet:
        # The job's log first (exec > log), then the network's environment.
        assert re.match(
            r"Shell command: exec > \S+\.log 2>&1; "
            "env GLOO_SOCKET_IFNAME=eth0 HOROVOD_GLOO_IFACE=eth0 NCCL_IB_DISABLE=1",
            line,
        ), line
        assert "--network-name eth" in line
    trains = re.findall(
        r"^Shell command: .*; env .*trainscale run .*--network-name ib .*$", out, re.M
    )
    assert len(trains) == 56 and all("OMPI_MCA_pml=ucx" in t for t in trains)  # half of 112


def probe_record(network, link, gbit):
    """A probe's record whose link moves `gbit` Gbit/s after 50 µs of latency."""

    def seconds(size):
        return 50e-6 + size * 8 / (gbit * 1e9)

    sizes = [1, 1024, 2**20]
    return {
        "network": network,
        "transport": "torch",
        "backend": "gloo",
        "nodes": 2 if link == "inter-node" else 1,
        "ranks": 2,
        "link": link,
        "ping_pong": [
            {"bytes": s, "latency": seconds(s), "bandwidth": s / seconds(s)} for s in sizes
        ],
        "all_reduce": [
            {
                "bytes": s,
                "seconds": 2 * seconds(s),
                "algbw": s / (2 * seconds(s)),
                "busbw": s / (2 * seconds(s)),
            }
            for s in sizes[1:]
        ],  # fmt: skip
    }


def test_the_network_table_and_figure_from_probe_records(tmp_path):
    import json

    import pandas as pd

    from trainscale.analysis.network_report import write_network

    paths = []
    for network, link, gbit in (("eth", "inter-node", 0.2), ("", "intra-node", 5.0)):
        paths.append(tmp_path / f"{network or 'default'}.json")
        paths[-1].write_text(json.dumps(probe_record(network, link, gbit)))
    figures = [str(tmp_path / "network.png"), str(tmp_path / "network.pdf")]
    write_network([str(p) for p in paths], str(tmp_path), figures, {"eth": 0.25})
    table = pd.read_csv(tmp_path / "network.csv").set_index("network")
    assert list(table.index) == ["default", "eth"]  # sorted; '' is the default route
    eth = table.loc["eth"]
    assert eth["latency_us"] == pytest.approx(50.0, rel=0.01)
    expected = 2**20 / (50e-6 + 2**20 * 8 / 0.2e9) * 8e-9  # 1 MiB: nearly the link's rate
    assert eth["ping_pong_gbit_per_s"] == pytest.approx(expected)
    assert eth["ping_pong_of_rated"] == pytest.approx(expected / 0.25)
    assert pd.isna(table.loc["default", "rated_gbit_per_s"])
    assert "| eth | torch | gloo | inter-node |" in (tmp_path / "network.md").read_text()
    assert all(os.path.getsize(f) > 10_000 for f in figures)
