"""Where the routing state lives: one Protocol, a file store (default) and a Redis store (several replicas),
each in its own file; the factory in `routing_store_factory.py`."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from pydantic import ValidationError

from mlrelease.errors import StepError
from mlrelease.gateway.routing_state import RoutingState
from mlrelease.yamlconfig import validation_problems

Mutation = Callable[[RoutingState | None], RoutingState]


class RoutingStoreUnavailable(StepError):
    """The store did not answer (Redis down, file system error): nothing was read or written."""


class RoutingStateCorrupt(StepError):
    """The stored document exists but is not a valid routing state."""


class RevisionConflict(StepError):
    """Another writer changed the document between read and write, more times than we retry."""


class RoutingStore(Protocol):
    """A durable, atomic home for one model's routing document and its event log."""

    location: str

    def read(self) -> RoutingState | None:
        """The current document, or None when none was written yet."""

    def update(self, mutate: Mutation, *, by: str) -> RoutingState:
        """Atomically replace the document with `mutate(current)`, stamping revision+1, time and author."""

    def append_event(self, event: dict[str, Any]) -> None:
        """Append one event (guard trip, rollout step…) to the store's log."""

    def read_events(self, limit: int = 100) -> list[dict[str, Any]]:
        """The newest `limit` events, oldest first."""


def parse_state(raw: str | bytes, where: str) -> RoutingState:
    """A RoutingState from stored JSON; anything else is RoutingStateCorrupt naming where and why."""
    try:
        return RoutingState.model_validate_json(raw)
    except ValidationError as exc:
        raise RoutingStateCorrupt(f"routing state at {where} is invalid: {validation_problems(exc)}") from None


def stamp(current: RoutingState | None, new: RoutingState, by: str) -> RoutingState:
    """The document to store: revision one above the current one, written now by `by`."""
    revision = (current.revision if current else 0) + 1
    # The epoch names one document's lifetime: a store that was wiped and rewritten starts a new epoch,
    # so replicas know its revision numbers start over.
    epoch = current.epoch if current and current.epoch else uuid.uuid4().hex
    return new.model_copy(
        update={"revision": revision, "epoch": epoch, "updated_at": datetime.now(UTC), "updated_by": by}
    )
