# One grid point -> one run record. Locally `trainscale run` starts every
# process of the point on this machine; the record is written atomically.


rule train:
    input:
        # ancient: a regenerated (identical, seeded) archive never reruns a measurement.
        data=lambda wildcards: [ancient(GENERATED_DATA)] if GENERATED_DATA else [],
    output:
        # knobs_folder: '' or a folder naming the knobs the framework reads.
        record=f"{RESULTS}/runs/{RECORD_PATTERN}.json",
    log:
        f"{RESULTS}/logs/train/{RECORD_PATTERN}.log",
    retries: config["train_retries"]
    conda:
        lambda wildcards: train_job(wildcards)["conda"]
    container:
        config.get("train_container")
    threads: lambda wildcards: int(wildcards.gpus_per_node)
    resources:
        # The job's SLURM shape (see trainscale.study.jobs.slurm_resources); the
        # local executor reads none of these but benchmark_slots.
        nodes=lambda wildcards: slurm(wildcards)["nodes"],
        tasks=lambda wildcards: slurm(wildcards)["tasks"],
        tasks_per_node=lambda wildcards: slurm(wildcards)["tasks_per_node"],
        tasks_per_gpu=lambda wildcards: slurm(wildcards)["tasks_per_gpu"],
        mpi=lambda wildcards: slurm(wildcards)["mpi"],
        cpus_per_task=lambda wildcards: slurm(wildcards)["cpus_per_task"],
        gres=lambda wildcards: slurm(wildcards)["gres"],
        mem_mb=lambda wildcards: slurm(wildcards)["mem_mb"],
        runtime=lambda wildcards, attempt: slurm(wildcards, attempt)["runtime"],
        slurm_partition=lambda wildcards: slurm(wildcards)["slurm_partition"],
        slurm_account=lambda wildcards: slurm(wildcards)["slurm_account"],
        qos=lambda wildcards: slurm(wildcards)["qos"],
        constraint=lambda wildcards: slurm(wildcards)["constraint"],
        slurm_extra=lambda wildcards: slurm(wildcards)["slurm_extra"],
        attempt=lambda wildcards, attempt: attempt,
        # A benchmark must not share its machine with another benchmark: the
        # local profile offers one slot (--resources benchmark_slots=1).
        benchmark_slots=1,
    params:
        trainscale=lambda wildcards: train_job(wildcards)["trainscale"],
        # cluster.environment_check: node: the node's own check, first.
        node_check=lambda wildcards: train_job(wildcards)["node_check"],
        # The network's environment (cluster.networks): srun and mpirun pass
        # it to every rank, and it selects the interface each library uses;
        # and cluster.node_fault_command, where the point's fault loses a node.
        environment=lambda wildcards: train_job(wildcards)["environment"],
        options=lambda wildcards: train_job(wildcards)["options"],
        # The point's container (cluster.containers): every rank runs through it.
        container=lambda wildcards: train_job(wildcards)["container"],
        gpus_per_node=lambda wildcards: train_job(wildcards)["gpus_per_node"],
        timeout=config["benchmark"]["timeout_seconds"],
        collective_timeout=config["benchmark"]["collective_timeout_seconds"],
        # On the last attempt a failure is recorded (status failed, with the
        # log's tail) so that collect, tables and figures go on without it.
        attempts=config["train_retries"] + 1,
    shell:
        "exec > {log} 2>&1; {params.node_check}{params.environment}{params.trainscale} run {params.options} {params.container}--requested-gpus-per-node {params.gpus_per_node} --requested-cpus-per-task {resources.cpus_per_task} --timeout {params.timeout} --collective-timeout {params.collective_timeout} --attempt {resources.attempt} --attempts {params.attempts} --output {output.record}"


rule write_digits:
    output:
        STUDY.digits_files(),
    log:
        f"{RESULTS}/logs/write_digits.log",
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/write_digits.py"


rule write_python_docs:
    output:
        STUDY.python_docs_files(),
    log:
        f"{RESULTS}/logs/write_python_docs.log",
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    script:
        "../scripts/write_python_docs.py"


rule generate_imagenet:
    output:
        marker=STUDY.generated_imagenet_marker(),
    log:
        f"{RESULTS}/logs/generate_imagenet.log",
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    params:
        per_class=config["benchmark"].get("generate_imagenet_images_per_class"),
        seed=config["benchmark"]["seed"],
    script:
        "../scripts/generate_imagenet.py"


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
