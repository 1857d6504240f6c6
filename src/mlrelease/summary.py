"""`mlrelease summary`: a readable account of one run from the step outcomes the runner recorded."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from mlrelease.release_spec import nightly_dag_id
from mlrelease.settings import Settings
from mlrelease.timewindow import run_key

# The order the nightly DAG runs its steps in (task ids).
TASK_ORDER = (
    "apply_features",
    "validate_data",
    "materialize",
    "check_freshness",
    "train",
    "export",
    "validate_serving",
    "benchmark",
)


# The Great Expectations Data Docs site of the run's validate-data (its copy of config/gx builds it).
DATA_DOCS = "data_quality/gx_project/gx/uncommitted/data_docs/local_site/index.html"


def _train_detail(result: dict[str, Any]) -> str:
    """The train line: the version, its verdict and the holdout metric its task's gate judged."""
    champion = result.get("champion_metrics") or {}
    mae = (result.get("metrics") or {}).get("mae")
    versus = f" (champion {champion['mae']:.3f} h)" if "mae" in champion else ""
    if mae is not None:
        return f"v{result.get('model_version')} {result.get('status')}: holdout MAE {mae:.3f} h{versus}"
    # Another task's gate says in its own words what it judged (a classifier: log loss and AUC vs the champion's).
    decision = f": {result['decision']}" if result.get("decision") else ""
    return f"v{result.get('model_version')} {result.get('status')}{decision}"


def step_detail(task: str, result: dict[str, Any]) -> str:
    """One line of what a pipeline step did, from its result (the summary's and the report's step table)."""
    if task == "materialize":
        views = ", ".join(f"{v} {d['rows_written']}" for v, d in result.get("views", {}).items())
        return f"{result.get('rows_written')} rows written ({views}) in {result.get('duration_s')} s"
    if task == "check_freshness":
        return ", ".join(
            f"{v} lag {d['lag_s'] / 3600:.1f}h/{d['budget_s'] / 3600:g}h" for v, d in result.get("views", {}).items()
        )
    if task == "validate_data":
        checked = ", ".join(f"{t} {d['rows']} rows" for t, d in result.get("tables", {}).items())
        return f"{len(result.get('partitions', []))} partitions passed ({checked})"
    if task == "train":
        return _train_detail(result)
    if task == "export":
        return f"v{result.get('model_version')} {result.get('status')}, sha256 {str(result.get('sha256'))[:12]}"
    if task == "validate_serving":
        diffs = result.get("max_abs_diff", {})
        worst = max(diffs.values()) if diffs else float("nan")
        return f"v{result.get('model_version')} matches the export (max |diff| {worst:.1e}) on {result.get('triton')}"
    if task == "benchmark":
        return str(result.get("verdict") or result.get("status"))
    if task == "report":
        mlflow = "logged to MLflow" if result.get("mlflow_artifact_uri") else "not logged to MLflow"
        return f"{result.get('verdict')}: {len(result.get('files', []))} files, {mlflow}"
    if task == "apply_features":
        return f"{len(result.get('feature_views', []))} feature views, online store {result.get('online_store')}"
    return ""


# The rollout tasks after the benchmark, in DAG order (skipped on a first release).
ROLLOUT_ORDER = (
    "shadow",
    *(f"{kind}_{n}" for n in (1, 2, 3) for kind in ("rollout_stage", "analyze", "answer")),
    "promote",
    "retire",
    "rollback",
)


def rollout_detail(task: str, result: dict[str, Any]) -> str:
    """One line of what a rollout step did, from its result."""
    if task == "shadow":
        return (
            f"{result.get('disagreement_share', 0):.1%} of {result.get('rows')} replayed orders differ, "
            f"latency ratio {result.get('latency_ratio')} (band {result.get('latency_ratio_band')}, "
            f"{result.get('latency_pairs')} pairs), tail {result.get('latency_tail_verdict')}"
        )
    if task.startswith("rollout_stage"):
        return (
            f"stage {result.get('stage')} {result.get('stage_name')}: candidate share {result.get('candidate_percent')}"
        )
    if task.startswith("analyze"):
        verdicts = ", ".join(f"{c} {v}" for c, v in (result.get("verdicts") or {}).items())
        outage = "; the window contains an outage" if result.get("outages") else ""
        return f"{result.get('action')} ({verdicts}) {_decided_after(result)}".rstrip() + outage
    if task == "promote":
        return f"v{result.get('model_version')} is champion (was v{result.get('previous_version')})"
    if task.startswith("answer"):
        answer = result.get("answer") or {}
        who = answer.get("by") or "nobody in time (the default)"
        return f"{answer.get('choice')} at stage {result.get('stage')}, answered by {who}: {result.get('status')}"
    return str(result.get("status", ""))


def _decided_after(result: dict[str, Any]) -> str:
    """'after N s' for an analysis that recorded when its stage opened and when it decided."""
    opened, decided = result.get("opened_at"), result.get("decided_at")
    if not (opened and decided):
        return ""
    seconds = (datetime.fromisoformat(decided) - datetime.fromisoformat(opened)).total_seconds()
    return f"after {seconds:.0f} s"


def _outcome_line(task: str, outcome: dict[str, Any], detail: Callable[[str, dict[str, Any]], str]) -> str:
    """One summary line: ok with the step's detail, skipped with why, or FAILED with the error."""
    if outcome["status"] == "success":
        return f"  {task:<16} ok      {detail(task, outcome['result'])}"
    if outcome["status"] == "skipped":
        return f"  {task:<16} skipped {outcome.get('reason', '')}"
    return f"  {task:<16} FAILED  {outcome['error']}"


def rollout_lines(settings: Settings, end: datetime, outcomes: dict[str, dict[str, Any]]) -> list[str]:
    """The rollout part of the summary: each task's outcome, then the stored timeline with durations."""
    if not any(task in outcomes for task in ROLLOUT_ORDER):
        return []
    lines = ["", "  rollout"]
    lines += [_outcome_line(task, outcomes[task], rollout_detail) for task in ROLLOUT_ORDER if task in outcomes]
    from mlrelease.registry import MODEL_NAME
    from mlrelease.rollout.store import RolloutStore

    record = RolloutStore.from_settings(settings, MODEL_NAME).read()
    if record is not None and record.run_key == run_key(end):  # the current record may be another night's
        lines += ["", f"  timeline of v{record.candidate_version} (stable v{record.stable_version}): {record.phase}"]
        if record.phase == "rolling_back":  # decided, not confirmed: the record never claims more than routing
            lines.append(
                f"  rollback not confirmed: routing may still send traffic to v{record.candidate_version}; "
                "`mlrelease step rollback` finishes it"
            )
        for event in record.history:
            offset = (event.at - record.started_at).total_seconds()
            what = event.detail.get("reason") or event.detail.get("candidate_percent") or ""
            lines.append(f"  +{offset:7.1f} s  {event.kind:<18} {what}")
    return lines


def load_outcomes(settings: Settings, end: datetime) -> dict[str, dict[str, Any]]:
    """Step outcomes of the latest DAG run for the interval ending at `end`, by task id.

    Earlier runs of the same interval (a rerun, a retry from the UI) leave records too; only those
    written by the same run as the newest record belong to the run being summarised.
    """
    steps_dir = settings.artifacts_dir / run_key(end) / "steps"
    files = sorted(steps_dir.glob("*.json"), key=lambda p: p.stat().st_mtime) if steps_dir.is_dir() else []
    if not files:
        return {}
    records = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in files}
    latest_run = records[files[-1].stem].get("run_id")
    return {task: rec for task, rec in records.items() if rec.get("run_id") == latest_run}


def format_summary(settings: Settings, end: datetime) -> str:
    """A plain-text table of every step (success, failed or not run) and where the artifacts are."""
    outcomes = load_outcomes(settings, end)
    run_dir = settings.artifacts_dir / run_key(end)
    lines = [f"{nightly_dag_id(settings.release_model)} — data interval ending {end.isoformat()}", ""]
    for task in [*TASK_ORDER, *sorted(set(outcomes) - set(TASK_ORDER) - set(ROLLOUT_ORDER))]:
        outcome = outcomes.get(task)
        lines.append(f"  {task:<16} not run" if outcome is None else _outcome_line(task, outcome, step_detail))
    bench = outcomes.get("benchmark", {}).get("result", {})
    if bench.get("levels"):
        lines += ["", "  perf_analyzer (median of rounds)  conc.×rows  infer/s   p50 ms   p99 ms"]
        for name, levels in bench["levels"].items():
            for lv in levels:
                level = f"{lv['concurrency']}×{lv.get('batch', 1)}"  # the peak sends batched requests
                lines.append(
                    f"  {name:<32} {level:>11}  {lv['throughput']:>7.0f}  "
                    f"{lv['p50_us'] / 1000:>7.2f}  {lv['p99_us'] / 1000:>7.2f}"
                )
    lines += rollout_lines(settings, end, outcomes)
    complete = all(outcomes.get(task, {}).get("status") == "success" for task in TASK_ORDER)
    lines += ["", f"result: {_verdict(outcomes) if complete else 'FAILED'}", f"artifacts: {run_dir}"]
    for name in ("report/index.html", DATA_DOCS, "freshness.prom"):
        if (run_dir / name).exists():
            lines.append(f"  {Path(run_dir / name)}")
    return "\n".join(lines)


def _verdict(outcomes: dict[str, dict[str, Any]]) -> str:
    """ok, plus what happened to the candidate: promoted, rolled back, paused, or no rollout (first release)."""
    status = {task: outcomes.get(task, {}).get("status") for task in ROLLOUT_ORDER}
    if status["promote"] == "success":
        return "ok: candidate promoted"
    if status["shadow"] == "failed":
        return "FAILED: the shadow gate refused the candidate (it never took real traffic)"
    if status["rollback"] == "success" or any(v == "failed" for v in status.values()):
        return "FAILED: candidate rolled back"
    if any(task.startswith(("analyze", "answer")) and v == "skipped" for task, v in status.items()):
        return "ok: rollout paused for a human (see `mlrelease rollout status`)"
    if status["shadow"] == "skipped":
        return "ok: first release (or already champion), no rollout"
    return "ok"
