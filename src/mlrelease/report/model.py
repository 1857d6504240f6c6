"""The typed content of a release report: what `collect` reads from a run and `page` renders."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from mlrelease.serving.perf import Level


class State(StrEnum):
    """How far a section's part of the pipeline got in this run."""

    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"
    NOT_REACHED = "not reached"


@dataclass(frozen=True, kw_only=True)
class Section:
    """A report section: its state and a one-line note (why it failed, was skipped, or was not reached)."""

    state: State
    note: str = ""

    @property
    def has_data(self) -> bool:
        """Whether there is anything to show beyond the state line."""
        return self.state in (State.OK, State.FAILED)


@dataclass(frozen=True)
class DriftRow:
    """PSI of one key feature against the reference window."""

    table: str
    column: str
    psi: float
    threshold: float
    ok: bool


@dataclass(frozen=True)
class TableQuality:
    """Expectations passed/failed for one table."""

    name: str
    rows: int | None
    passed: int
    failed: int
    failures: tuple[str, ...] = ()


@dataclass(frozen=True)
class FreshnessRow:
    """Age of a feature view's newest materialized event against its budget."""

    view: str
    lag_s: float
    budget_s: float

    @property
    def fresh(self) -> bool:
        """Within budget."""
        return self.lag_s <= self.budget_s


@dataclass(frozen=True, kw_only=True)
class DataQuality(Section):
    """Expectations, drift and freshness of the run's input data."""

    tables: tuple[TableQuality, ...] = ()
    drift: tuple[DriftRow, ...] = ()
    freshness: tuple[FreshnessRow, ...] = ()
    failures: tuple[str, ...] = ()


@dataclass(frozen=True)
class MetricRow:
    """One holdout metric, candidate beside champion."""

    name: str
    candidate: float
    champion: float | None
    lower_is_better: bool | None  # None: no direction (e.g. a correlation we only watch)


@dataclass(frozen=True)
class CohortMetricRow:
    """One holdout metric of one cohort, candidate beside champion."""

    cohort: str
    name: str
    candidate: float
    champion: float | None


@dataclass(frozen=True, kw_only=True)
class ModelMetrics(Section):
    """Candidate vs champion holdout metrics from training."""

    candidate_version: int | None = None
    champion_version: int | None = None
    rows: tuple[MetricRow, ...] = ()
    cohorts: tuple[CohortMetricRow, ...] = ()
    decision: str = ""
    source: str = ""


@dataclass(frozen=True, kw_only=True)
class Benchmark(Section):
    """perf_analyzer medians per concurrency level, candidate and champion."""

    series: dict[str, tuple[Level, ...]] = field(default_factory=dict)
    p99_ratio: float | None = None
    throughput_ratio: float | None = None
    verdict: str = ""
    rounds: int | None = None


@dataclass(frozen=True, kw_only=True)
class Shadow(Section):
    """The shadow gate: the same orders through candidate and stable."""

    rows: int = 0
    disagreement_share: float = 0.0
    by_cohort: dict[str, float] = field(default_factory=dict)
    max_disagreement_share: float | None = None
    tail_share_diff: float | None = None  # candidate − stable share of pairs slower than stable's quantile
    tail_band: tuple[float, ...] = ()  # its anytime-valid (1 − α) band
    tail_quantile: float | None = None
    tail_tolerance: float | None = None
    tail_verdict: str = ""
    latency_ratio: float | None = None  # geometric-mean latency ratio of interleaved call pairs
    latency_ratio_band: tuple[float, ...] = ()  # its anytime-valid (1 − α) band
    latency_tolerance: float | None = None
    latency_pairs: int | None = None
    latency_verdict: str = ""
    median_latency_ms: dict[str, float] = field(default_factory=dict)
    non_finite: int = 0


@dataclass(frozen=True)
class SharePoint:
    """The candidate's planned traffic share per cohort (percent) from `at` on."""

    at: datetime
    shares: dict[str, float]


@dataclass(frozen=True)
class Marker:
    """A moment worth a vertical line on the timeline: a stage opened, a rollback, the promotion."""

    at: datetime
    kind: str  # stage_opened | cohort_rolled_back | rolling_back | rolled_back | promoted | paused | approval
    label: str


@dataclass(frozen=True)
class GuardrailRow:
    """One guardrail check of one cohort in one stage's analysis."""

    cohort: str
    metric: str
    candidate: float | None
    stable: float | None
    threshold: float | None
    verdict: str
    reason: str
    band: dict[str, Any] = field(default_factory=dict)  # estimate, lower, upper, samples (confidence sequence)


@dataclass(frozen=True)
class StageAnalysis:
    """One stage of the rollout: when it opened, what its analysis decided, and the guardrail numbers."""

    number: int  # 1-based, as the DAG's task ids
    name: str
    opened_at: datetime | None
    analysed_at: datetime | None
    action: str
    reason: str
    verdicts: dict[str, str]
    guardrails: tuple[GuardrailRow, ...]


@dataclass(frozen=True)
class ServedPoint:
    """Share of one cohort's calls the candidate actually answered in one time bucket (decision log)."""

    at: datetime
    share: float  # percent
    calls: int


@dataclass(frozen=True)
class EvidencePoint:
    """One tick of one contract on one cohort: the estimate and its confidence band (the trail the report plots)."""

    stage: int  # 0-based
    elapsed_s: float
    cohort: str
    metric: str
    contract: str
    verdict: str
    estimate: float
    lower: float
    upper: float
    tolerance: float


@dataclass(frozen=True, kw_only=True)
class Rollout(Section):
    """The staged rollout: planned shares over time, markers, guardrails per stage, and served traffic."""

    candidate_version: int | None = None
    stable_version: int | None = None
    phase: str = ""
    reason: str = ""
    started_at: datetime | None = None
    finished_at: datetime | None = None
    cohorts: tuple[str, ...] = ()
    excluded_cohorts: tuple[str, ...] = ()
    shares: tuple[SharePoint, ...] = ()
    markers: tuple[Marker, ...] = ()
    stages: tuple[StageAnalysis, ...] = ()
    served: dict[str, tuple[ServedPoint, ...]] = field(default_factory=dict)
    served_note: str = ""
    evidence: tuple[EvidencePoint, ...] = ()


@dataclass(frozen=True)
class Verdict:
    """The run's outcome in one line: kind (for styling and tests), headline and detail."""

    # promoted | rolled_back | rolling_back | cohort_rolled_back | stopped | bootstrap | paused | in_progress | not_run
    kind: str
    headline: str
    detail: str = ""

    @property
    def tone(self) -> str:
        """good / bad / warn: the colour the page gives the verdict."""
        if self.kind in ("promoted", "bootstrap"):
            return "good"
        if self.kind in ("rolled_back", "rolling_back", "stopped", "not_run"):
            return "bad"
        return "warn"


@dataclass(frozen=True)
class StepLine:
    """One DAG task's outcome for the step table."""

    task: str
    status: str  # success | failed | skipped | not run
    detail: str


@dataclass(frozen=True)
class MlflowRef:
    """Where the candidate's training run is in MLflow, if known."""

    run_id: str | None = None
    tracking_uri: str | None = None
    ui_url: str | None = None
    error: str = ""


@dataclass(frozen=True)
class ReleaseReport:
    """Everything the page shows about one DAG run."""

    key: str
    model: str
    data_interval_end: datetime
    dag_run_id: str | None
    candidate_version: int | None
    champion_version: int | None
    verdict: Verdict
    steps: tuple[StepLine, ...]
    data_quality: DataQuality
    model_metrics: ModelMetrics
    benchmark: Benchmark
    shadow: Shadow
    rollout: Rollout
    mlflow: MlflowRef = MlflowRef()

    def sections(self) -> dict[str, Section]:
        """The sections by id, in page order."""
        return {
            "data_quality": self.data_quality,
            "model_metrics": self.model_metrics,
            "benchmark": self.benchmark,
            "shadow": self.shadow,
            "rollout": self.rollout,
        }
