"""ray-train for real: a private Ray instance, two Ray Train workers running
torch-ddp's training function, every worker's rate in the record, and nothing
left behind (temp folder, home folder, process table). Its other cases come
from the registry: equivalence (test_equivalence.py), a killed worker
(test_failures.py), the examples, the local and SLURM studies."""

import glob
import os
from pathlib import Path

import pytest
from runs import check_a_torch_run, framework_run


def _marked(mark: str) -> list[int]:
    """Processes whose environment carries `mark` (the run's, and what it started)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if mark.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


def _links_into(folder: Path) -> list[str]:
    """Ray's short links (ray_train._ray_folder) that point into `folder`: other
    tests' Ray runs, on the other xdist worker, have links of their own."""
    found = []
    for link in glob.glob("/tmp/ts-ray-*"):
        try:
            if os.readlink(link).startswith(str(folder)):
                found.append(link)
        except OSError:  # removed by its own run meanwhile
            continue
    return found


@pytest.mark.slow
def test_two_workers_every_rate_in_the_record_and_nothing_left_behind(run_store, cifar_dir):
    # ray-train's shared run (runs.framework_run), which test_equivalence.py
    # holds to torch-single's weights: in a HOME and TMPDIR of its own, its
    # processes marked in their environment.
    run = framework_run(run_store, cifar_dir, "ray-train", 2)
    record = run.record
    assert record["framework"] == "ray-train"
    # Two Ray Train workers, each a torch.distributed rank of DDP (processes
    # and replicas 2, a provenance entry each: check_a_torch_run).
    check_a_torch_run(record, run.stdout, replicas=2)
    per_process = record["process_images_per_sec"]
    assert len(per_process) == 2 and all(rate > 0 for rates in per_process for rate in rates)
    sums = [a + b for a, b in zip(*per_process, strict=True)]
    assert record["images_per_sec"]["samples"] == pytest.approx(sums)
    # Ray's start-up is recorded apart from the timed blocks.
    ray = record["ray"]
    assert ray["ray_version"] == "2.60.0"
    assert 0 < ray["cluster_start_seconds"] < ray["driver_seconds"]
    assert ray["fit_seconds"] > record["timed_seconds"]
    print(f"ray-train, 2 workers: {ray}")
    # Seed 004 says Ray Train "facilitates inter-node communication with the
    # use of a parameter server": a step runs one all-reduce of every
    # trainable parameter over the workers' process group (DDP's), and no
    # point-to-point send or receive a server would need.
    collectives = record["collectives_per_step"]
    print(f"ray-train, one step's collectives: {collectives}")
    assert collectives["gloo:all_reduce"]["elements"] == record["trainable_parameters"]
    assert not any(name.split(":")[1] in ("send", "recv") for name in collectives)
    # Nothing left: the temp and home folders as they were, only the record,
    # its timeline and the weights beside what the store keeps, and no
    # process of the run alive.
    assert run.left_in_temp() == []
    assert sorted(os.listdir(run.home)) == []
    assert _links_into(run.folder) == []  # Ray's short link, removed
    written = set(os.listdir(run.folder)) - {"home", "tmp", "result.json"}
    assert written == {"record.json", "record.json.timeline.jsonl", "weights.npz"}
    assert _marked(run.mark) == []
