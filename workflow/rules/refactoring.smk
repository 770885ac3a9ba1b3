# The paper's other half (seed 000, section III): how much each framework's
# example script (examples/) changes its single-device base, as a table, and
# the two side by side per framework.


rule refactoring:
    input:
        examples=FILES.example_files(),
    output:
        tables=[
            report(path, category="Tables", caption="../report/refactoring.rst")
            for path in FILES.refactoring_files()[0]
        ],
        diffs=[
            report(
                path, category="Refactoring", caption="../report/refactoring_diff.rst"
            )
            for path in FILES.refactoring_files()[1]
        ],
    log:
        f"{RESULTS}/logs/refactoring.log",
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    params:
        frameworks=FILES.refactored,
        folder=lambda wildcards, output: os.path.dirname(output.tables[0]),
        # A study of base frameworks only has no diffs.
        diff_folder=lambda wildcards, output: (
            os.path.dirname(output.diffs[0]) if output.diffs else ""
        ),
        examples_dir=lambda wildcards, input: os.path.dirname(input.examples[0]),
    script:
        "../scripts/refactoring.py"
