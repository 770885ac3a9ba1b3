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
        STUDY.conda_file("torch_env")
    container:
        config.get("train_container")
    threads: lambda wildcards: int(wildcards.ranks_per_node)
    resources:
        nodes=lambda wildcards: probe(wildcards)["slurm"]["nodes"],
        tasks=lambda wildcards: probe(wildcards)["slurm"]["tasks"],
        tasks_per_node=lambda wildcards: probe(wildcards)["slurm"]["tasks_per_node"],
        tasks_per_gpu=lambda wildcards: probe(wildcards)["slurm"]["tasks_per_gpu"],
        mpi=lambda wildcards: probe(wildcards)["slurm"]["mpi"],
        cpus_per_task=lambda wildcards: probe(wildcards)["slurm"]["cpus_per_task"],
        gres=lambda wildcards: probe(wildcards)["slurm"]["gres"],
        mem_mb=lambda wildcards: probe(wildcards)["slurm"]["mem_mb"],
        runtime=lambda wildcards: probe(wildcards)["slurm"]["runtime"],
        slurm_partition=lambda wildcards: probe(wildcards)["slurm"]["slurm_partition"],
        slurm_account=lambda wildcards: probe(wildcards)["slurm"]["slurm_account"],
        qos=lambda wildcards: probe(wildcards)["slurm"]["qos"],
        slurm_extra=lambda wildcards: probe(wildcards)["slurm"]["slurm_extra"],
        # Probes and benchmarks must not share a machine (as train jobs).
        benchmark_slots=1,
    params:
        trainscale=lambda wildcards: probe(wildcards)["trainscale"],
        node_check=lambda wildcards: probe(wildcards)["node_check"],
        network=lambda wildcards: probe(wildcards)["environment"],
        options=lambda wildcards: probe(wildcards)["options"],
    shell:
        "exec > {log} 2>&1; {params.node_check}{params.network}{params.trainscale} probe {params.options} --output {output.record}"


rule network:
    input:
        probes=FILES.probe_files,
    output:
        tables=[
            report(path, category="Tables", caption="../report/network.rst")
            for path in FILES.network_table_files()
        ],
        figure=report(
            FILES.figure_file(outputs.NETWORK, "png"),
            category="Figures",
            caption="../report/network.rst",
        ),
        pdf=FILES.figure_file(outputs.NETWORK, "pdf"),
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
