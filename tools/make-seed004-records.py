"""Write seed 004's published numbers as cached trainscale records.

The numbers are copied exactly as printed in the three tables of Dey and
Banerjee, "Benchmarking Horovod and Ray for Distributed DNN training on GPU
cluster" (April 2022): training time, test accuracy and images/sec of Ray
Train and Horovod, ResNet-50 on MNIST and MobileNetV2 on Fashion-MNIST,
batch 32, 1 and 2 GPUs of a 2 x Titan RTX node and of a 4 x V100 node.

Each record keeps the printed text of its three numbers (`printed`) beside
the normalised ones: Horovod's accuracy is printed in percent and Ray's as a
fraction; the records hold fractions, as trainscale's accuracy mode does.

Run from the repository root:  python tools/make-seed004-records.py
It rewrites results/seed004/runs/ (the records are committed; this script
documents and reproduces them).
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from trainscale.catalogue.settings import RunSettings  # noqa: E402
from trainscale.core.records import atomic_write_json, record_head  # noqa: E402
from trainscale.study.study import GridPoint, record_path  # noqa: E402

STUDY = "seed004"
PAPER = (
    "Dey and Banerjee, Benchmarking Horovod and Ray for Distributed DNN training "
    "on GPU cluster (2022)"
)
# The seed's columns: its two nodes, as the `system` axis, with what it says of each.
NODES = {
    "node5-titan-rtx": {
        "column": "Node 5(2*TitanRTX)",
        "gpu": "NVIDIA Titan RTX (2 in the node, 48GB GPU memory in all)",
        "cpu": "2 x AMD EPYC, 32 threads",
        "memory": "256GB",
    },
    "node9-v100": {
        "column": "Node 9(4*V100)",
        "gpu": "NVIDIA V100 (4 in the node, 128GB GPU memory in all)",
        "cpu": "Intel Xeon, 32 threads",
        "memory": "192GB, and 2 x 128GB Intel Optane",
    },
}
COMMON = {
    "paper": PAPER,
    "cluster": "IOE cluster, PBS job scheduler",
    "os": "CentOS 7",
    "gcc": "9.3",
    "cuda": "11.0",
    "note": (
        "one run per cell; the seed states no epochs, optimizer, learning rate or "
        "framework versions, nor whether Horovod ran under PyTorch or TensorFlow "
        "(filed as horovod-torch: Ray Train runs PyTorch)"
    ),
}
# The seed's rows: model + data set.
ROWS = {"RN50+MNIST": ("resnet50", "mnist"), "MN+F-MNIST": ("mobilenet_v2", "fashion-mnist")}
# Each table as printed: row -> (node 5, 1 GPU; node 5, 2; node 9, 1; node 9, 2).
# The text is kept: "3" and "4.0798" are what the seed prints.
TIME = {
    "ray-train": {
        "RN50+MNIST": ("4.0798", "2.789", "3.353", "1.848"),
        "MN+F-MNIST": ("0.817", "0.654", "0.792", "0.808"),
    },
    "horovod-torch": {
        "RN50+MNIST": ("4.132", "3.4474", "3", "3.7002"),
        "MN+F-MNIST": ("0.691", "0.6409", "0.614", "0.936"),
    },
}
ACCURACY = {
    "ray-train": {
        "RN50+MNIST": ("0.9883", "0.9922", "0.99", "0.99"),
        "MN+F-MNIST": ("0.6951", "0.47", "0.5802", "0.7498"),
    },
    "horovod-torch": {
        "RN50+MNIST": ("90.2", "90.4", "90.3", "90.3"),
        "MN+F-MNIST": ("72.9", "72", "72.2", "71.8"),
    },
}
IMAGES_PER_SEC = {
    "ray-train": {
        "RN50+MNIST": ("14706", "21513", "17894", "32467"),
        "MN+F-MNIST": ("73739", "91743", "75757", "74257"),
    },
    "horovod-torch": {
        "RN50+MNIST": ("14520", "17404", "17400", "16215"),
        "MN+F-MNIST": ("86830", "93618", "93618", "64102"),
    },
}
# Which scale each framework's accuracy is printed in.
ACCURACY_UNIT = {"ray-train": "fraction", "horovod-torch": "percent"}
COLUMNS = [(system, gpus) for system in NODES for gpus in (1, 2)]


def accuracy_fraction(text: str, unit: str) -> float:
    value = float(text)
    return round(value / 100, 6) if unit == "percent" else value


def record(framework, row, column):
    system, gpus = COLUMNS[column]
    model, dataset = ROWS[row]
    settings = RunSettings(
        framework=framework,
        gpus_per_node=gpus,
        model=model,
        dataset=dataset,
        system=system,
        batch_size=32,
        image_size=28,
        device="gpu",
        mode="accuracy",
    )
    printed = {
        "training_time_seconds": TIME[framework][row][column],
        "test_accuracy": ACCURACY[framework][row][column],
        "images_per_sec": IMAGES_PER_SEC[framework][row][column],
    }
    rate = float(printed["images_per_sec"])
    where = f"{row} row, {NODES[system]['column']} column, {gpus} GPU{'s' * (gpus > 1)}"
    return {
        **record_head(settings, "ok"),
        # The seed does not say how its grayscale images met the models' stems.
        "input_channels": None,
        # The seed's own settings are only what it states.
        "settings_hash": "published",
        "mode": "accuracy",
        "images_per_sec": {"mean": rate, "std": None, "samples": []},
        "per_replica_images_per_sec": {"mean": rate / gpus, "std": None},
        "training_seconds": float(printed["training_time_seconds"]),
        "final_test_accuracy": accuracy_fraction(
            printed["test_accuracy"], ACCURACY_UNIT[framework]
        ),
        "final_test_loss": None,
        "target_accuracy": None,
        "time_to_target_seconds": None,
        "epochs_to_target": None,
        "epochs_run": None,
        "curve": [],
        "printed": printed,
        "printed_accuracy_unit": ACCURACY_UNIT[framework],
        "source": f"published: seed 004, {where}",
        "provenance": {**COMMON, **{k: v for k, v in NODES[system].items() if k != "column"}},
    }


def main(root="results"):
    written = 0
    for framework in TIME:
        for row in ROWS:
            for column, (system, gpus) in enumerate(COLUMNS):
                model, dataset = ROWS[row]
                knobs = (("dataset", dataset), ("system", system))
                point = GridPoint(framework, model, 32, 1, gpus, knobs=knobs)
                atomic_write_json(record_path(STUDY, point, root), record(framework, row, column))
                written += 1
    print(f"wrote {written} seed 004 records under {root}/{STUDY}/runs/")


if __name__ == "__main__":
    main()
