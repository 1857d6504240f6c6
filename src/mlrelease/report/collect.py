"""Collect what one DAG run left under `$MLRELEASE_HOME` into a typed `ReleaseReport` (reads files only)."""

from __future__ import annotations

from typing import Any

from mlrelease.gateway.config import step_gateway_config
from mlrelease.registry import MODEL_NAME
from mlrelease.report.inputs import freshness_metrics, read_json, rollout_record, run_outcomes
from mlrelease.report.model import (
    Benchmark,
    CohortMetricRow,
    DataQuality,
    DriftRow,
    FreshnessRow,
    MetricRow,
    MlflowRef,
    ModelMetrics,
    ReleaseReport,
    Shadow,
    State,
    StepLine,
    TableQuality,
)
from mlrelease.report.timeline import rollout_section
from mlrelease.report.verdict import decide
from mlrelease.rollout.store import RolloutRecord, RolloutStore
from mlrelease.serving.perf import Level
from mlrelease.settings import Settings
from mlrelease.summary import ROLLOUT_ORDER, TASK_ORDER, rollout_detail, step_detail
from mlrelease.timewindow import parse_run_key

Outcomes = dict[str, dict[str, Any]]
REPORT_TASK = "report"  # this step's own outcome (of an earlier try) is not part of the run it reports on
# Which way is better for each holdout metric (None: only watched). Spearman of confidence vs error:
# more negative means confidence tracks error better.
LOWER_IS_BETTER = {
    "mae": True,
    "p90_abs_error": True,
    "low_confidence_share": True,
    "nan_share": True,
    "confidence_error_ratio": False,
    "confidence_error_spearman": True,
}


def _result(outcomes: Outcomes, task: str) -> dict[str, Any]:
    return outcomes.get(task, {}).get("result") or {}


def _unreached(outcomes: Outcomes, task: str, what: str) -> tuple[State, str] | None:
    """The state of a section whose step did not succeed (None when it did)."""
    outcome = outcomes.get(task)
    if outcome is None:
        return State.NOT_REACHED, f"{task} did not run in this DAG run"
    if outcome["status"] == "failed":
        return State.FAILED, str(outcome.get("error", f"{task} failed"))
    if outcome["status"] == "skipped":
        return State.SKIPPED, str(outcome.get("reason", f"{task} skipped: no {what}"))
    return None


def data_quality(settings: Settings, key: str, outcomes: Outcomes) -> DataQuality:
    """Expectations and drift (validation.json), freshness lag vs budget (freshness.prom or the step result)."""
    run_dir = settings.artifacts_dir / key
    validation = read_json(run_dir / "data_quality" / "validation.json") if "validate_data" in outcomes else None
    views = freshness_metrics(run_dir / "freshness.prom") if "check_freshness" in outcomes else None
    if views is None:
        views = _result(outcomes, "check_freshness").get("views")
    freshness = tuple(
        FreshnessRow(v, float(d["lag_s"]), float(d["budget_s"])) for v, d in sorted((views or {}).items())
    )
    tables, drift, failures = [], [], []
    if validation is not None:
        for name, table in validation.get("tables", {}).items():
            exps = table.get("expectations", [])
            bad = tuple(
                f"{e['type']}({e.get('column') or 'table'}): {e.get('observed', '')}" for e in exps if not e["success"]
            )
            tables.append(TableQuality(name, table.get("rows"), len(exps) - len(bad), len(bad), bad))
            drift += [
                DriftRow(name, col, float(d["psi"]), float(d["threshold"]), bool(d["ok"]))
                for col, d in table.get("drift", {}).items()
            ]
        failures = list(validation.get("failures", []))
    state, note = State.OK, ""
    for task in ("check_freshness", "validate_data"):
        problem = _unreached(outcomes, task, "data checks")
        if problem is not None and problem[0] is not State.NOT_REACHED:
            state, note = problem
            break
    if not freshness and validation is None:
        state, note = State.NOT_REACHED, note or "the data checks did not run in this DAG run"
    return DataQuality(
        state=state, note=note, tables=tuple(tables), drift=tuple(drift), freshness=freshness, failures=tuple(failures)
    )


def model_metrics(outcomes: Outcomes, fallback: dict[str, Any] | None = None) -> ModelMetrics:
    """Candidate vs champion holdout metrics from train's result (or from MLflow when train was a rerun)."""
    problem = _unreached(outcomes, "train", "training")
    if problem is not None:
        return ModelMetrics(state=problem[0], note=problem[1])
    result = _result(outcomes, "train")
    source = "train step"
    if not result.get("metrics") and fallback and fallback.get("metrics"):
        result, source = {**result, **fallback}, f"MLflow run {fallback.get('run_id')} (train was a rerun)"
    metrics, champion = result.get("metrics") or {}, result.get("champion_metrics") or {}
    rows = tuple(
        MetricRow(name, float(value), champion.get(name), LOWER_IS_BETTER.get(name)) for name, value in metrics.items()
    )
    by_cohort, champion_by_cohort = (
        result.get("metrics_by_cohort") or {},
        result.get("champion_metrics_by_cohort") or {},
    )
    cohorts = tuple(
        CohortMetricRow(cohort, name, float(value), (champion_by_cohort.get(cohort) or {}).get(name))
        for cohort, values in by_cohort.items()
        for name, value in values.items()
    )
    note = "" if rows else f"no holdout metrics recorded ({result.get('status', 'no status')})"
    return ModelMetrics(
        state=State.OK,
        note=note,
        candidate_version=result.get("model_version"),
        champion_version=result.get("champion_version"),
        rows=rows,
        cohorts=cohorts,
        decision=str(result.get("decision", "")),
        source=source if rows else "",
    )


def benchmark(outcomes: Outcomes) -> Benchmark:
    """perf_analyzer medians (the CSVs' content as the benchmark step kept it) and the gate's ratios."""
    problem = _unreached(outcomes, "benchmark", "benchmark")
    if problem is not None:
        return Benchmark(state=problem[0], note=problem[1])
    result = _result(outcomes, "benchmark")
    series = {
        name: tuple(
            Level(int(lv["concurrency"]), float(lv["throughput"]), float(lv["p50_us"]), float(lv["p99_us"]))
            for lv in levels
        )
        for name, levels in (result.get("levels") or {}).items()
    }
    return Benchmark(
        state=State.OK,
        note=str(result.get("status", "")),
        series=series,
        p99_ratio=result.get("p99_ratio"),
        throughput_ratio=result.get("throughput_ratio"),
        verdict=str(result.get("verdict", "")),
        rounds=result.get("rounds"),
    )


def shadow(settings: Settings, key: str, outcomes: Outcomes, record: RolloutRecord | None) -> Shadow:
    """The shadow report (rollout/shadow.json, written on pass and fail) with the plan's limits when known."""
    problem = _unreached(outcomes, "shadow", "shadow evaluation")
    report = read_json(settings.artifacts_dir / key / "rollout" / "shadow.json") if "shadow" in outcomes else None
    report = report or _result(outcomes, "shadow")
    if not report or (problem is not None and problem[0] is not State.FAILED):
        state, note = problem or (State.NOT_REACHED, "no shadow report")
        return Shadow(state=state, note=note)
    spec = record.plan.shadow if record is not None else None
    return Shadow(
        state=problem[0] if problem else State.OK,
        note=problem[1] if problem else str(report.get("status", "")),
        rows=int(report.get("rows", 0)),
        disagreement_share=float(report.get("disagreement_share", 0.0)),
        by_cohort={str(c): float(v) for c, v in (report.get("disagreement_by_cohort") or {}).items()},
        max_disagreement_share=spec.max_disagreement_share if spec else None,
        tail_share_diff=report.get("latency_tail_diff"),
        tail_band=tuple(report.get("latency_tail_band") or ()),
        tail_quantile=report.get("latency_tail_quantile"),
        tail_tolerance=report.get("latency_tail_tolerance"),
        tail_verdict=str(report.get("latency_tail_verdict", "")),
        latency_ratio=report.get("latency_ratio"),
        latency_ratio_band=tuple(report.get("latency_ratio_band") or ()),
        latency_tolerance=report.get("latency_tolerance"),
        latency_pairs=report.get("latency_pairs"),
        latency_verdict=str(report.get("latency_verdict", "")),
        median_latency_ms={str(v): float(ms) for v, ms in (report.get("median_latency_ms") or {}).items()},
        non_finite=int(report.get("non_finite", 0)),
    )


def step_lines(outcomes: Outcomes) -> tuple[StepLine, ...]:
    """Every DAG task in order with its outcome and the summary's one-line detail."""
    lines = []
    others = sorted(set(outcomes) - set(TASK_ORDER) - set(ROLLOUT_ORDER) - {REPORT_TASK})
    for task in [*TASK_ORDER, *ROLLOUT_ORDER, *others]:
        outcome = outcomes.get(task)
        if outcome is None:
            if task in TASK_ORDER:
                lines.append(StepLine(task, "not run", ""))
            continue
        if outcome["status"] == "success":
            detail_of = rollout_detail if task in ROLLOUT_ORDER else step_detail
            try:
                detail = detail_of(task, outcome.get("result") or {})
            except (KeyError, TypeError, ValueError):  # an older result shape: the status is still worth a line
                detail = ""
        else:
            detail = str(outcome.get("error") or outcome.get("reason") or "")
        lines.append(StepLine(task, str(outcome["status"]), detail))
    return tuple(lines)


def _first(*values: Any) -> int | None:
    return next((int(v) for v in values if v is not None), None)


def collect(
    settings: Settings, key: str, *, mlflow: MlflowRef | None = None, mlflow_metrics: dict[str, Any] | None = None
) -> ReleaseReport:
    """Read run `key`'s artifacts into a report; missing inputs become `not reached`, corrupt ones raise."""
    end = parse_run_key(key)
    outcomes = run_outcomes(settings, key)
    record = rollout_record(settings, key)
    shadow_section = shadow(settings, key, outcomes, record)
    train, bench = _result(outcomes, "train"), _result(outcomes, "benchmark")
    return ReleaseReport(
        key=key,
        model=MODEL_NAME,
        data_interval_end=end,
        dag_run_id=next((o.get("run_id") for o in outcomes.values() if o.get("run_id")), None),
        candidate_version=_first(
            train.get("model_version"), bench.get("model_version"), record.candidate_version if record else None
        ),
        champion_version=_first(
            record.stable_version if record else None, train.get("champion_version"), bench.get("champion_version")
        ),
        verdict=decide(outcomes, record),
        steps=step_lines(outcomes),
        data_quality=data_quality(settings, key, outcomes),
        model_metrics=model_metrics(outcomes, mlflow_metrics),
        benchmark=benchmark(outcomes),
        shadow=shadow_section,
        rollout=rollout_section(
            record,
            outcomes,
            known_cohorts=shadow_section.by_cohort,
            decisions_dir=step_gateway_config(settings).decision_dir(settings, settings.release_model),
            evidence=RolloutStore.from_settings(settings, MODEL_NAME).read_evidence(record) if record else (),
        ),
        mlflow=mlflow or MlflowRef(),
    )
