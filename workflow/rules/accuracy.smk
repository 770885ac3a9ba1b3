# An accuracy study (benchmark.mode: accuracy): accuracy and time-to-target
# tables, the ranks table, and test accuracy against wall time.


rule accuracy:
    input:
        records=FILES.record_files(),
    output:
        runs=f"{RESULTS}/accuracy.csv",
        curves=f"{RESULTS}/curves.csv",
        tables=[
            report(path, category="Tables", caption="../report/accuracy.rst")
            for path in FILES.accuracy_files()[0]
        ],
        figures=[
            report(path, category="Figures", caption="../report/accuracy.rst")
            for path in FILES.accuracy_files()[1]
        ],
    log:
        f"{RESULTS}/logs/accuracy.log",
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    params:
        study=STUDY.name,
        knob_axes=STUDY.knob_axes,
        folder=lambda wildcards, output: os.path.dirname(output.runs),
    script:
        "../scripts/accuracy.py"
