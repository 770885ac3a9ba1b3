# What the study will cost before it is submitted. Needs neither SLURM nor TensorFlow.


rule plan:
    output:
        plan=f"{RESULTS}/plan.csv",
    log:
        f"{RESULTS}/logs/plan.log",
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    params:
        # A cached study's foreign frameworks have no job to plan.
        rows=STUDY.plan_rows(),
        study=STUDY.name,
    script:
        "../scripts/plan.py"
