import sys

sys.stderr = open(snakemake.log[0], "w")
sys.stdout = sys.stderr

from trainscale.analysis.predict_report import write_predictions

write_predictions(
    snakemake.input.tidy,
    snakemake.params.folder,
    [snakemake.output.figure, snakemake.output.pdf],
    nodes=snakemake.params.nodes,
    gpus_per_node=snakemake.params.gpus_per_node,
    link=snakemake.params.link,
    probe_paths=list(snakemake.input.probes),
)
