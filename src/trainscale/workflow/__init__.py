"""The workflow's side of the package: a study as the Snakemake workflow
(Snakefile, workflow/rules/) runs it. common.smk validates the config and
makes one call, workflow_study.WorkflowStudy.load; the rule files read its
points, files, commands and flags."""
