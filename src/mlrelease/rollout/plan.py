"""The rollout plan: ordered stages, each opening cohorts to the candidate, with guardrails and a breach action.

Loaded from YAML (`config/rollout_plan.yaml`) and validated on load, so a bad plan fails before any
traffic moves. Every stage has a production and a demo duration; the profile picks one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from mlrelease.errors import StepError
from mlrelease.settings import REPO_ROOT
from mlrelease.yamlconfig import StrictModel, load_yaml_model

DEFAULT_PLAN = REPO_ROOT / "config" / "rollout_plan.yaml"
Metric = Literal[
    "error_rate", "nan_rate", "p50_latency_ratio", "p99_latency_ratio", "low_confidence_share", "prediction_shift_ks"
]
Action = Literal["rollback_cohort", "rollback_all", "pause"]
Profile = Literal["production", "demo"]


class Guardrail(StrictModel):
    """One check of the candidate against stable on the same cohort and window.

    `max` is the breach threshold on the candidate's value (for the latency ratios the ratio to stable,
    for `prediction_shift_ks` the KS statistic). With `baseline: stable_dynamic`, the threshold rises to
    stable's own mean + 2σ over its recent windows when that is higher, where a fixed number would misfire.
    """

    metric: Metric
    max: float = Field(ge=0)
    baseline: Literal["fixed", "stable_dynamic"] = "fixed"
    cohorts: tuple[str, ...] = Field(default=(), description="empty: every cohort open to the candidate")


class Stage(StrictModel):
    """One stage: the candidate's share per cohort, how long and how much traffic to judge it by, and what to do."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,39}$")
    candidate_percent: dict[str, float] = Field(min_length=1)
    duration_s: dict[Profile, float]
    min_samples: int = Field(100, ge=1, description="per cohort; fewer makes the verdict inconclusive")
    guardrails: tuple[Guardrail, ...] = Field(min_length=1)
    on_breach: Action = "rollback_all"
    diagnose: bool = False

    @model_validator(mode="after")
    def _check(self) -> Stage:
        bad = {c: p for c, p in self.candidate_percent.items() if not 0 < p <= 100}
        if bad:
            raise ValueError(f"candidate_percent must be in (0, 100], got {bad}")
        if set(self.duration_s) != {"production", "demo"} or min(self.duration_s.values()) <= 0:
            raise ValueError("duration_s needs positive 'production' and 'demo' seconds")
        return self


class ShadowSpec(StrictModel):
    """The shadow gate: the same requests through candidate and stable on Triton, before any real traffic."""

    samples: int = Field(1000, ge=50, description="orders replayed through both versions")
    max_relative_diff: float = Field(0.15, gt=0, description="a row disagrees when |Δeta| / stable eta is above this")
    max_disagreement_share: float = Field(0.10, ge=0, le=1)
    min_ks_pvalue: float = Field(0.01, ge=0, le=1, description="KS test of the two ETA distributions")
    latency_samples: int = Field(200, ge=20, description="single-row calls per version, interleaved")
    max_p95_latency_ratio: float = Field(1.10, ge=1)


class RolloutPlan(StrictModel):
    """The shadow gate and the ordered stages; the last stage decides promotion."""

    shadow: ShadowSpec = ShadowSpec()
    stages: tuple[Stage, ...] = Field(min_length=1)
    keep_previous_s: dict[Profile, float] = Field(
        default_factory=lambda: {"production": 86400.0, "demo": 10.0},  # type: ignore[arg-type]
        description="how long the previous champion stays loaded after a promotion, for instant rollback",
    )

    @model_validator(mode="after")
    def _check(self) -> RolloutPlan:
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"stage names must be unique, got {names}")
        return self

    def check_cohorts(self, known: tuple[str, ...]) -> None:
        """Refuse a plan naming cohorts the gateway does not define ('*' means all of them)."""
        named = {c for s in self.stages for c in s.candidate_percent} | {
            c for s in self.stages for g in s.guardrails for c in g.cohorts
        }
        unknown = sorted(named - {*known, "*"})
        if unknown:
            raise StepError(f"rollout plan names unknown cohort(s) {unknown}; the gateway defines {list(known)}")


def load_plan(path: Path | None = None) -> RolloutPlan:
    """Read and validate a plan YAML (default: config/rollout_plan.yaml)."""
    return load_yaml_model(Path(path or DEFAULT_PLAN), RolloutPlan, "rollout plan")
