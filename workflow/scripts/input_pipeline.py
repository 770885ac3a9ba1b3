import sys

sys.stderr = open(snakemake.log[0], "w")
sys.stdout = sys.stderr

from trainscale.analysis.input_report import write_input_pipeline

write_input_pipeline(
    list(snakemake.input.records),
    snakemake.params.folder,
    list(snakemake.output.figures),
)
