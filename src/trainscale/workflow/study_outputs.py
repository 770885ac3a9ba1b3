"""Every file a study's workflow makes, by analysis: which analyses the study
has (an accuracy study, a fault, two text-model sizes, a container axis, two
systems, the network probes, a reference study) and each one's tables and figures, named
by trainscale.analysis.outputs. `all_outputs` is what `rule all` asks for.

Pure Python, from the study's config and grid points (workflow_study reads
it once for common.smk); an analysis the study does not have has no files.
"""

from __future__ import annotations

import os

from trainscale.analysis import outputs
from trainscale.catalogue.registry import base_of, framework_spec, table_order
from trainscale.core.datasets import DATASETS
from trainscale.core.gpt import TEXT_MODELS
from trainscale.core.records import record_paths
from trainscale.launching.examples import examples_of
from trainscale.study.study import record_path

Files = tuple[list[str], list[str]]  # (tables, figures)


class StudyOutputs:
    """The files of a study of `points`; `runnable`: the settings of each
    point trainscale runs (a cached study may name frameworks it does not,
    seed 004's Ray Train, whose records are only read); its probes' files
    `probe_files` (relative to the working directory, as Snakemake names them)."""

    def __init__(
        self, config: dict, points: list, runnable: dict, probe_files: list[str], examples: str
    ):
        self.config = config
        self.points = points
        self.results = f"results/{config['study']}"
        self.reference = config.get("reference")
        self.probe_files = probe_files
        settings = runnable.values()
        self.accuracy = config["benchmark"]["mode"] == "accuracy"
        # A fault in the grid (trainscale.core.faults): what recovery cost.
        self.faulted = any(s.fault != "none" for s in settings)
        # Text models at 2 or more sizes: a sharding-memory study.
        self.sharded = len({p.model for p in runnable if p.model in TEXT_MODELS}) >= 2
        # A container axis: what each runtime cost against the bare host.
        self.contained = any(s.container != "none" for s in settings)
        # Two node types or more (cluster.systems): the same points on each.
        self.systems = len({s.system for s in settings}) >= 2
        # Files decoded while training (core.imagenet): the input pipeline's cost.
        self.decoded = any(DATASETS[s.dataset].streams for s in settings)
        # The refactoring analysis: the study's frameworks and each one's
        # single-device base (what its example changes), in table order.
        frameworks = {p.framework for p in runnable}
        # Each framework's base, and the custom loop a high-level API's replaces.
        related = {base_of(f) for f in frameworks}
        related |= {framework_spec(f).replaces for f in frameworks}
        self.refactored = sorted((frameworks | related) - {""}, key=table_order)
        self.examples = examples

    def record_files(self) -> list[str]:
        return [record_path(self.config["study"], point) for point in self.points]

    def reference_record_files(self) -> list[str]:
        """The reference study's cached records (read, never produced, here)."""
        return record_paths(f"results/{self.reference}/runs") if self.reference else []

    def table_files(self) -> list[str]:
        return outputs.table_files(self.results, outputs.study_tables(bool(self.reference)))

    def figure_files(self, formats=outputs.FIGURE_FORMATS) -> list[str]:
        figures = outputs.study_figures(bool(self.reference))
        return outputs.figure_files(self.results, figures, formats)

    def figure_file(self, name: str, ext: str) -> str:
        """One figure's file: results/{study}/figures/NAME.EXT."""
        return outputs.figure_files(self.results, [name], (ext,))[0]

    def predicted_table_files(self) -> list[str]:
        return outputs.table_files(self.results, outputs.PREDICTED_TABLES)

    def probe_comparison_files(self) -> list[str]:
        return outputs.table_files(self.results, [outputs.PREDICTED_VS_PROBE])

    def example_files(self) -> list[str]:
        return [e.path(self.examples) for f in self.refactored for e in examples_of(f)]

    def refactoring_files(self) -> Files:
        """refactoring.{csv,md,tex}, and a side-by-side diff per example that
        is not a base."""
        tables = outputs.table_files(
            self.results, [outputs.REFACTORING, outputs.REFACTORING_HIGH_LEVEL]
        )
        folder = os.path.join(self.results, outputs.REFACTORING)
        diffs = [
            f"{folder}/{example.name}.html"
            for f in self.refactored
            for example in examples_of(f)
            if not example.is_base
        ]
        return tables, diffs

    def network_table_files(self) -> list[str]:
        return outputs.table_files(self.results, [outputs.NETWORK])

    def network_files(self) -> list[str]:
        """The probes, and the table and figure made of them (none without probes)."""
        if not self.probe_files:
            return []
        figures = outputs.figure_files(self.results, [outputs.NETWORK])
        return [*self.probe_files, *self.network_table_files(), *figures]

    def _analysis(self, present: bool, tables: list[str], figures: list[str]) -> Files:
        if not present:
            return [], []
        return (
            outputs.table_files(self.results, tables),
            outputs.figure_files(self.results, figures),
        )

    def accuracy_files(self) -> Files:
        """An accuracy study's tables and figure; none for a throughput study."""
        tables = [outputs.ACCURACY, outputs.RANKS, outputs.ACCURACY_PER_CLASS]
        return self._analysis(self.accuracy, tables, [outputs.ACCURACY])

    def recovery_files(self) -> Files:
        tables = [outputs.RECOVERY, outputs.GOODPUT]
        return self._analysis(self.faulted, tables, [outputs.RECOVERY_TIMELINE])

    def sharding_files(self) -> Files:
        tables = [outputs.SHARDING_MEMORY, outputs.SHARDING_CROSSOVER, outputs.MEMORY_MODEL_CHECK]
        return self._analysis(self.sharded, tables, [outputs.SHARDING_MEMORY])

    def containers_files(self) -> Files:
        return self._analysis(self.contained, [outputs.CONTAINERS], [outputs.CONTAINERS])

    def systems_files(self) -> Files:
        return self._analysis(self.systems, [outputs.SYSTEMS], [outputs.SYSTEMS])

    def input_pipeline_files(self) -> Files:
        names = [outputs.INPUT_PIPELINE]
        return self._analysis(self.decoded, names, names)

    def all_outputs(self) -> list[str]:
        """What `rule all` asks for. The records are targets themselves:
        Snakemake does not rebuild a missing intermediate file whose consumers
        are up to date, and a deleted record must be measured again."""
        analyses = [
            self.refactoring_files(),
            self.accuracy_files(),
            self.recovery_files(),
            self.sharding_files(),
            self.containers_files(),
            self.systems_files(),
            self.input_pipeline_files(),
        ]
        return [
            *self.record_files(),
            f"{self.results}/plan.csv",
            f"{self.results}/throughput.csv",
            *self.table_files(),
            *self.predicted_table_files(),
            *self.probe_comparison_files(),
            self.figure_file(outputs.PREDICTED, "png"),
            self.figure_file(outputs.PREDICTED, "pdf"),
            *self.figure_files(),
            *self.network_files(),
            *(path for tables, figures in analyses for path in [*tables, *figures]),
        ]
