# A study with a fault (grid `fault:`): what it cost each framework, the
# expected goodput at a failure rate, and throughput over wall time.


rule recovery:
    input:
        records=FILES.record_files(),
    output:
        tables=[
            report(path, category="Tables", caption="../report/recovery.rst")
            for path in FILES.recovery_files()[0]
        ],
        figures=[
            report(path, category="Figures", caption="../report/recovery.rst")
            for path in FILES.recovery_files()[1]
        ],
    log:
        f"{RESULTS}/logs/recovery.log",
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    params:
        folder=lambda wildcards, output: os.path.dirname(output.tables[0]),
    script:
        "../scripts/recovery.py"
