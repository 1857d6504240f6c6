"""The routing state document: which version is stable, which is the candidate, and who gets the candidate.

One versioned document (`revision` grows by one per write) shared by every gateway replica and written
by the rollout. `candidate_percent` maps a cohort to the share of its traffic on the candidate (100 =
the whole cohort, 5 = a canary, missing = 0); the key "*" applies to cohorts not listed. A guard trip
recorded here takes the candidate out of service on every replica until a later write clears it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mlrelease.gateway.cohorts import BUCKETS

ALL_COHORTS = "*"
Role = Literal["stable", "candidate"]


class GuardTrip(BaseModel):
    """A fast-guard trip of one version, as recorded by the replica that saw it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = Field(ge=1)
    reason: str
    at: datetime
    replica: str


class RoutingState(BaseModel):
    """The routing document (see module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    revision: int = Field(0, ge=0)
    epoch: str = ""
    model: str
    stable_version: int = Field(ge=1)
    candidate_version: int | None = Field(None, ge=1)
    candidate_percent: dict[str, float] = Field(default_factory=dict)
    guard_trips: tuple[GuardTrip, ...] = ()
    updated_at: datetime | None = None
    updated_by: str = ""

    @model_validator(mode="after")
    def _check(self) -> RoutingState:
        if self.candidate_version is not None and self.candidate_version == self.stable_version:
            raise ValueError(f"candidate_version and stable_version are both {self.stable_version}")
        bad = {c: p for c, p in self.candidate_percent.items() if not 0 <= p <= 100}
        if bad:
            raise ValueError(f"candidate_percent values must be within 0..100, got {bad}")
        if self.candidate_version is None and any(self.candidate_percent.values()):
            raise ValueError("candidate_percent sends traffic to a candidate, but candidate_version is not set")
        return self

    def serving_versions(self) -> list[int]:
        """Versions this document sends traffic to: stable, and the candidate when any cohort has a share."""
        receives = self.candidate_version is not None and any(p > 0 for p in self.candidate_percent.values())
        return [self.stable_version, *([self.candidate_version] if receives else [])]  # type: ignore[list-item]

    def supersedes(self, other: RoutingState | None) -> bool:
        """Whether this document is newer than `other`: a later revision, or a different epoch (a rewritten store)."""
        return other is None or self.epoch != other.epoch or self.revision > other.revision

    def percent_for(self, cohort: str) -> float:
        """Share (0..100) of a cohort's traffic meant for the candidate."""
        return self.candidate_percent.get(cohort, self.candidate_percent.get(ALL_COHORTS, 0.0))

    def is_tripped(self, version: int) -> bool:
        """Whether a guard trip for this version is recorded."""
        return any(t.version == version for t in self.guard_trips)

    def with_trip(self, trip: GuardTrip) -> RoutingState:
        """This state with a trip recorded (unchanged when that version is already recorded as tripped)."""
        if self.is_tripped(trip.version):
            return self
        return self.model_copy(update={"guard_trips": (*self.guard_trips, trip)})


def assigned_version(state: RoutingState, cohort: str, bucket: int) -> int:
    """The version a request of `cohort` whose canary bucket is `bucket` is assigned to: the arm the rollout judges it
    in, whoever ends up answering it (a guard trip or a retry on stable does not move it to stable's arm)."""
    candidate = state.candidate_version
    if candidate is not None and bucket < round(state.percent_for(cohort) * BUCKETS / 100):  # 7 % is exactly 700
        return candidate
    return state.stable_version


Arm = Literal["split", "stable", "candidate"]


def armed_version(state: RoutingState, arm: Arm, cohort: str, bucket: int) -> int:
    """The version a request is assigned to: this replica's arm when a data plane in front assigned it (Gateway API
    mode: the HTTPRoute sends each user's requests to the stable or the candidate gateways), else the split's."""
    if arm == "split":
        return assigned_version(state, cohort, bucket)
    if arm == "candidate" and state.candidate_version is not None:
        return state.candidate_version
    return state.stable_version


def choose(state: RoutingState, cohort: str, bucket: int, locally_tripped: frozenset[int]) -> tuple[int, Role]:
    """The version that serves a request of `cohort` whose canary bucket is `bucket`, and its role."""
    candidate = state.candidate_version
    if candidate is None or candidate in locally_tripped or state.is_tripped(candidate):
        return state.stable_version, "stable"
    if assigned_version(state, cohort, bucket) == candidate:
        return candidate, "candidate"
    return state.stable_version, "stable"
