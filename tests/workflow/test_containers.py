"""The `container` axis without a container: what a study may name, the
command each grid point's ranks run through, and the refusals. The runs
inside real runtimes are tests/torch/test_containers.py."""

import copy
import os
import shlex
import sys

import numpy as np
import pandas as pd
import pytest
from conftest import REPO, copy_repository, snakemake
from test_config_errors import base, check

from trainscale.core.isolation import cpu_quota_cores, isolation_facts, seccomp_mode
from trainscale.core.setting import SettingsError
from trainscale.launching.containers import (
    IMAGE_ENVIRONMENTS,
    in_container,
    prepare_container,
    runtime_name,
)
from trainscale.study.jobs import container_arguments, container_command
from trainscale.study.study import ConfigError, run_settings

CHARLIECLOUD = {
    "command": "ch-run -b {workdir} -c {workdir} /var/tmp/trainscale-images/trainscale --"
}
PODMAN = {
    "command": "podman run --rm --network=host --env-host -v {workdir}:{workdir} "
    "-w {workdir} localhost/trainscale:latest",
    "gpu_options": "--device nvidia.com/gpu=all",
}


def with_containers():
    config = base()
    config["cluster"]["containers"] = {
        "charliecloud": copy.deepcopy(CHARLIECLOUD),
        "podman": copy.deepcopy(PODMAN),
    }
    return config


def test_a_container_the_cluster_does_not_define_is_refused_naming_those_it_does():
    config = with_containers()
    config["grid"]["container"] = ["none", "charliecloud", "apptainer"]
    refusal = (
        r"grid\.container: container 'apptainer' is not one cluster\.containers defines "
        r"\(it defines: charliecloud, podman\)"
    )
    with pytest.raises(ConfigError, match=refusal):
        check(config)
    del config["grid"]["container"]
    config["benchmark"]["container"] = "docker"
    with pytest.raises(ConfigError, match=r"benchmark\.container: container 'docker'"):
        check(config)
    # "none" would read as the bare host in a table: not a name to take.
    config["benchmark"]["container"] = "none"
    config["cluster"]["containers"]["none"] = copy.deepcopy(CHARLIECLOUD)
    with pytest.raises(ConfigError, match="cluster.containers: 'none' should not be valid"):
        check(config)


def test_each_container_of_the_grid_runs_its_points_through_its_command():
    config = with_containers()
    config["grid"]["container"] = ["none", "charliecloud", "podman"]
    points = {p.knobs: p for p in check(config) if p.framework == "horovod" and p.gpus == 2}
    bare = points[(("container", "none"),)]
    assert container_command(config, bare) == "" and container_arguments(config, bare) == ""
    charliecloud = points[(("container", "charliecloud"),)]
    assert run_settings(config, charliecloud).container == "charliecloud"
    assert container_command(config, charliecloud) == CHARLIECLOUD["command"]
    quoted = shlex.quote(CHARLIECLOUD["command"])
    assert container_arguments(config, charliecloud) == f"--container-command {quoted} "
    # The GPU options go after the runtime's program, on GPU runs only.
    podman = points[(("container", "podman"),)]
    assert container_command(config, podman) == PODMAN["command"]
    config["benchmark"]["device"] = "gpu"
    words = shlex.split(container_command(config, podman))
    assert words[:3] == ["podman", "--device", "nvidia.com/gpu=all"]
    assert words[3:] == shlex.split(PODMAN["command"])[1:]


def test_a_rank_runs_the_images_python_with_the_checkouts_code():
    command = [sys.executable, "-m", "trainscale", "train", "--output", "r.json"]
    assert in_container(command, "") == command
    wrapped = in_container(command, CHARLIECLOUD["command"], workdir="/scratch/study")
    image, workdir = "/var/tmp/trainscale-images/trainscale", "/scratch/study"
    assert wrapped[:7] == ["ch-run", "-b", workdir, "-c", workdir, image, "--"]
    assert wrapped[7] == "env" and wrapped[8].startswith("PYTHONPATH=")
    assert wrapped[8].endswith("/src") and wrapped[8] != "PYTHONPATH=/src"
    python = wrapped[9]
    assert python.startswith(IMAGE_ENVIRONMENTS + "/") and python.endswith("/bin/python")
    assert wrapped[10:] == command[1:]
    # Pyxis: srun's own options join the launch kind's srun step, no second srun.
    pyxis = in_container(command, "srun --container-image=/images/t.sqsh", workdir="/w")
    assert pyxis[0] == "--container-image=/images/t.sqsh" and "srun" not in pyxis


def test_a_container_needs_its_name_and_its_command_together():
    assert runtime_name("ch-run img --") == "charliecloud"
    assert runtime_name("/usr/bin/podman run img") == "podman"
    assert runtime_name("srun --container-image=x") == "pyxis"
    prepare_container("none", "", in_slurm=False)
    with pytest.raises(SettingsError, match="--container-name podman: no --container-command"):
        prepare_container("podman", "", in_slurm=False)
    with pytest.raises(SettingsError, match="name the container"):
        prepare_container("none", "podman run img", in_slurm=False)
    with pytest.raises(SettingsError, match="inside a SLURM job; here there is none"):
        prepare_container("pyxis", "srun --container-image=x", in_slurm=False)
    prepare_container("pyxis", "srun --container-image=x", in_slurm=True)


def test_a_charliecloud_bind_onto_a_folder_the_image_lacks_is_refused_in_one_line(tmp_path):
    # An image directory as make image unpacks it, its folders only.
    image = tmp_path / "image"
    (image / "etc").mkdir(parents=True)
    command = f"ch-run -b /srv/data:/data --bind=/scratch -c /data {image} --"
    with pytest.raises(SettingsError, match=rf"the image {image} has no folder /data to bind onto"):
        prepare_container("charliecloud", command, in_slurm=False)
    (image / "data").mkdir()
    with pytest.raises(SettingsError, match="has no folder /scratch to bind onto"):
        prepare_container("charliecloud", command, in_slurm=False)
    (image / "scratch").mkdir()
    prepare_container("charliecloud", command, in_slurm=False)
    # ch-run shares the host's /tmp (unless --private-tmp): a folder there needs none.
    prepare_container("charliecloud", f"ch-run -b {tmp_path} {image} --", in_slurm=False)
    with pytest.raises(SettingsError, match="to bind onto"):
        prepare_container("charliecloud", f"ch-run -t -b {tmp_path} {image} --", in_slurm=False)
    # An image that is not a folder on this host (another node's) is not checked.
    prepare_container("charliecloud", "ch-run -b /data /elsewhere/image --", in_slurm=True)


def test_what_may_slow_a_container_is_read_from_the_process_itself():
    facts = isolation_facts()
    assert facts["dev_shm_mib"] > 0
    assert facts["network_namespace"].startswith("net:[")
    assert "lo" in facts["network_interfaces"]
    assert seccomp_mode() in (0, 1, 2)
    quota = cpu_quota_cores()
    assert quota is None or quota > 0


def _record(container, rate, startup, namespace="net:[1]", seccomp=0, shm=24105, gpus=2):
    record = {
        "status": "ok",
        "framework": "torch-ddp",
        "model": "small_cnn",
        "batch_size": 32,
        "nodes": 1,
        "gpus_per_node": gpus,
        "settings": {
            "framework": "torch-ddp",
            "nodes": 1,
            "gpus_per_node": gpus,
            "container": container,
        },
        "images_per_sec": {"mean": rate, "std": 1.0},
        "seconds_from_launch_to_first_timed_step": startup,
        "provenance": {
            "isolation": {
                "dev_shm_mib": shm,
                "network_namespace": namespace,
                "seccomp": seccomp,
                "cpu_quota_cores": None,
            }
        },
    }
    if container != "none":
        record["container"] = {"runtime": container, "runtime_version": "1.0"}
    return record


def test_the_containers_table_sets_each_runtime_beside_the_bare_host():
    from trainscale.analysis.containers_report import containers_table

    records = [
        _record("podman", 90.0, 6.0, namespace="net:[2]", seccomp=2, shm=63),
        _record("none", 100.0, 4.5),
        _record("charliecloud", 99.0, 4.75),
        _record("charliecloud", 50.0, 4.0, gpus=1),  # no bare run of 1 GPU
        {**_record("none", 1.0, 1.0), "status": "oom"},
    ]
    table = containers_table(records).set_index(["gpus_per_node", "container"])
    assert list(table.loc[2].index) == ["none", "charliecloud", "podman"]
    assert table.loc[(2, "podman"), "of_bare_images_per_sec"] == pytest.approx(0.9)
    assert table.loc[(2, "charliecloud"), "startup_over_bare_seconds"] == pytest.approx(0.25)
    assert bool(table.loc[(2, "podman"), "own_network_namespace"]) is True
    assert bool(table.loc[(2, "charliecloud"), "own_network_namespace"]) is False
    podman = table.loc[(2, "podman")]
    assert podman["seccomp"] == 2 and podman["dev_shm_mib"] == 63
    assert table.loc[(2, "none"), "runtime"] == "bare host"
    assert pd.isna(table.loc[(1, "charliecloud"), "of_bare_images_per_sec"])


def test_the_containers_table_combines_the_repeats_of_a_point():
    from trainscale.analysis.containers_report import containers_table

    def repeat(container, blocks, startup):
        record = _record(container, sum(blocks) / len(blocks), startup)
        record["images_per_sec"]["samples"] = blocks
        return record

    records = [repeat("none", [9.0, 11.0], 4.0), repeat("none", [19.0, 21.0], 6.0)]
    records += [repeat("podman", [14.0, 16.0], 6.0)]
    table = containers_table(records).set_index("container")
    assert table.loc["none", "repeats"] == 2 and table.loc["podman", "repeats"] == 1
    assert table.loc["none", "images_per_sec"] == pytest.approx(15.0)
    # The std of the four blocks together, around their mean.
    assert table.loc["none", "images_per_sec_std"] == pytest.approx(np.std([9, 11, 19, 21], ddof=1))
    assert table.loc["none", "startup_seconds"] == pytest.approx(5.0)
    assert table.loc["podman", "of_bare_images_per_sec"] == pytest.approx(1.0)


def _probe(link, gbit, container=None, transport="torch"):
    probe = {"link": link, "transport": transport, "all_reduce": [{"busbw": gbit / 8e-9}]}
    if container:  # a probe from before the axis names none: the bare host
        probe["container_name"] = container
    return probe


def test_the_containers_table_has_the_bandwidth_its_ranks_link_was_probed_at_inside():
    from trainscale.analysis.containers_report import containers_table

    records = [
        _record("none", 100.0, 4.5),
        _record("podman", 90.0, 6.0),
        _record("charliecloud", 99.0, 4.75),
        _record("podman", 50.0, 4.0, gpus=1),  # one rank: no link
    ]
    probes = [
        _probe("intra-node", 8.0),
        _probe("intra-node", 2.0, "podman"),
        _probe("intra-node", 1.0, "podman", transport="horovod-mpi"),  # another library
        _probe("inter-node", 0.5, "charliecloud"),  # a link these runs do not cross
    ]
    table = containers_table(records, probes).set_index(["gpus_per_node", "container"])
    busbw = table["all_reduce_busbw_gbit_per_s"]
    assert busbw[(2, "none")] == pytest.approx(8.0) and busbw[(2, "podman")] == pytest.approx(2.0)
    assert table.loc[(2, "podman"), "of_bare_busbw"] == pytest.approx(0.25)
    assert pd.isna(busbw[(2, "charliecloud")]) and pd.isna(busbw[(1, "podman")])


def test_the_lab_container_study_runs_every_train_and_probe_job_through_its_runtime(tmp_path):
    repo = copy_repository(str(tmp_path / "repo"), training_envs=False)
    study = os.path.join(REPO, "tests", "slurm-lab", "containers.yaml")
    dry = snakemake(repo, "-n", "-p", "--profile", "profiles/slurm", "--configfile", study)
    assert dry.returncode == 0, dry.stderr[-3000:]
    lines = [line for line in dry.stdout.splitlines() if line.startswith("Shell command:")]
    trains = [line for line in lines if "bin/trainscale run " in line]
    probes = [line for line in lines if "trainscale probe" in line]
    # 2 frameworks x 2 node counts x 3 containers x 2 repeats; 2 transports x 3 containers.
    assert (len(trains), len(probes)) == (24, 6)
    for runtime, command in (
        ("charliecloud", "'ch-run -b /var/spool/slurmd "),
        ("podman", "'podman run "),
    ):
        for jobs in (trains, probes):
            inside = [line for line in jobs if f"--container-name {runtime} " in line]
            assert len(inside) == len(jobs) // 3
            assert all(f"--container-command {command}" in line for line in inside)
    bare = [line for line in lines if "--container-name none" in line]
    assert len(bare) == 8 + 2 and not any("--container-command" in line for line in bare)


def test_a_container_the_cluster_does_not_define_is_refused_before_anything_runs(tmp_path):
    repo = copy_repository(str(tmp_path / "repo"), training_envs=False)
    study = os.path.join(REPO, "tests", "slurm-lab", "containers.yaml")
    dry = snakemake(
        repo, "-n", "--profile", "profiles/slurm", "--configfile", study,
        "--config", "grid={'container': ['none', 'apptainer']}",
    )  # fmt: skip
    assert dry.returncode != 0
    said = dry.stdout + dry.stderr
    assert "config key grid.container: container 'apptainer' is not one cluster.containers" in said
    assert "(it defines: charliecloud, podman)" in said


def test_a_point_is_compared_with_the_bare_run_of_its_own_batch(tmp_path):
    from trainscale.analysis.containers_report import containers_table, varying

    def at(batch, container, rate):
        return {**_record(container, rate, 4.0), "batch_size": batch}

    records = [at(16, "none", 100.0), at(16, "podman", 50.0)]
    records += [at(32, "none", 200.0), at(32, "podman", 180.0)]
    table = containers_table(records).set_index(["batch_size", "container"])
    assert table.loc[(16, "podman"), "of_bare_images_per_sec"] == pytest.approx(0.5)
    assert table.loc[(32, "podman"), "of_bare_images_per_sec"] == pytest.approx(0.9)
    # The table and the figure name the batch, not the model or network it never varies.
    assert varying(table.reset_index()) == ["batch_size"]
