# All records -> one tidy row per run.


rule collect:
    input:
        records=record_files(),
    output:
        tidy=report(
            f"{RESULTS}/throughput.csv",
            category="Data",
            caption="../report/throughput.rst",
        ),
    log:
        f"{RESULTS}/logs/collect.log",
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    params:
        study=STUDY,
    script:
        "../scripts/collect.py"
