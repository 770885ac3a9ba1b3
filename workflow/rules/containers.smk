# A study with a container axis (grid `container:`): each runtime against the
# bare host, the same points (seed 002's Fig. 3).


rule containers:
    input:
        records=FILES.record_files(),
        probes=FILES.probe_files,
    output:
        tables=[
            report(path, category="Tables", caption="../report/containers.rst")
            for path in FILES.containers_files()[0]
        ],
        figures=[
            report(path, category="Figures", caption="../report/containers.rst")
            for path in FILES.containers_files()[1]
        ],
    log:
        f"{RESULTS}/logs/containers.log",
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    params:
        folder=lambda wildcards, output: os.path.dirname(output.tables[0]),
    script:
        "../scripts/containers.py"
