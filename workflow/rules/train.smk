# One grid point -> one run record. Locally `trainscale run` starts every
# process of the point on this machine; the record is written atomically.


rule train:
    input:
        # ancient: a regenerated (identical, seeded) archive never reruns a measurement.
        data=lambda wildcards: [ancient(GENERATED_DATA)] if GENERATED_DATA else [],
    output:
        record=f"{RESULTS}/runs/{{framework}}/{{model}}/b{{batch_size}}/n{{nodes}}g{{gpus_per_node}}r{{repeat}}.json",
    log:
        f"{RESULTS}/logs/train/{{framework}}/{{model}}/b{{batch_size}}/n{{nodes}}g{{gpus_per_node}}r{{repeat}}.log",
    conda:
        "../../envs/train.yaml"
    container:
        TRAIN_CONTAINER
    threads: lambda wildcards: int(wildcards.gpus_per_node)
    resources:
        nodes=lambda wildcards: shape(wildcards)["nodes"],
        tasks=lambda wildcards: shape(wildcards)["tasks"],
        tasks_per_node=lambda wildcards: shape(wildcards)["tasks_per_node"],
        cpus_per_task=lambda wildcards: shape(wildcards)["cpus_per_task"],
        gres=lambda wildcards: shape(wildcards)["gres"] or "",
        mem_mb=lambda wildcards: shape(wildcards)["mem_mb"],
        runtime=lambda wildcards, attempt: job_shape(
            config, point_of(wildcards), attempt
        )["runtime"],
        # A benchmark must not share its machine with another benchmark: the
        # local profile offers one slot (--resources benchmark_slots=1).
        benchmark_slots=1,
    params:
        trainscale=TRAINSCALE,
        options=lambda wildcards: train_arguments(config, point_of(wildcards)),
    shell:
        "{params.trainscale} run {params.options} --output {output.record} > {log} 2>&1"


rule generate_cifar100:
    output:
        archive=f"{config['benchmark']['data_dir']}/cifar-100-python.tar.gz",
    log:
        f"{RESULTS}/logs/generate_cifar100.log",
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    params:
        images=config["benchmark"].get("generate_cifar100_images"),
        seed=config["benchmark"]["seed"],
    script:
        "../scripts/generate_cifar100.py"
