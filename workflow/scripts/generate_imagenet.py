import os
import sys

sys.stderr = open(snakemake.log[0], "w")

from trainscale.core.imagenet import IMAGENET_LIKE_SIDES, WNIDS, generate_imagenet

generate_imagenet(
    os.path.dirname(snakemake.output.marker),
    classes=len(WNIDS),
    per_class=snakemake.params.per_class,
    seed=snakemake.params.seed,
    sides=IMAGENET_LIKE_SIDES,
)
