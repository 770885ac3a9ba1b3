import os
import sys

sys.stderr = open(snakemake.log[0], "w")

from trainscale.core.datasets import write_digits

write_digits(os.path.dirname(snakemake.output[0]))
