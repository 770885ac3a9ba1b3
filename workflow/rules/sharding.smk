# A study of text models at several sizes: peak memory per replica against
# parameters per scheme, where each starts to save memory against DDP, and
# the largest model each fits.


rule sharding:
    input:
        tidy=f"{RESULTS}/throughput.csv",
    output:
        tables=[
            report(path, category="Tables", caption="../report/sharding.rst")
            for path in FILES.sharding_files()[0]
        ],
        figures=[
            report(path, category="Figures", caption="../report/sharding.rst")
            for path in FILES.sharding_files()[1]
        ],
    log:
        f"{RESULTS}/logs/sharding.log",
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    params:
        # results/{study}: the tables go to its tables/ folder.
        folder=lambda wildcards, input: os.path.dirname(input.tidy),
        memory_limit_gib=config["figures"]["memory_limit_gib"],
    script:
        "../scripts/sharding.py"
