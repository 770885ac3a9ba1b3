"""Keras's fit through trainscale against a plain Keras fit script (issue 44's
goal: trainscale's fit frameworks at >= 0.97 of it).

Side by side, whole processes, alternating A, B for --repeats rounds: the
framework's own example (examples/tf_single_fit.py, tf_horovod_fit.py under
horovodrun --gloo), which is the plain script a Keras user writes, against
`trainscale run` of the same framework, on the same model, batch and
synthetic data. Both time the same steps after the first (the plain script
from the end of its first step, trainscale its blocks after one warm-up
step); each prints images/sec over them. The ratio is trainscale's rate over
the script's, per round, with its median and spread.

    .venv-train/bin/python bench/keras_fit_bench.py [--repeats 5] [--model vgg16]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile

TRAINSCALE = [sys.executable, "-m", "trainscale"]
# (framework, replicas): one device, and Horovod's Keras API on 2 ranks.
CASES = (("tf-single-fit", 1), ("horovod-fit", 2))


def plain_script(framework: str, replicas: int, args) -> float:
    """images/sec the example prints: its steps after the first."""
    launcher = ["--horovod-launcher", "gloo"] if framework == "horovod-fit" else []
    command = [*TRAINSCALE, "example", framework, "--replicas", str(replicas), *launcher, "--"]
    command += ["--synthetic", "--steps", str(args.steps + 1), "--batch-size", str(args.batch)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return float(re.findall(r"images/sec: ([\d.]+)", done.stdout)[-1])


def through_trainscale(framework: str, replicas: int, args) -> float:
    """images/sec of `trainscale run`'s timed blocks (the record's mean)."""
    blocks = 4
    with tempfile.NamedTemporaryFile(suffix=".json") as output:
        command = [*TRAINSCALE, "run", "--framework", framework, "--gpus-per-node", str(replicas)]
        command += ["--model", args.model, "--image-size", "32", "--batch-size", str(args.batch)]
        command += ["--dataset", "synthetic", "--device", "cpu", "--warmup-steps", "1"]
        command += ["--blocks", str(blocks), "--steps-per-block", str(args.steps // blocks)]
        command += ["--horovod-launcher", "gloo", "--output", output.name]
        subprocess.run(command, capture_output=True, text=True, check=True)
        return json.load(open(output.name))["images_per_sec"]["mean"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="timed steps a side (of 4 blocks)")
    parser.add_argument("--batch", type=int, default=16, help="images per replica per step")
    parser.add_argument("--model", default="vgg16", help="the examples' model: VGG-16")
    args = parser.parse_args()
    rows = {}
    for framework, replicas in CASES:
        ratios, sides = [], {"script": [], "trainscale": []}
        for _ in range(args.repeats):  # A, B, A, B: the machine's drift hits both
            sides["script"].append(plain_script(framework, replicas, args))
            sides["trainscale"].append(through_trainscale(framework, replicas, args))
            ratios.append(sides["trainscale"][-1] / sides["script"][-1])
            print(f"{framework}: {ratios[-1]:.3f}", file=sys.stderr, flush=True)
        rows[framework] = {"replicas": replicas, **sides, "ratios": ratios}
        print(
            f"{framework} x{replicas}: script {statistics.median(sides['script']):.1f} img/s, "
            f"trainscale {statistics.median(sides['trainscale']):.1f} img/s, ratio median "
            f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}; "
            f"goal >= 0.97)"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
