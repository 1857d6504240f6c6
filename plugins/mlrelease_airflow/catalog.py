"""The steps a DAG runs as pods, and the DAG params, derived from their one declaration (`mlrelease.stepdefs`).

Arguments are Jinja templates rendered by Airflow per run, so every step is keyed on the run's data
interval (never on the wall clock) and a retry repeats exactly the same work.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mlrelease.stepdefs import STEPS as DECLARED
from mlrelease.stepdefs import RunParam
from mlrelease_airflow.pod_spec import StepPod

STEPS: dict[str, StepPod] = {name: StepPod.of(step) for name, step in DECLARED.items() if step.in_dag}
"""Every step a DAG task may run, by step name (`--stage N` and the like are appended per task by the DAG)."""


def dag_params(params: Iterable[RunParam]) -> dict[str, Any]:
    """The `params` of a DAG: one typed, bounded, described `Param` per declared run parameter."""
    from airflow.sdk import Param  # the DAG file has imported the SDK already; importing the catalogue needs none

    return {p.name: Param(p.default, description=p.description, **p.schema()) for p in params}


def params_table(params: Iterable[RunParam]) -> str:
    """The DAG doc's Markdown table of its params (name and meaning), from the same declarations as the form."""
    rows = [f"| `{p.name}` | {p.description} |" for p in params]
    return "\n".join(["| name | meaning |", "|---|---|", *rows]) + "\n"
