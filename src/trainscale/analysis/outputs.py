"""The names of the files a study's analysis writes under results/{study}/,
declared once: the writers (tables, figures, predict_report, predict_probe,
accuracy_report, network_report, refactoring) name their files from here, and
the workflow's rules list their outputs from here."""

from __future__ import annotations

TABLE_FORMATS = ("csv", "md", "tex")
FIGURE_FORMATS = ("png", "pdf")

# tables.write_tables; vs_reference only with a reference study.
TABLE1, TABLE2, EFFICIENCY, CROSS_ECOSYSTEM = "table1", "table2", "efficiency", "cross_ecosystem"
VS_REFERENCE = "vs_reference"
STUDY_TABLES = (TABLE1, TABLE2, EFFICIENCY, CROSS_ECOSYSTEM)

# figures.write_figures; vs_reference only with a reference study.
WEAK_SCALING_HOSTS, WEAK_SCALING_GPUS = "weak_scaling_hosts", "weak_scaling_gpus"
FRAMEWORKS, MFU, MEMORY = "frameworks", "mfu", "memory"
REFACTORING_TRADEOFF = "refactoring_tradeoff"
STUDY_FIGURES = (WEAK_SCALING_HOSTS, WEAK_SCALING_GPUS, EFFICIENCY, FRAMEWORKS, MFU, MEMORY)

# refactoring_report.write_refactoring: two tables (and a diff per example)
REFACTORING, REFACTORING_HIGH_LEVEL = "refactoring", "refactoring_high_level"
# predict_report.write_predictions: four tables and a figure
PREDICTED, PREDICTED_PARAMETERS, PREDICTED_HOLDOUT, PREDICTED_CROSSOVER = (
    "predicted",
    "predicted_parameters",
    "predicted_holdout",
    "predicted_crossover",
)
PREDICTED_TABLES = (PREDICTED, PREDICTED_PARAMETERS, PREDICTED_HOLDOUT, PREDICTED_CROSSOVER)
# predict_probe.write_probe_comparison
PREDICTED_VS_PROBE = "predicted_vs_probe"
# accuracy_report.write_accuracy: three tables and a figure
ACCURACY, RANKS, ACCURACY_PER_CLASS = "accuracy", "ranks", "accuracy_per_class"
# network_report.write_network: a table and a figure
NETWORK = "network"
# recovery_report.write_recovery (a study with a fault): two tables and a figure
RECOVERY, GOODPUT, RECOVERY_TIMELINE = "recovery", "goodput", "recovery_timeline"
# sharding_report.write_sharding (a study of text models at 2 or more sizes):
# two tables and a figure named like the first
SHARDING_MEMORY, SHARDING_CROSSOVER = "sharding_memory", "sharding_crossover"
# ... and the memory model against the runs' live tensor bytes (memory_check)
MEMORY_MODEL_CHECK = "memory_model_check"
# containers_report.write_containers (a study with a container axis): a table and a figure
CONTAINERS = "containers"
# systems_report.write_systems (a study with two or more systems): a table and a figure
SYSTEMS = "systems"
# input_report.write_input_pipeline (a study that decodes ImageNet's files): a table and a figure
INPUT_PIPELINE = "input_pipeline"


def study_tables(reference: bool) -> list[str]:
    return [*STUDY_TABLES, *([VS_REFERENCE] if reference else [])]


def study_figures(reference: bool) -> list[str]:
    return [*STUDY_FIGURES, REFACTORING_TRADEOFF, *([VS_REFERENCE] if reference else [])]


def table_files(folder: str, names) -> list[str]:
    """folder/tables/NAME.{csv,md,tex} for each name."""
    return [f"{folder}/tables/{n}.{ext}" for n in names for ext in TABLE_FORMATS]


def figure_files(folder: str, names, formats=FIGURE_FORMATS) -> list[str]:
    """folder/figures/NAME.{png,pdf} for each name."""
    return [f"{folder}/figures/{n}.{ext}" for n in names for ext in formats]
