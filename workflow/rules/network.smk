# The network probe (trainscale probe): each network of the grid x each
# transport its frameworks talk over, on one node and across two, run as a
# job of its own on the nodes and through the launcher the training ranks use;
# then the network table and figure (seed 002's Fig. 2).


rule probe:
    output:
        record=f"{RESULTS}/{PROBE_PATTERN}.json",
    log:
        f"{RESULTS}/logs/{PROBE_PATTERN}.log",
    conda:
        conda_file("torch_env")
    container:
        TRAIN_CONTAINER
    threads: lambda wildcards: int(wildcards.ranks_per_node)
    resources:
        nodes=lambda wildcards: probe_slurm(wildcards)["nodes"],
        tasks=lambda wildcards: probe_slurm(wildcards)["tasks"],
        tasks_per_node=lambda wildcards: probe_slurm(wildcards)["tasks_per_node"],
        tasks_per_gpu=lambda wildcards: probe_slurm(wildcards)["tasks_per_gpu"],
        mpi=lambda wildcards: probe_slurm(wildcards)["mpi"],
        cpus_per_task=lambda wildcards: probe_slurm(wildcards)["cpus_per_task"],
        gres=lambda wildcards: probe_slurm(wildcards)["gres"],
        mem_mb=lambda wildcards: probe_slurm(wildcards)["mem_mb"],
        runtime=lambda wildcards: probe_slurm(wildcards)["runtime"],
        slurm_partition=lambda wildcards: probe_slurm(wildcards)["slurm_partition"],
        slurm_account=lambda wildcards: probe_slurm(wildcards)["slurm_account"],
        qos=lambda wildcards: probe_slurm(wildcards)["qos"],
        slurm_extra=lambda wildcards: probe_slurm(wildcards)["slurm_extra"],
        # Probes and benchmarks must not share a machine (as train jobs).
        benchmark_slots=1,
    params:
        trainscale=probe_command,
        node_check=node_check(probe_command),
        network=probe_network_prefix,
        options=probe_options,
    shell:
        "exec > {log} 2>&1; {params.node_check}{params.network}{params.trainscale} probe {params.options} --output {output.record}"


rule network:
    input:
        probes=probe_files(),
    output:
        tables=[
            report(path, category="Tables", caption="../report/network.rst")
            for path in network_table_files()
        ],
        figure=report(
            figure_file(outputs.NETWORK, "png"),
            category="Figures",
            caption="../report/network.rst",
        ),
        pdf=figure_file(outputs.NETWORK, "pdf"),
    log:
        f"{RESULTS}/logs/network.log",
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    params:
        rated=rated_network_speeds(),
        folder=lambda wildcards, output: os.path.dirname(output.tables[0]),
    script:
        "../scripts/network.py"
