"""What a Horovod rank checks of the extension it has loaded, which its
launcher no longer does (trainscale.launching.horovodrun)."""

import os


def require_gloo(hvd) -> None:
    """In a rank (`hvd`: horovod.tensorflow or horovod.torch) started for
    Gloo, before hvd.init(): fail where Horovod lacks it. Without Gloo,
    hvd.init() would make each rank a world of its own over MPI."""
    if "HOROVOD_GLOO_RENDEZVOUS_ADDR" in os.environ and not hvd.gloo_built():
        raise RuntimeError(
            f"{hvd.__name__} was built without Gloo: reinstall Horovod with HOROVOD_WITH_GLOO=1"
        )
