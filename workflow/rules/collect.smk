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
        # What each record must have been measured with (collect refuses others).
        expected=lambda wildcards: {
            record_path(STUDY, point): run_settings(config, point).to_dict()
            for point in POINTS
        },
    script:
        "../scripts/collect.py"
