"""Ranks inside real container runtimes: Charliecloud's ch-run, Podman and
Docker (where `make docker` has loaded the image into its daemon), on
`make image`'s image (envs/Containerfile), each rank started by the
framework's own launcher (torch.distributed's ranks by trainscale's local
plan, Horovod's by mpirun) through the container's command. The containers
are profiles/local/containers.yaml's, as the container demo runs them.

The record says which runtime ran the ranks and its version (from outside),
what the image says of itself and what the rank saw of its isolation (from
inside): a test that ran on the bare host would fail on each."""

import json
import os
import subprocess

import pytest
import yaml
from runs import TINY, check_a_torch_run, framework_run, load_json, trainscale

from trainscale.core.isolation import IMAGE_LABEL, isolation_facts

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
with open(os.path.join(REPO, "profiles", "local", "containers.yaml")) as handle:
    CONTAINERS = yaml.safe_load(handle)["cluster"]["containers"]
# ch-run's image: make image unpacks it here (tools/build-image.sh).
IMAGE_DIRECTORY = "/var/tmp/trainscale-images/trainscale"


def built_image_label() -> dict:
    try:
        with open(IMAGE_DIRECTORY + IMAGE_LABEL) as handle:
            return json.load(handle)
    except OSError:
        pytest.skip(f"no image at {IMAGE_DIRECTORY}: make image builds it (make test does)")


def docker_has_the_image() -> None:
    """Skip unless Docker's daemon answers with Podman's image loaded, the
    same image ID: `make docker` (not part of make test: loading the image
    takes minutes; a rebuilt image needs it again)."""

    def image_id(program: str) -> str:
        found = subprocess.run(
            [program, "image", "inspect", "--format", "{{.Id}}", "localhost/trainscale:latest"],
            capture_output=True, text=True,
        )  # fmt: skip
        return found.stdout.strip().removeprefix("sha256:") if found.returncode == 0 else ""

    docker = image_id("docker")
    if not docker or docker != image_id("podman"):
        pytest.skip("Docker's daemon lacks make image's latest image: `make docker` loads it")


# Docker runs torch.distributed's ranks only: mpirun's it refuses (below).
RUNTIMES = [
    (framework, runtime)
    for runtime in ("charliecloud", "podman", "docker")
    for framework in ("torch-ddp", "horovod-torch")
    if (framework, runtime) != ("horovod-torch", "docker")
]


@pytest.mark.slow
@pytest.mark.parametrize(("framework", "runtime"), RUNTIMES)
def test_every_rank_runs_inside_the_container(tmp_path, framework, runtime):
    label = built_image_label()
    if runtime == "docker":
        docker_has_the_image()
    # Relative to the working directory, as the workflow's records are: the
    # ranks must start where the launcher runs ({workdir}).
    output = os.path.relpath(tmp_path / "r.json")
    result = trainscale(
        "run",
        *("--framework", framework, "--gpus-per-node", "2", *TINY),
        *("--model", "small_cnn", "--batch-size", "8", "--dataset", "synthetic"),
        *("--container-name", runtime, "--container-command", CONTAINERS[runtime]["command"]),
        *("--output", output),
        check=True,
        timeout=300,
    )
    record = load_json(output)
    check_a_torch_run(record, result.stdout, replicas=2)
    assert record["settings"]["container"] == runtime
    container = record["container"]
    assert container["runtime"] == runtime and container["runtime_version"]
    assert container["command"] == CONTAINERS[runtime]["command"]
    if runtime in ("podman", "docker"):  # its content digest, as each names the image
        assert container["image"] == "localhost/trainscale:latest"
        assert container["image_id"].startswith("sha256:") or len(container["image_id"]) == 64
    else:  # a directory: make image's, the one the label inside came from
        assert container["image_path"].endswith("trainscale-" + label["recipe_digest"])
    # Read inside: the image's own label, and its Python, not this one's.
    provenance = record["provenance"]
    assert provenance["image"] == label and label["recipe_digest"] != "unknown"
    assert provenance["python"] == label["python"]
    assert [p["image"] for p in provenance["processes"]] == [label["recipe_digest"]] * 2
    # All share the host's network (--network=host); Podman and Docker filter
    # system calls (their default seccomp profiles), ch-run does not.
    host, inside = isolation_facts(), provenance["isolation"]
    assert inside["network_namespace"] == host["network_namespace"]
    assert inside["seccomp"] == (host["seccomp"] if runtime == "charliecloud" else 2)


def test_docker_refuses_a_launcher_that_sets_its_ranks_variables(tmp_path):
    # Before any container starts: no daemon is needed to see it.
    result = trainscale(
        "run",
        *("--framework", "horovod-torch", "--gpus-per-node", "2", *TINY),
        *("--model", "small_cnn", "--batch-size", "8", "--dataset", "synthetic"),
        *("--container-name", "docker", "--container-command", CONTAINERS["docker"]["command"]),
        *("--output", str(tmp_path / "r.json")),
    )
    assert result.returncode != 0 and not (tmp_path / "r.json").exists()
    assert "horovod-torch's mpirun sets its ranks' variables" in result.stderr
    assert len([line for line in result.stderr.splitlines() if "error" in line]) == 1


@pytest.mark.slow
def test_a_bare_run_records_no_container_and_the_hosts_isolation(run_store, cifar_dir):
    # torch-single's shared run (runs.framework_run), on the bare host.
    record = framework_run(run_store, cifar_dir, "torch-single", 1).record
    assert "container" not in record and record["settings"]["container"] == "none"
    assert record["provenance"]["image"] is None
    assert [p["image"] for p in record["provenance"]["processes"]] == [None]
    assert record["provenance"]["isolation"] == isolation_facts()
