import sys

sys.stderr = open(snakemake.log[0], "w")
sys.stdout = sys.stderr

from trainscale.analysis.network_report import write_network

write_network(
    list(snakemake.input.probes),
    snakemake.params.folder,
    [snakemake.output.figure, snakemake.output.pdf],
    snakemake.params.rated,
)
