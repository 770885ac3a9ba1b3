import sys

sys.stderr = open(snakemake.log[0], "w")
sys.stdout = sys.stderr

from trainscale.analysis.predict_probe import write_probe_comparison

write_probe_comparison(snakemake.input.tidy, list(snakemake.input.probes), snakemake.params.folder)
