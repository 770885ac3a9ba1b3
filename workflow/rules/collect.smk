# All records -> one tidy row per run.


rule collect:
    input:
        records=FILES.record_files(),
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
        study=STUDY.name,
        # What each record must have been measured with (collect refuses others).
        expected=lambda wildcards: STUDY.expected_settings(),
        # Each record's knobs are read from its settings (tidy.record_knobs).
        knob_axes=STUDY.knob_axes,
    script:
        "../scripts/collect.py"
