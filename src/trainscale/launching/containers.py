"""A run's processes inside a container: the `container` axis (seed 002's
Docker against Singularity).

A container is a command that runs one process inside it, as a cluster's
documentation gives it (cluster.containers; the run's --container-command):
`ch-run IMAGE --` (Charliecloud), `podman run --rm --network=host ... IMAGE`,
`apptainer exec --nv IMAGE`, `srun --container-image=IMAGE` (Pyxis). Each
process's own command follows it, so the framework's own launcher (mpirun,
srun, Ray's driver, or trainscale's local plan) starts every rank inside the
container, as a user on such a cluster starts them.

Inside, the image holds the training environments under IMAGE_ENVIRONMENTS,
each in a folder of its host folder's name (.venv-train, .venv-torch), built
by the project's own install scripts (envs/Containerfile). trainscale's code
is the checkout's, on PYTHONPATH: the run's working directory must be bound
at the same path ({workdir} in the command stands for it), so one image
serves every commit built on the same pins.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

# The `container` setting's name for the bare host.
BARE = "none"
# Where an image built by envs/Containerfile holds the training environments.
IMAGE_ENVIRONMENTS = "/opt/trainscale"
# A runtime's program, as the first word of a command names it, and its name.
RUNTIMES = {
    "ch-run": "charliecloud",
    "podman": "podman",
    "docker": "docker",
    "apptainer": "apptainer",
    "singularity": "singularity",
    "enroot": "enroot",
    "srun": "pyxis",  # srun --container-image=...: the Pyxis plugin
}


def container_argv(container_command: str, workdir: str | None = None) -> list[str]:
    """The container's command as argv, {workdir} replaced by the run's working directory."""
    workdir = workdir or os.getcwd()
    return [word.replace("{workdir}", workdir) for word in shlex.split(container_command)]


def in_container(command: list[str], container_command: str, workdir: str | None = None):
    """`command`, a process trainscale starts with this Python, run through
    the container's command instead: its Python is the image's environment of
    the same folder name, and the checkout's code comes first on its path."""
    if not container_command:
        return command
    workdir = workdir or os.getcwd()
    python = os.path.join(IMAGE_ENVIRONMENTS, os.path.basename(sys.prefix), "bin", "python")
    source = os.path.join(os.path.dirname(os.path.dirname(__file__)), os.pardir)
    inner = [python if word == sys.executable else word for word in command]
    path = f"PYTHONPATH={os.path.normpath(source)}"
    prefix = container_argv(container_command, workdir)
    if runtime_name(container_command) == "pyxis":
        # srun's options (--container-image=...) join the launch kind's own
        # srun step: the ranks' command goes after them, never a second srun.
        prefix = prefix[1:]
    return [*prefix, "env", path, *inner]


def runtime_name(container_command: str) -> str:
    """The runtime a container command runs (RUNTIMES), or its program's name."""
    program = os.path.basename(shlex.split(container_command)[0])
    return RUNTIMES.get(program, program)


def runtime_version(container_command: str) -> str:
    """The runtime's own version line ('' when it gives none)."""
    program = shlex.split(container_command)[0]
    asked = [program, "--version"]
    if runtime_name(container_command) == "docker":  # the daemon's, which runs it
        asked = [program, "version", "--format", "Docker {{.Server.Version}} (daemon)"]
    try:
        # ch-run refuses to start without $USER, even for --version.
        env = {**os.environ, "USER": os.environ.get("USER") or "root"}
        done = subprocess.run(asked, capture_output=True, text=True, timeout=30, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0] if lines else ""


def image_identity(container_command: str) -> dict:
    """The image a container command runs and, where the runtime keeps one,
    its content digest (Podman's and Docker's image ID); a directory image
    (ch-run's) by its resolved path. The image's own label, its recipe's
    digest, is read inside (provenance.image)."""
    words = container_argv(container_command)
    runtime = runtime_name(container_command)
    if runtime in ("podman", "docker"):
        image = words[-1]  # `run [options] IMAGE`: the process's command follows
        try:
            done = subprocess.run(
                [words[0], "image", "inspect", "--format", "{{.Id}}", image],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return {"image": image, "image_id": None}
        return {"image": image, "image_id": done.stdout.strip() or None}
    image = charliecloud_image(words) if runtime == "charliecloud" else None
    if image:
        return {"image": image, "image_id": None, "image_path": os.path.realpath(image)}
    return {"image": None, "image_id": None}


def container_provenance(name: str, container_command: str) -> dict:
    """What the record says of the run's container, seen from outside it
    (the image's own label is read inside: provenance.image): {} on the bare host."""
    if not container_command:
        return {}
    return {
        "container": {
            "name": name,
            "runtime": runtime_name(container_command),
            "runtime_version": runtime_version(container_command),
            "command": container_command,
            **image_identity(container_command),
        }
    }


def prepare_container(name: str, container_command: str, in_slurm: bool) -> None:
    """Refuse a container named without its command, or a command without
    a name (the record and the tables would not say where the run ran); set
    what the runtime needs of this process's environment."""
    from trainscale.core.setting import SettingsError

    if name != BARE and not container_command:
        raise SettingsError(
            f"--container-name {name}: no --container-command says how to run a process "
            "in it (a study's cluster.containers gives it)"
        )
    if container_command and name == BARE:
        raise SettingsError(
            "--container-command: name the container (--container-name) for the record"
        )
    if container_command and runtime_name(container_command) == "pyxis" and not in_slurm:
        raise SettingsError(
            "--container-command srun ...: Pyxis starts containers from srun's own "
            "options, inside a SLURM job; here there is none"
        )
    if container_command and runtime_name(container_command) == "charliecloud":
        # ch-run refuses to start without $USER ("$USER not set", ch-run.c:122),
        # which a batch shell or a CI runner may leave unset.
        import getpass

        os.environ.setdefault("USER", getpass.getuser())
        check_charliecloud_binds(container_argv(container_command))


def charliecloud_image(words: list[str]) -> str | None:
    """ch-run's IMAGE in `ch-run [options] IMAGE -- CMD`, or None without `--`."""
    return words[words.index("--") - 1] if "--" in words else None


def _bind_destinations(words: list[str]) -> list[str]:
    """The guest folders of ch-run's -b/--bind SRC[:DST] options (DST: SRC's path)."""
    binds = []
    for index, word in enumerate(words):
        if word in ("-b", "--bind") and index + 1 < len(words):
            binds.append(words[index + 1])
        elif word.startswith("--bind="):
            binds.append(word.removeprefix("--bind="))
        elif word.startswith("-b") and len(word) > 2:
            binds.append(word[2:])
    return [bind.split(":", 1)[-1] for bind in binds]


def check_charliecloud_binds(words: list[str]) -> None:
    """Refuse, in one line, a bind onto a folder ch-run's image directory
    lacks: ch-run 0.31 binds only onto a folder the image has, and fails
    each rank at start ("can't mkdir: ...: Read-only file system"). /tmp is
    the host's unless --private-tmp. An image not on this host is not checked."""
    from trainscale.core.setting import SettingsError

    image = charliecloud_image(words)
    if not image or not os.path.isdir(image):
        return
    shared_tmp = not {"-t", "--private-tmp"} & set(words)
    for folder in _bind_destinations(words):
        if shared_tmp and folder.startswith("/tmp/"):
            continue
        if not os.path.isdir(os.path.join(image, folder.lstrip("/"))):
            raise SettingsError(
                f"--container-command ch-run: the image {image} has no folder {folder} to "
                "bind onto (ch-run cannot make one in a read-only image): `make image` run "
                "from this checkout makes its path there (tools/build-image.sh)"
            )


# Docker, unlike Podman, has no --env-host: a variable reaches a container
# only where `docker run` names it (`-e NAME` takes the client's value). The
# names a rank reads are known where trainscale or srun sets them: its launch
# plan's, and these prefixes' in the launcher's environment (srun's task
# variables are in the client's when srun starts it). mpirun and horovodrun
# set theirs (OMPI_, PMIX_, HOROVOD_) as each rank starts, under names no
# list here could follow.
PASSED_TO_DOCKER = ("TRAINSCALE_", "SLURM_", "NCCL_", "GLOO_", "OMP_", "TF_", "CUDA_", "TORCH")
RANK_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                  "LOCAL_WORLD_SIZE", "TRAINSCALE_LAUNCHED_AT")  # fmt: skip
LAUNCHERS_OF_THEIR_OWN = ("mpirun", "horovodrun")


def with_docker_environment(plan: list, framework: str) -> list:
    """Each process of `plan` whose command runs `docker run`, naming every
    variable the rank reads; a launcher that sets them itself is refused."""
    from trainscale.core.setting import SettingsError

    named = {n for n in os.environ if n.startswith(PASSED_TO_DOCKER)} | set(RANK_VARIABLES)
    ready = []
    for process in plan:
        argv = process.argv
        programs = [os.path.basename(word) for word in argv]
        if "docker" not in programs:
            ready.append(process)
            continue
        launcher = programs[0]
        if launcher in LAUNCHERS_OF_THEIR_OWN:
            raise SettingsError(
                f"--container-command docker: {framework}'s {launcher} sets its ranks' "
                "variables as it starts them, and Docker passes a container only those "
                "`docker run -e` names (it has no --env-host): run it in Podman or ch-run"
            )
        at = programs.index("docker") + argv[programs.index("docker") :].index("run") + 1
        names = [f"--env={name}" for name in sorted(named | set(process.env))]
        ready.append(process._replace(argv=[*argv[:at], *names, *argv[at:]]))
    return ready
