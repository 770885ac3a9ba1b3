import sys

sys.stderr = open(snakemake.log[0], "w")
sys.stdout = sys.stderr

from trainscale.analysis.tables import write_tables

write_tables(
    snakemake.input.tidy,
    snakemake.params.folder,
    snakemake.params.reference,
    snakemake.params.framework,
    list(snakemake.input.reference),
)
