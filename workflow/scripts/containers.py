import sys

sys.stderr = open(snakemake.log[0], "w")
sys.stdout = sys.stderr

from trainscale.analysis.containers_report import write_containers

write_containers(
    list(snakemake.input.records),
    list(snakemake.input.probes),
    snakemake.params.folder,
    list(snakemake.output.figures),
)
