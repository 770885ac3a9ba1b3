import sys

sys.stderr = open(snakemake.log[0], "w")
sys.stdout = sys.stderr

from trainscale.analysis.accuracy_report import write_accuracy

write_accuracy(
    snakemake.params.study,
    list(snakemake.input.records),
    snakemake.params.folder,
    snakemake.params.knob_axes,
)
