"""The durable rollout record: one JSON document per model, replaced atomically under a lock.

It holds the state machine's state, the plan it runs under (a snapshot: editing the YAML mid-rollout
changes nothing), who owns it (the DAG run's data interval) and the history a human or the summary
reads. One rollout per model is active at a time; a second run asking to start one is refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mlrelease.errors import StepError
from mlrelease.rollout.machine import Phase, RolloutState
from mlrelease.rollout.plan import Profile, RolloutPlan
from mlrelease.settings import Settings
from mlrelease.storage import file_lock, write_text_atomic
from mlrelease.yamlconfig import validation_problems

# A rollout in these phases still has (or may get) candidate traffic: rolling back too, until routing confirmed it.
ACTIVE = (Phase.STAGE, Phase.PAUSED, Phase.ROLLING_BACK)


class RolloutBusy(StepError):
    """Another run owns the active rollout of this model."""


class Event(BaseModel):
    """One thing that happened to a rollout (stage opened, verdicts, action, alias moved…)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    at: datetime
    kind: str
    # counted from 1, as the record's own stage: a record written when stages counted from 0 is refused, not misread
    stage: int | None = Field(None, ge=1)
    detail: dict[str, Any] = Field(default_factory=dict)


class RolloutRecord(RolloutState):
    """A candidate's rollout as stored (see module docstring): the state machine's state (`RolloutState`, whose
    fields it has) with who owns it, the plan it runs under and its history."""

    revision: int = 0
    model: str
    run_key: str = Field(description="the data interval of the DAG run that owns this rollout")
    profile: Profile
    plan: RolloutPlan
    started_at: datetime  # a stored rollout has begun (the state machine's own may not have)
    history: tuple[Event, ...] = ()

    @property
    def active(self) -> bool:
        """Whether the rollout is still in progress, paused or rolling back (not finished: one at a time)."""
        return self.phase in ACTIVE

    def with_event(self, kind: str, now: datetime, stage: int | None = None, **detail: Any) -> RolloutRecord:
        """This record with one more history event."""
        return self.model_copy(
            update={"history": (*self.history, Event(at=now, kind=kind, stage=stage, detail=detail))}
        )


Mutation = Callable[[RolloutRecord | None], RolloutRecord]


class RolloutStore:
    """The rollout record of one model in `<home>/rollout/<model>.json`; finished ones are archived beside it."""

    def __init__(self, directory: Path, model: str) -> None:
        self.directory, self.model = directory, model
        self.path = directory / f"{model}.json"
        self._lock = directory / f"{model}.lock"

    @classmethod
    def from_settings(cls, settings: Settings, model: str) -> RolloutStore:
        """The store under MLRELEASE_HOME (a persistent volume on Kubernetes)."""
        return cls(settings.home / "rollout", model)

    def read(self) -> RolloutRecord | None:
        """The current (latest) rollout, or None before the first one."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return RolloutRecord.model_validate_json(raw)
        except ValidationError as exc:
            raise StepError(f"rollout record {self.path} is invalid: {validation_problems(exc)}") from None

    def update(self, mutate: Mutation) -> RolloutRecord:
        """Atomically replace the record with `mutate(current)` (revision + 1); finished records are archived."""
        with file_lock(self._lock):
            current = self.read()
            new = mutate(current)
            if new == current:
                return new  # nothing changed: a rerun writes nothing
            new = new.model_copy(update={"revision": (current.revision if current else 0) + 1})
            write_text_atomic(self.path, new.model_dump_json(indent=2) + "\n")
            if not new.active:
                write_text_atomic(self._archive_path(new), new.model_dump_json(indent=2) + "\n")
            return new

    def _archive_path(self, record: RolloutRecord) -> Path:
        return self.directory / "history" / f"{record.model}-v{record.candidate_version}-{record.run_key}.json"

    def archived_paths(self, run_key: str) -> list[Path]:
        """The archived records of run `run_key` (a rerun of the interval with a new candidate archives another)."""
        return sorted((self.directory / "history").glob(f"{self.model}-v*-{run_key}.json"))

    def evidence_path(self, record: RolloutRecord) -> Path:
        """The analysis trail of one rollout: one JSON line per tick (estimates and bands), for the report."""
        return self.directory / "evidence" / f"{record.model}-v{record.candidate_version}-{record.run_key}.jsonl"

    def append_evidence(self, record: RolloutRecord, line: dict[str, Any]) -> None:
        """Append one tick's evidence (a killed tick may leave a duplicate line; readers key on `at`)."""
        path = self.evidence_path(record)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line, separators=(",", ":")) + "\n")

    def read_evidence(self, record: RolloutRecord) -> list[dict[str, Any]]:
        """Every tick's evidence of `record`, oldest first (empty before the first tick)."""
        try:
            lines = self.evidence_path(record).read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        ticks = {}
        for line in lines:
            try:
                tick = json.loads(line)
            except ValueError:  # a line cut short by a killed process
                continue
            ticks[(tick["stage"], tick["at"])] = tick
        return [ticks[k] for k in sorted(ticks, key=lambda k: k[1])]

    def begin(self, proposed: RolloutRecord) -> RolloutRecord:
        """Start `proposed`, or resume it when the same run already started it; refuse while another is active."""

        def mutate(current: RolloutRecord | None) -> RolloutRecord:
            same = current is not None and (current.run_key, current.candidate_version) == (
                proposed.run_key,
                proposed.candidate_version,
            )
            if same:
                return current  # type: ignore[return-value]
            if current is not None and current.active:
                raise RolloutBusy(
                    f"{current.model} v{current.candidate_version} is still being rolled out (phase "
                    f"{current.phase}, stage {current.stage}, run {current.run_key}); one rollout at a "
                    "time: finish, promote or abort it first (`mlrelease rollout status`)"
                )
            return proposed

        return self.update(mutate)


def now_utc() -> datetime:
    """The current time, timezone-aware (rollout durations are wall-clock time by nature)."""
    return datetime.now(UTC)
