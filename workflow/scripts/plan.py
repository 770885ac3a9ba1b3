import sys

log = open(snakemake.log[0], "w")
sys.stderr = log

from trainscale.analysis.tidy import write_plan

summary = write_plan(snakemake.params.study, snakemake.params.rows, snakemake.output.plan)
# The summary goes to the log and to the terminal, where the user is looking.
print(summary, file=log)
print(summary)
