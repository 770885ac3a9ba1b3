"""horovod: Horovod's TensorFlow binding on the shared step
(trainscale.frameworks.tensorflow.strategies has the other frameworks): one
rank per replica, gradients summed by hvd.DistributedGradientTape, rank 0's
state broadcast after the first step; and the optimizer's state as Keras
lists it, which the broadcast and compile_untouched both need.
"""

from __future__ import annotations

import numpy as np

from trainscale.catalogue.elastic_kinds import world_size_error
from trainscale.frameworks.tensorflow.strategies import Distribution, configure_host, require_gpus
from trainscale.harness.backend import DeviceError, horovod_wire_compression, init_horovod


class Horovod(Distribution):
    name = "horovod"
    loss_is_global = False
    elastic = False  # whether the world may be smaller than the run's (horovod_elastic)

    def setup(self) -> None:
        import horovod.tensorflow as hvd
        import tensorflow as tf

        self.hvd = hvd
        leave_horovod_unconverted()
        init_horovod(hvd, self.settings)
        configure_host(self.settings, self.processes_on_machine(hvd.local_size()))
        self.topology.num_processes, self.topology.process_index = hvd.size(), hvd.rank()
        if self.settings.device == "gpu":
            gpus = require_gpus(1, f"horovod rank {hvd.rank()}")
            # With every GPU of the node visible, rank i takes GPU i; a launcher
            # that binds one GPU per task leaves exactly one visible.
            index = hvd.local_rank() if len(gpus) > 1 else 0
            if index >= len(gpus):
                raise DeviceError(
                    f"horovod local rank {index} has no GPU: this process sees {len(gpus)}"
                )
            tf.config.set_visible_devices(gpus[index], "GPU")
            self.topology.devices = [f"/GPU:0 (physical {gpus[index].name})"]
        else:
            self.topology.devices = ["/CPU:0"]
        error = world_size_error(self.settings, hvd.size(), self.elastic)
        if error:
            raise DeviceError(error)

    def processes_on_machine(self, local_size: int) -> int:
        return local_size

    def make_dataset(self, dataset_fn):
        return dataset_fn(self.hvd.rank(), self.hvd.size(), self.settings.batch_size)

    def wrap_tape(self, tape):
        # Sum, not Average: each rank's loss is already divided by the global batch.
        compression = horovod_wire_compression(self.hvd, self.settings)
        return self.hvd.DistributedGradientTape(tape, op=self.hvd.Sum, compression=compression)

    def after_first_step(self, model, optimizer) -> None:
        # Horovod's pattern: broadcast after the first step, once the
        # optimizer has created its slot variables, so every rank continues
        # from rank 0's exact state.
        self.hvd.broadcast_variables(_traceable(model.variables), root_rank=0)
        self.hvd.broadcast_variables(optimizer_variables(optimizer), root_rank=0)

    def gather_rows(self, row: np.ndarray) -> np.ndarray:
        import tensorflow as tf

        row = np.asarray(row, dtype=np.float64)[None, :]
        return self.hvd.allgather(tf.constant(row)).numpy()


def leave_horovod_unconverted() -> None:
    """AutoGraph leaves Horovod's Python as written, as it leaves TensorFlow's
    and Keras's (its CONVERSION_RULES' "known libraries"). Horovod branches on
    Python values only, and builds its one tf.cond per gradient itself, so
    converting it changes no graph; it cost 7 of a VGG-16 rank's 15 CPU-s
    (64 gradients), each tf.function that reaches it converting it anew:
    its gradient all-reduce's, and Keras fit's train function's."""
    try:
        from tensorflow.python.autograph.core import config, config_lib
    except ImportError:  # a TensorFlow that moved it: converted, as before
        return
    rule = config_lib.DoNotConvert("horovod")
    if str(rule) not in map(str, config.CONVERSION_RULES):
        config.CONVERSION_RULES = (rule, *config.CONVERSION_RULES)


def optimizer_variables(optimizer) -> list:
    """The optimizer's state (slots, step count), to broadcast.

    `variables` is a method of Keras's legacy optimizers and a property of the
    new ones. Keras 2.11's LossScaleOptimizerV3 (fp16) inherits a `variables()`
    that reads a field it never sets (AttributeError '_variables'): there the
    optimizer it wraps lists the state.
    """

    def listed(variables):
        return variables() if callable(variables) else variables

    try:
        return listed(optimizer.variables)
    except AttributeError:
        return listed(optimizer.inner_optimizer.variables)


def _traceable(variables: list) -> list:
    """Variables that can be tf.function arguments, as hvd.broadcast_variables passes them.

    Under mixed precision Keras wraps each float variable in an AutoCastVariable;
    before Keras 2.12 it has no tracing type, and the broadcast fails ("Python
    object could not be represented through the generic tracing type", seen on
    TF 2.11). There the variable it wraps (the same storage) is broadcast instead.
    The class is asked, not the object: AutoCastVariable hands unknown attributes
    on to the variable it wraps.
    """
    return [
        v._variable
        if hasattr(v, "_variable") and not hasattr(type(v), "__tf_tracing_type__")
        else v
        for v in variables
    ]
