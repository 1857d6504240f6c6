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

import pandas as pd

CHECKPOINT = "{table}_partition"  # one checkpoint per table: each run validates one partition's batch


class GxProject:
    """A run's copy of the GX file project, opened as a file data context."""

    def __init__(self, source: Path, workdir: Path) -> None:
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

    def suite(self, table: str) -> dict[str, Any]:
        """The table's suite as stored (kwargs still hold their `$PARAMETER` references)."""
        return json.loads((self.root / "expectations" / f"{table}.json").read_text(encoding="utf-8"))

    def validate(self, table: str, batch: pd.DataFrame, parameters: dict[str, Any], run_name: str) -> dict[str, Any]:
        """Run the table's checkpoint on one batch; the JSON of its single validation result."""
        from great_expectations.core.run_identifier import RunIdentifier

        checkpoint = self.context.checkpoints.get(CHECKPOINT.format(table=table))
        result = checkpoint.run(
            batch_parameters={"dataframe": batch},
            expectation_parameters=parameters,
            run_id=RunIdentifier(run_name=run_name),
        )
        (validation,) = result.run_results.values()
        return validation.to_json_dict()

    def build_docs(self) -> Path:
        """Build the Data Docs site from this run's validation results; the path of its index page."""
        self.context.build_data_docs()
        return self.root / "uncommitted" / "data_docs" / "local_site" / "index.html"
