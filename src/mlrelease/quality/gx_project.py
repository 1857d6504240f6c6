"""The versioned Great Expectations project (`config/gx/`): its suites and checkpoints, run on one partition.

The reviewed files stay read-only: each run works on its own copy under the run's artifacts, where GX
keeps its validation results and builds the Data Docs site that is the run's data-quality report.
"""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from pathlib import Path
from typing import Any

CHECKPOINT = "{table}_partition"  # one checkpoint per table: each run validates one partition's batch
SPARK_SOURCE = "spark_sources"  # the Spark twin of great_expectations.yml's pandas `sources`


class GxProject:
    """A run's copy of the GX file project, opened as a file data context."""

    def __init__(self, source: Path, workdir: Path, engine: str = "pandas") -> None:
        warnings.filterwarnings("ignore", module="great_expectations")
        logging.getLogger("great_expectations").setLevel(logging.ERROR)
        import great_expectations as gx
        from great_expectations.data_context.types.base import ProgressBarsConfig

        if workdir.exists():
            shutil.rmtree(workdir)  # a rerun starts from the reviewed files again
        shutil.copytree(source, workdir / "gx")
        self.root = workdir / "gx"
        self.context = gx.get_context(mode="file", project_root_dir=str(workdir))
        self.context.variables.progress_bars = ProgressBarsConfig(globally=False)
        self.engine = engine

    def suite(self, table: str) -> dict[str, Any]:
        """The table's suite as stored (kwargs still hold their `$PARAMETER` references)."""
        return json.loads((self.root / "expectations" / f"{table}.json").read_text(encoding="utf-8"))

    def validate(self, table: str, batch: Any, parameters: dict[str, Any], run_name: str) -> dict[str, Any]:
        """Run the table's checkpoint on one batch (a pandas or Spark DataFrame); its validation result as JSON."""
        from great_expectations.core.run_identifier import RunIdentifier

        checkpoint = self._checkpoint(table)
        result = checkpoint.run(
            batch_parameters={"dataframe": batch},
            expectation_parameters=parameters,
            run_id=RunIdentifier(run_name=run_name),
        )
        (validation,) = result.run_results.values()
        return validation.to_json_dict()

    def _checkpoint(self, table: str) -> Any:
        """The table's checkpoint; on Spark, its twin over a Spark dataframe asset with the same suite and format.

        Made in this run's copy on first use, so the reviewed files hold one suite per table for both engines.
        """
        pandas_checkpoint = self.context.checkpoints.get(CHECKPOINT.format(table=table))
        if self.engine == "pandas":
            return pandas_checkpoint
        import great_expectations as gx

        name = f"{CHECKPOINT.format(table=table)}_{self.engine}"
        try:
            return self.context.checkpoints.get(name)
        except gx.exceptions.DataContextError:
            pass
        source: Any
        try:
            source = self.context.data_sources.get(SPARK_SOURCE)
        except KeyError:
            source = self.context.data_sources.add_spark(SPARK_SOURCE)
        batch = source.add_dataframe_asset(table).add_batch_definition_whole_dataframe("partition")
        definition = self.context.validation_definitions.add(
            gx.ValidationDefinition(name=f"{table}_{self.engine}", data=batch, suite=self.context.suites.get(table))
        )
        checkpoint = gx.Checkpoint(
            name=name, validation_definitions=[definition], result_format=pandas_checkpoint.result_format, actions=[]
        )
        return self.context.checkpoints.add(checkpoint)

    def build_docs(self) -> Path:
        """Build the Data Docs site from this run's validation results; the path of its index page."""
        self.context.build_data_docs()
        return self.root / "uncommitted" / "data_docs" / "local_site" / "index.html"
