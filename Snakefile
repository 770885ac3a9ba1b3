# trainscale: the scaling study as a Snakemake workflow.
#   snakemake -n --profile profiles/slurm      inspect the paper's job grid
#   snakemake --profile profiles/local          run the scaled-down CPU study
#   snakemake --cores 1 --configfile results/published/config.yaml
#                                              rebuild the paper's tables from its cache
from snakemake.utils import min_version

min_version("9.0")


# A study given with --configfile replaces config.yaml (profiles/default:
# replace-workflow-config). Snakemake does not pass that setting on to a
# cluster job's own Snakemake, which would merge config.yaml back under the
# study (a text study's image_size 0 would read 224 there): so config.yaml
# is read only when no config file is given.
if not workflow.overwrite_configfiles:

    configfile: "config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"


# A study folder holding records trainscale did not measure (the published
# cache) is read-only: it has no train rule, so no job can write into it,
# not even under --forcerun.
if not STUDY.folder.read_only:

    include: "workflow/rules/train.smk"
    include: "workflow/rules/network.smk"


include: "workflow/rules/collect.smk"
include: "workflow/rules/tables.smk"
include: "workflow/rules/refactoring.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/predict.smk"
include: "workflow/rules/plan.smk"
include: "workflow/rules/accuracy.smk"
include: "workflow/rules/recovery.smk"
include: "workflow/rules/sharding.smk"
include: "workflow/rules/containers.smk"
include: "workflow/rules/systems.smk"
include: "workflow/rules/input_pipeline.smk"


onstart:
    on_start()


onerror:
    on_error()


rule all:
    default_target: True
    input:
        FILES.all_outputs(),
