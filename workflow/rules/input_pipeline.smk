# A study that decodes ImageNet's files while training (grid or benchmark
# `dataset: imagenet-jpeg` / `imagenet-tfrecord`): each point beside its
# synthetic run, and the pipeline's own rate (seed 002's workload).


rule input_pipeline:
    input:
        records=FILES.record_files(),
    output:
        tables=[
            report(path, category="Tables", caption="../report/input_pipeline.rst")
            for path in FILES.input_pipeline_files()[0]
        ],
        figures=[
            report(path, category="Figures", caption="../report/input_pipeline.rst")
            for path in FILES.input_pipeline_files()[1]
        ],
    log:
        f"{RESULTS}/logs/input_pipeline.log",
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    params:
        folder=lambda wildcards, output: os.path.dirname(output.tables[0]),
    script:
        "../scripts/input_pipeline.py"
