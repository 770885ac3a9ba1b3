# The paper's weak-scaling figures, efficiency, the framework comparison,
# throughput against refactoring effort and (with a reference study)
# measured vs reference.


rule figures:
    input:
        tidy=f"{RESULTS}/throughput.csv",
        reference=FILES.reference_record_files(),
        refactoring=f"{RESULTS}/tables/{outputs.REFACTORING}.csv",
    output:
        figures=[
            report(path, category="Figures", caption="../report/figures.rst")
            for path in FILES.figure_files(("png",))
        ]
        + FILES.figure_files(("pdf",)),
    log:
        f"{RESULTS}/logs/figures.log",
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    # Figures are drawn side by side, one process each (trainscale.analysis.figures).
    threads: 2
    params:
        reference=config.get("reference"),
        framework=config["figures"]["weak_scaling_framework"],
        folder=lambda wildcards, output: os.path.dirname(output[0]),
    script:
        "../scripts/figures.py"
