import sys

sys.stderr = open(snakemake.log[0], "w")
sys.stdout = sys.stderr

from trainscale.analysis.sharding_report import write_sharding

write_sharding(
    snakemake.input.tidy,
    snakemake.params.folder,
    list(snakemake.output.figures),
    snakemake.params.memory_limit_gib or None,
)
