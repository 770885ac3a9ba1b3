"""`horovodrun`, less the check it repeats on every launch.

Before it starts a rank, Horovod 0.28.1's launcher asks whether its
extension was built with Gloo by importing the extension in a
forked process: horovod.tensorflow first, which imports all of TensorFlow
(horovod.torch, and torch, where TensorFlow is absent). On the 2-core AMD VM
that is 5.5 s of every `horovodrun --gloo` launch, before the ranks import
the same extension again. Here the ranks make that check themselves, where
the extension is loaded anyway (core.horovod_ranks.require_gloo); everything
else is `horovodrun`'s own code, with its own arguments.

    python -m trainscale.launching.horovodrun --gloo -np 2 -H localhost:2 python train.py

trainscale starts it with --gloo only (catalogue.launch_kinds).
"""


def gloo_built(verbose: bool = False) -> bool:
    """In place of horovod.common.util.gloo_built: the rank checks."""
    return True


def main() -> None:
    from horovod.runner import launch

    # launch.py looks the check up in its own namespace at each call, in a
    # static run (run_controller) and an elastic one (_run_elastic) alike.
    launch.gloo_built = gloo_built
    launch.run_commandline()


if __name__ == "__main__":
    main()
