import sys

sys.stderr = open(snakemake.log[0], "w")
sys.stdout = sys.stderr

from trainscale.analysis.figures import write_figures

write_figures(
    snakemake.input.tidy,
    snakemake.params.folder,
    snakemake.params.reference,
    snakemake.params.framework,
    list(snakemake.input.reference),
    workers=snakemake.threads,
    refactoring_csv=snakemake.input.refactoring,
)
