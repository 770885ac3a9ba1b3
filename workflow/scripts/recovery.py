import sys

sys.stderr = open(snakemake.log[0], "w")
sys.stdout = sys.stderr

from trainscale.analysis.recovery_report import write_recovery

write_recovery(
    list(snakemake.input.records),
    snakemake.params.folder,
    list(snakemake.output.figures),
)
