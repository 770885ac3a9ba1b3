import sys

sys.stderr = open(snakemake.log[0], "w")
sys.stdout = sys.stderr

from trainscale.analysis.refactoring_report import write_refactoring

write_refactoring(
    snakemake.params.frameworks,
    snakemake.params.folder,
    examples_dir=snakemake.params.examples_dir,
    diff_folder=snakemake.params.diff_folder,
)
