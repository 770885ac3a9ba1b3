"""Write the paper's published numbers (seed 000) as cached trainscale records.

The numbers are copied exactly as printed in Tables I and II of Raayai
Ardakani, "Performance Comparison and Code Refactoring Analysis of Distributed
Tensorflow and Horovod DNN Training with Custom Training Loop API"
(VGG-16, CIFAR-100 at 224x224, batch 64 per GPU, Adam; V100-SXM2 GPUs, a
12-GPU limit per user; TensorFlow 2.0.0, Horovod 0.19.0).

Run from the repository root:  python tools/make-published-records.py
It rewrites results/published/runs/ (the records are committed; this script
documents and reproduces them).
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from trainscale.catalogue.settings import RunSettings  # noqa: E402
from trainscale.core.records import atomic_write_json, record_head  # noqa: E402
from trainscale.study.study import GridPoint, record_path  # noqa: E402

PAPER = (
    "Raayai Ardakani, Performance Comparison and Code Refactoring Analysis of Distributed "
    "Tensorflow and Horovod DNN Training with Custom Training Loop API"
)

# Table II: Horovod, rows = GPUs per node, columns = nodes (mean, std).
TABLE_II = {
    1: [(272.445, 25.582), (472.425, 26.247), (702.127, 26.435), (924.093, 66.829)],
    2: [(451.698, 17.742), (910.767, 42.640), (1321.872, 86.017), (1768.105, 171.072)],
    3: [(677.059, 26.387), (1300.992, 89.301), (1956.980, 130.057), (2436.152, 187.640)],
    4: [(894.088, 41.936), (1734.713, 107.277), (2428.542, 189.716)],
    5: [(1114.151, 52.754), (1855.495, 136.407)],
    6: [(1332.648, 68.411), (2385.434, 197.324)],
    7: [(1487.610, 58.900)],
}
# Table I, "Distributed Tensorflow" column (MirroredStrategy), one node, 1-4 GPUs.
TABLE_I_TENSORFLOW = [(256.676, 33.711), (458.816, 2.550), (694.008, 5.072), (929.747, 6.866)]

PROVENANCE = {
    "paper": PAPER,
    # Section V says 4 GPUs per node, yet Table II reports up to 7 on one node.
    "gpu": "NVIDIA V100-SXM2 (paper: 4 per node; Table II reaches 7 GPUs on one node)",
    "interconnect": "Intel Ethernet 10G 2P X520",
    "cpu": "Intel Xeon Gold 6132 @ 2.60GHz",
    "tensorflow": "2.0.0",
    "horovod": "0.19.0",
    "cuda": "10.0",
    "cudnn": "7",
    "nccl": "2.5.6-1",
    "os": "CentOS 7",
    "note": "2 epochs, 2000 iterations per replica; per-block samples were not published",
}


def record(framework, nodes, gpus_per_node, mean, std, where):
    settings = RunSettings(
        framework=framework,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        model="vgg16",
        batch_size=64,
        image_size=224,
        dataset="cifar100",
        device="gpu",
        optimizer="adam",
    )
    return {
        **record_head(settings, "ok"),
        # What the paper ran: one process per Horovod rank, one for MirroredStrategy.
        "processes": settings.replicas if framework == "horovod" else 1,
        # The paper gives no settings hash: its settings are what it states.
        "settings_hash": "published",
        "images_per_sec": {"mean": mean, "std": std, "samples": []},
        "per_replica_images_per_sec": {"mean": mean / settings.replicas, "std": None},
        "source": f"published: seed 000, {where}",
        "provenance": PROVENANCE,
    }


def main(root="results"):
    written = 0
    for gpus_per_node, row in TABLE_II.items():
        for nodes, (mean, std) in enumerate(row, start=1):
            where = f"Table II ({gpus_per_node} GPU row, {nodes} node column)"
            point = GridPoint("horovod", "vgg16", 64, nodes, gpus_per_node)
            atomic_write_json(
                record_path("published", point, root),
                record("horovod", nodes, gpus_per_node, mean, std, where),
            )
            written += 1
    for gpus, (mean, std) in enumerate(TABLE_I_TENSORFLOW, start=1):
        point = GridPoint("tf-mirrored", "vgg16", 64, 1, gpus)
        where = f"Table I (Distributed Tensorflow, {gpus} GPUs)"
        atomic_write_json(
            record_path("published", point, root),
            record("tf-mirrored", 1, gpus, mean, std, where),
        )
        written += 1
    print(f"wrote {written} published records under {root}/published/runs/")


if __name__ == "__main__":
    main()
