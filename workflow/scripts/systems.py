import sys

sys.stderr = open(snakemake.log[0], "w")
sys.stdout = sys.stderr

from trainscale.analysis.systems_report import write_systems

write_systems(
    list(snakemake.input.records),
    snakemake.config,
    snakemake.params.folder,
    list(snakemake.output.figures),
)
