"""A rollout record for pure tests: v2 rolled out over stable v1 under the default plan."""

from __future__ import annotations

from datetime import UTC, datetime

from mlrelease.rollout.machine import Phase
from mlrelease.rollout.plan import load_plan
from mlrelease.rollout.store import RolloutRecord


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
