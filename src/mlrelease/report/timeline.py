"""The rollout section: planned shares over time and markers from the record, guardrails, served traffic."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from mlrelease.report.model import (
    EvidencePoint,
    GuardrailRow,
    Marker,
    Rollout,
    ServedPoint,
    SharePoint,
    StageAnalysis,
    State,
)
from mlrelease.rollout.store import RolloutRecord

EVERYONE = "*"  # the routing key for cohorts a stage does not name
SERVED_BUCKETS = 60  # time buckets across the rollout for the served-share curve


def cohorts_of(record: RolloutRecord, known: Iterable[str] = ()) -> tuple[str, ...]:
    """Every cohort the rollout touched or judged, in plan order, then the other `known` ones."""
    seen: dict[str, None] = {}
    for stage in record.plan.stages:
        seen.update(dict.fromkeys(stage.candidate_percent))
    for event in record.history:
        seen.update(dict.fromkeys(event.detail.get("verdicts") or {}))
        seen.update(dict.fromkeys(event.detail.get("cohorts") or []))
    seen.update(dict.fromkeys(sorted(known)))
    named = tuple(c for c in seen if c != EVERYONE)
    return named or (EVERYONE,)


def _resolve(percent: dict[str, float], cohorts: tuple[str, ...]) -> dict[str, float]:
    return {c: float(percent.get(c, percent.get(EVERYONE, 0.0))) for c in cohorts}


def shares_and_markers(
    record: RolloutRecord, cohorts: tuple[str, ...]
) -> tuple[tuple[SharePoint, ...], tuple[Marker, ...]]:
    """The candidate's planned share per cohort after each event, and the moments worth marking."""
    current = dict.fromkeys(cohorts, 0.0)
    points = [SharePoint(record.started_at, dict(current))]
    markers: list[Marker] = []
    for event in record.history:
        d = event.detail
        stage_name = record.plan.stage(event.stage).name if event.stage is not None else ""
        if event.kind == "stage_opened":
            current = _resolve(d.get("candidate_percent") or {}, cohorts)
            markers.append(Marker(event.at, "stage_opened", f"stage {event.stage} {stage_name}"))
        elif event.kind == "cohort_rolled_back":
            current = {**current, **dict.fromkeys(d.get("cohorts") or [], 0.0)}
            markers.append(Marker(event.at, "cohort_rolled_back", f"rollback {', '.join(d.get('cohorts') or [])}"))
        elif event.kind == "rolled_back":  # routing confirmed on stable: only now the shares drop
            current = dict.fromkeys(cohorts, 0.0)
            markers.append(Marker(event.at, "rolled_back", "rollback (all)"))
        elif event.kind == "rollback_requested" or (event.kind == "analysis" and d.get("action") == "rollback_all"):
            markers.append(Marker(event.at, "rolling_back", "rollback decided"))
        elif event.kind == "promoted":
            current = dict.fromkeys(cohorts, 100.0)
            markers.append(Marker(event.at, "promoted", "promoted"))
        elif event.kind == "analysis" and d.get("action") == "pause":
            markers.append(Marker(event.at, "paused", "paused"))
        elif event.kind == "approval":  # a human's answer in the run (or the default, taken at the timeout)
            who = f"answered by {d.get('by')}" if d.get("by") else "nobody answered in time: the default"
            markers.append(Marker(event.at, "approval", f"{d.get('choice')} at stage {event.stage} ({who})"))
        else:
            continue
        points.append(SharePoint(event.at, dict(current)))
    end = record.finished_at or (record.history[-1].at if record.history else record.started_at)
    points.append(SharePoint(end, dict(current)))
    return tuple(points), tuple(markers)


def _guardrails(results: Iterable[dict[str, Any]]) -> tuple[GuardrailRow, ...]:
    return tuple(
        GuardrailRow(
            cohort=str(r.get("cohort", "")),
            metric=str(r.get("metric", "")),
            candidate=r.get("candidate"),
            stable=r.get("stable"),
            threshold=r.get("threshold"),
            verdict=str(r.get("verdict", "")),
            reason=str(r.get("reason", "")),
            band=dict(r.get("band") or {}),
        )
        for r in results
    )


def stage_analyses(record: RolloutRecord | None, outcomes: dict[str, dict[str, Any]]) -> tuple[StageAnalysis, ...]:
    """Each analysed stage with its guardrail numbers: from the record's history (complete, including the
    analysis that led to a rollback, whose step only recorded an error), else from the analyze_N results."""
    found: dict[int, StageAnalysis] = {}
    if record is not None:
        opened = {e.stage: e.at for e in record.history if e.kind == "stage_opened" and e.stage is not None}
        for e in record.history:
            if e.kind != "analysis" or e.stage is None:
                continue
            found[e.stage] = StageAnalysis(
                number=e.stage,
                name=record.plan.stage(e.stage).name,
                opened_at=opened.get(e.stage),
                analysed_at=e.at,
                action=str(e.detail.get("action", "")),
                reason=str(e.detail.get("reason", "")),
                verdicts=dict(e.detail.get("verdicts") or {}),
                guardrails=_guardrails(e.detail.get("results") or []),
            )
    for task, outcome in outcomes.items():
        result = outcome.get("result") or {}
        if not task.startswith("analyze_") or "results" not in result:
            continue
        number = int(result.get("stage") or task.removeprefix("analyze_"))
        found.setdefault(
            number,
            StageAnalysis(
                number=number,
                name=str(result.get("stage_name", "")),
                opened_at=_parse(result.get("opened_at")),
                analysed_at=None,
                action=str(result.get("action", "")),
                reason=str(result.get("reason", "")),
                verdicts=dict(result.get("verdicts") or {}),
                guardrails=_guardrails(result["results"]),
            ),
        )
    return tuple(found[n] for n in sorted(found))


def _parse(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) and value else None


def served_shares(
    directory: Path, candidate: int, since: datetime, until: datetime, cohorts: tuple[str, ...]
) -> dict[str, tuple[ServedPoint, ...]]:
    """Per cohort and time bucket, the percentage of calls the candidate version answered (decision log)."""
    from mlrelease.gateway.decision_log import DecisionReader

    records = DecisionReader(directory).read(since, until)
    if not records:
        return {}
    start, span = since.timestamp(), max((until - since).total_seconds(), 1.0)
    width = span / SERVED_BUCKETS
    calls: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
    for r in records:
        if r.get("outcome") == "unavailable":  # no model answered it (stable's breaker was open): not a call
            continue
        bucket = min(int((r["t"] - start) / width), SERVED_BUCKETS - 1)
        counts = calls[(str(r.get("cohort")), bucket)]
        counts[0] += 1
        counts[1] += r.get("version") == candidate
    seen = {c for c, _ in calls}
    out: dict[str, tuple[ServedPoint, ...]] = {}
    for cohort in [c for c in cohorts if c in seen] + sorted(seen - set(cohorts)):
        out[cohort] = tuple(
            ServedPoint(since + timedelta(seconds=(b + 0.5) * width), 100.0 * hit / total, total)
            for (c, b), (total, hit) in sorted(calls.items())
            if c == cohort
        )
    return out


def rollout_section(
    record: RolloutRecord | None,
    outcomes: dict[str, dict[str, Any]],
    *,
    known_cohorts: Iterable[str] = (),
    decisions_dir: Path | None = None,
    evidence: Iterable[dict[str, Any]] = (),
) -> Rollout:
    """The rollout section of the report; `not reached` when the run never started a rollout."""
    stages = stage_analyses(record, outcomes)
    if record is None:
        shadow = outcomes.get("shadow", {})
        if shadow.get("status") == "skipped":
            return Rollout(state=State.SKIPPED, note=str(shadow.get("reason", "no rollout")), stages=stages)
        return Rollout(state=State.NOT_REACHED, note="no rollout record for this run", stages=stages)
    cohorts = cohorts_of(record, known_cohorts)
    shares, markers = shares_and_markers(record, cohorts)
    served: dict[str, tuple[ServedPoint, ...]] = {}
    served_note = "decision log not read"
    if decisions_dir is not None:
        until = shares[-1].at + timedelta(seconds=1)
        served = served_shares(decisions_dir, record.candidate_version, record.started_at, until, cohorts)
        served_note = "" if served else f"no gateway decisions recorded in {decisions_dir} for this rollout's window"
    failed = str(record.phase) in ("rolling_back", "rolled_back") or bool(record.excluded_cohorts)
    return Rollout(
        state=State.FAILED if failed else State.OK,
        note=record.reason,
        candidate_version=record.candidate_version,
        stable_version=record.stable_version,
        phase=str(record.phase),
        reason=record.reason,
        started_at=record.started_at,
        finished_at=record.finished_at,
        cohorts=cohorts,
        excluded_cohorts=record.excluded_cohorts,
        shares=shares,
        markers=markers,
        stages=stages,
        served=served,
        served_note=served_note,
        evidence=evidence_points(evidence),
    )


def evidence_points(ticks: Iterable[dict[str, Any]]) -> tuple[EvidencePoint, ...]:
    """The stored analysis trail as points (entries with a non-finite band are skipped: nothing to draw)."""
    points = []
    for tick in ticks:
        for entry in tick.get("results") or ():
            if len(entry) < 8 or not all(isinstance(x, (int, float)) for x in entry[3:7]):
                continue
            cohort, metric, verdict, estimate, lower, upper, tolerance, contract = entry[:8]
            if not all(math.isfinite(x) for x in (estimate, lower, upper)):
                continue
            points.append(
                EvidencePoint(
                    int(tick["stage"]),
                    float(tick["elapsed_s"]),
                    str(cohort),
                    str(metric),
                    str(contract),
                    str(verdict),
                    float(estimate),
                    float(lower),
                    float(upper),
                    float(tolerance),
                )
            )
    return tuple(points)
