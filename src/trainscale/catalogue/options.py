"""What `trainscale run` and `train` are told beyond the settings: where the
record goes, the watchdog, the workflow's attempts. Declared as settings are
(trainscale.core.setting), so the CLI derives their flags the same way."""

from __future__ import annotations

from trainscale.catalogue.settings import settings_dataclass
from trainscale.core.setting import Setting


class _RunOptions:
    """How one run is carried out and where its results go: nothing here
    changes what is measured, so none of it enters the settings hash."""


# What `run` and `train` are told beyond the settings (group "output").
OPTIONS = (
    Setting("output", str, None, "where the JSON record goes (written atomically)",
            group="output", metavar="JSON"),
    Setting("save_weights", str, None,
            "also save initial and final trainable weights (the equivalence tests)",
            group="output", metavar="NPZ"),
    Setting("expect_cuda_devices", int, 0,
            "(train) fail unless CUDA_VISIBLE_DEVICES names at least N devices",
            minimum=0, group="output", metavar="N"),
    Setting("requested_gpus_per_node", int, 0,
            "(run) the GPUs per node the job asked its scheduler for; each process "
            "must see its share", minimum=0, group="output", metavar="G"),
    Setting("requested_cpus_per_task", int, 0,
            "(run) the CPUs per task the job asked its scheduler for; the ranks' srun "
            "step asks for them again (0: srun's default, one)",
            minimum=0, group="output", metavar="C"),
    # The workflow passes cluster.containers' command for the run's
    # --container-name; a user at a shell types the same.
    Setting("container_command", str, "",
            "(run) the command that runs one process inside the run's container, e.g. "
            "'ch-run IMAGE --' or 'podman run --rm --network=host IMAGE': each process's "
            "own command follows it ('': the bare host)", group="output", metavar="COMMAND"),
    Setting("timeout", float, 0.0,
            "(run) stop every process after this long and record status timeout (0: none)",
            minimum=0, group="output", metavar="SECONDS"),
    # Long enough for the first step's tracing skew between ranks, short
    # enough that a stalled rank does not hold a cluster allocation for long.
    Setting("collective_timeout", float, 300.0,
            "a collective that waits this long for a stalled rank fails the run "
            "(MultiWorkerMirrored, Horovod over Gloo, torch.distributed; Horovod over MPI "
            "has no such timeout: the watchdog bounds it) (0: wait forever)",
            minimum=0, group="output", metavar="SECONDS"),
    Setting("attempt", int, 1,
            "(run) which attempt at this grid point this is (the workflow's retries)",
            minimum=1, group="output", metavar="N"),
    Setting("attempts", int, 0,
            "(run) on attempt M or later, a failure still writes a record: status failed "
            "with the log's tail (0: never)", minimum=0, group="output", metavar="M"),
)  # fmt: skip
RunOptions = settings_dataclass("RunOptions", OPTIONS, _RunOptions)
OPTION = {option.name: option for option in OPTIONS}


def validate_options(options) -> None:
    for setting in OPTIONS:
        setting.validate(getattr(options, setting.name))
