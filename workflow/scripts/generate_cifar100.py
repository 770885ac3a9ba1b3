import os
import sys

sys.stderr = open(snakemake.log[0], "w")

from trainscale.core.datasets import generate_cifar100

generate_cifar100(
    os.path.dirname(snakemake.output.archive),
    num_images=snakemake.params.images,
    seed=snakemake.params.seed,
    archive=True,
)
