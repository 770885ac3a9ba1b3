# A study with two systems or more (grid `system:`, cluster.systems): the same
# points on each node type, side by side (seed 004's Titan RTX and V100 nodes).


rule systems:
    input:
        records=FILES.record_files(),
    output:
        tables=[
            report(path, category="Tables", caption="../report/systems.rst")
            for path in FILES.systems_files()[0]
        ],
        figures=[
            report(path, category="Figures", caption="../report/systems.rst")
            for path in FILES.systems_files()[1]
        ],
    log:
        f"{RESULTS}/logs/systems.log",
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    params:
        folder=lambda wildcards, output: os.path.dirname(output.tables[0]),
    script:
        "../scripts/systems.py"
