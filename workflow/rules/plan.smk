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
        rows=[
            {
                **point.as_dict(),
                **job_shape(config, point),
                "record": record_path(STUDY, point),
            }
            # A cached study's foreign frameworks have no job to plan.
            for point in RUNNABLE
        ],
        study=STUDY,
    script:
        "../scripts/plan.py"
