"""A rollout record for pure tests: v2 rolled out over stable v1 under the default plan; a router in memory."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from mlrelease.errors import StepError
from mlrelease.rollout.machine import Phase
from mlrelease.rollout.plan import load_plan
from mlrelease.rollout.store import RolloutRecord
from mlrelease.rollout.traffic_router import Routing


def rollout_record(phase: Phase = Phase.STAGE) -> RolloutRecord:
    """The record of the demo night's rollout of v2 (stable v1), in `phase`."""
    record = RolloutRecord(
        model="parcel_eta",
        run_key="20261129T020000Z",
        candidate_version=2,
        stable_version=1,
        profile="demo",
        plan=load_plan(None).allocated(("high_value", "long_tail", "core")),
        started_at=datetime(2026, 11, 29, 2, tzinfo=UTC),
    )
    return record.model_copy(update={"phase": phase})


class FakeRouter:
    """Routing in memory; `failing` makes every write fail (e.g. stable cannot be loaded)."""

    location, observed_by = "fake", frozenset({"decision_log"})

    def __init__(self, store) -> None:
        self.store, self.failing = store, ""
        self.routing = Routing(stable_version=1, candidate_version=2, candidate_percent={"high_value": 50.0})
        self.record_said: list[Phase] = []  # the record's phase at each routing write

    def current(self) -> Routing:
        return self.routing

    def apply(self, routing: Routing, *, reason: str, clear_trips: bool = False) -> Routing:
        self.record_said.append(self.store.read().phase)
        if self.failing:
            raise StepError(self.failing)
        self.routing = replace(routing, revision=self.routing.revision + 1)
        return self.routing
