# The paper's tables: CSV numbers, Markdown and LaTeX (booktabs) renderings.


rule tables:
    input:
        tidy=f"{RESULTS}/throughput.csv",
        reference=FILES.reference_record_files(),
    output:
        tables=[
            report(path, category="Tables", caption="../report/tables.rst")
            for path in FILES.table_files()
        ],
    log:
        f"{RESULTS}/logs/tables.log",
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    params:
        reference=config.get("reference"),
        framework=config["figures"]["weak_scaling_framework"],
        folder=lambda wildcards, output: os.path.dirname(output[0]),
    script:
        "../scripts/tables.py"
