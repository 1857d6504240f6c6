"""The scenarios and outcomes shared by the verdict simulator and its baseline engine (no mlrelease imports: the
baseline runs on an earlier commit's source)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import verdict_traffic as traffic

T0 = datetime(2026, 11, 29, 2, tzinfo=UTC)
CANDIDATE, STABLE = 2, 1
REFRESH_S = 0.2  # the gateway's routing refresh (routing.refresh_interval_s): other replicas adopt a stored trip

SCENARIOS: dict[str, tuple[traffic.CandidateEffect, str]] = {
    "aa": (traffic.CandidateEffect(), "promote"),
    "errors_0.5pp": (traffic.CandidateEffect(extra_error_rate=0.005), "stop"),
    "fail_all": (traffic.CandidateEffect(fail_share=1.0), "stop"),
    "nan_all": (traffic.CandidateEffect(fail_share=1.0, fail_kind=traffic.NAN), "stop"),
    "p99_x1.5": (traffic.p99_regression(), "stop"),
    "long_tail_low_confidence_20pct": (
        traffic.CandidateEffect(low_confidence_cohorts=("long_tail",), low_confidence_share=0.20),
        "stop",
    ),
    "long_tail_nan_0.1pct": (traffic.CandidateEffect(nan_share=0.001, nan_cohorts=("long_tail",)), "stop"),
    "high_value_eta_+10pct": (traffic.CandidateEffect(eta_factor=1.10, eta_cohorts=("high_value",)), "stop"),
}


@dataclass
class Outcome:
    """How one simulated rollout ended."""

    result: str  # promoted | rolled_back | cohort_rolled_back | paused
    stage: int  # one-based stage at which it ended
    why: str  # the contract(s) or the guard behind a stop (for cohort_rolled_back: the cohort's breached contracts)
    hours: float  # simulated time to the end
    guard_s: float | None = None  # exposure when every replica moved: first trip + routing refresh (None: never)
    stage_s: list[float] = field(default_factory=list)  # time each decided stage took

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form (the baseline subprocess sends its outcomes this way)."""
        return self.__dict__
