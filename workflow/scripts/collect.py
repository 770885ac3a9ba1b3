import sys

sys.stderr = open(snakemake.log[0], "w")
sys.stdout = sys.stderr

from trainscale.analysis.tidy import write_throughput

write_throughput(
    snakemake.params.study,
    list(snakemake.input.records),
    snakemake.output.tidy,
    snakemake.params.expected,
    snakemake.params.knob_axes,
)
