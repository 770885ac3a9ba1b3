# Scaling past the measured cells: a step model fitted to the study's records,
# its predictions for the config's `predict` grid, its parameters, and its
# error on the larger cells when fitted on the smaller ones (trainscale.analysis.predict).


rule predict:
    input:
        tidy=f"{RESULTS}/throughput.csv",
        # With `predict.link: probe` the inter-node link is the probe's.
        probes=FILES.probe_files if config["predict"]["link"] == "probe" else [],
    output:
        tables=[
            report(path, category="Tables", caption="../report/predicted.rst")
            for path in FILES.predicted_table_files()
        ],
        figure=report(
            FILES.figure_file(outputs.PREDICTED, "png"),
            category="Figures",
            caption="../report/predicted.rst",
        ),
        pdf=FILES.figure_file(outputs.PREDICTED, "pdf"),
    log:
        f"{RESULTS}/logs/predict.log",
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    params:
        nodes=config["predict"]["nodes"],
        gpus_per_node=config["predict"]["gpus_per_node"],
        link=config["predict"]["link"],
        folder=lambda wildcards, output: os.path.dirname(output.tables[0]),
    script:
        "../scripts/predict.py"


# The fitted inter-node link beside the network probe's, where the study ran
# one (trainscale.analysis.predict_probe); a study without probes says so.
rule predict_vs_probe:
    input:
        tidy=f"{RESULTS}/throughput.csv",
        probes=FILES.probe_files,
    output:
        tables=[
            report(path, category="Tables", caption="../report/predicted.rst")
            for path in FILES.probe_comparison_files()
        ],
    log:
        f"{RESULTS}/logs/predict_vs_probe.log",
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    params:
        folder=lambda wildcards, output: os.path.dirname(output.tables[0]),
    script:
        "../scripts/predict_probe.py"
