"""What driving a high-level API's loop costs per step (trainscale.harness.driven_loop):
the hand-over between the harness's thread and the API's, on a loop that does
nothing else. A Keras fit or Lightning step pays it once.

    .venv-train/bin/python bench/driven_loop_bench.py [--steps 20000]
"""

from __future__ import annotations

import argparse
import time

from trainscale.harness.driven_loop import DrivenLoop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20000)
    args = parser.parse_args()

    def run():  # an API's loop whose batches take no time
        while loop.hand_over(0.0):
            pass

    loop = DrivenLoop(run, "bare")
    loop.step()  # the thread's start, untimed
    start = time.perf_counter()
    for _ in range(args.steps):
        loop.step()
    seconds = (time.perf_counter() - start) / args.steps
    loop.stop()
    print(f"DrivenLoop hand-over: {seconds * 1e6:.1f} us per step ({args.steps} steps)")


if __name__ == "__main__":
    main()
