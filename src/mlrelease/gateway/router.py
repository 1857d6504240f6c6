"""The gateway's view of the routing state: refreshed in the background, overridden at once by local guard trips.

A change written by the rollout (or another replica's guard trip) is picked up within one refresh
interval. A document that cannot be read or parsed is reported and the last good one is kept.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime

from mlrelease.errors import StepError
from mlrelease.gateway.metrics import ModelMetrics
from mlrelease.gateway.routing_state import Arm, GuardTrip, Role, RoutingState, armed_version, choose
from mlrelease.gateway.routing_store import RoutingStateCorrupt, RoutingStore

log = logging.getLogger(__name__)
REPLICA = f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class LocalTrip:
    """A trip this replica decided; `persisted_at` is the revision that recorded it in the store (None: not yet)."""

    trip: GuardTrip
    persisted_at: int | None = None


class Router:
    """Holds the current RoutingState and this replica's guard trips.

    :param store: where the routing document lives.
    :param metrics: the served model's metrics.
    :param refresh_interval_s: how often the store is read.
    :param model: the served model this router is for (a document for another model is refused).
    """

    def __init__(
        self, store: RoutingStore, metrics: ModelMetrics, refresh_interval_s: float, model: str, arm: Arm = "split"
    ) -> None:
        self.store = store
        self.arm = arm
        self.model = model
        self.metrics = metrics
        self.refresh_interval_s = refresh_interval_s
        self.state: RoutingState | None = None
        self.last_error: str | None = None
        self._trips: dict[int, LocalTrip] = {}
        self._task: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()
        self._cohorts_seen: set[str] = set()
        self._versions_seen: set[str] = set()

    @property
    def locally_tripped(self) -> frozenset[int]:
        """Versions this replica has taken out of service itself."""
        return frozenset(self._trips)

    def route(self, cohort: str, bucket: int) -> tuple[int, Role] | None:
        """The version and role for a request, or None while no routing state was ever read."""
        state = self.state
        if state is None:
            return None
        if self.arm == "split":
            return choose(state, cohort, bucket, self.locally_tripped)
        # A data plane in front assigned the request to this replica's arm: serve it (a tripped candidate's
        # requests go to stable, as in the split).
        candidate = state.candidate_version
        tripped = candidate in self.locally_tripped or (candidate is not None and state.is_tripped(candidate))
        if self.arm == "candidate" and candidate is not None and not tripped:
            return candidate, "candidate"
        return state.stable_version, "stable"

    def assigned(self, state: RoutingState, cohort: str, bucket: int) -> int:
        """The arm a request is judged in: its user's assignment, whoever answers it (see rollout/windows.py)."""
        return armed_version(state, self.arm, cohort, bucket)

    async def refresh(self) -> None:
        """Read the store once; adopt a newer document, or keep the last good state and record why not."""
        try:
            state = await asyncio.to_thread(self.store.read)
            if state is not None and state.model != self.model:
                raise RoutingStateCorrupt(f"routing state at {self.store.location} is for model {state.model!r}")
        except StepError as exc:
            if str(exc) != self.last_error:
                log.error("keeping routing revision %s: %s", self.state and self.state.revision, exc)
            self.last_error = str(exc)
            self.metrics.routing_errors.labels(type(exc).__name__).inc()
            return
        self.last_error = None if state is not None else f"no routing state at {self.store.location} yet"
        if state is not None and state.supersedes(self.state):
            self._adopt(state)

    def _adopt(self, state: RoutingState) -> None:
        new_epoch = self.state is None or state.epoch != self.state.epoch
        self.state = state
        # A trip recorded at revision R is cleared when a later revision no longer carries it (an operator
        # reset), or when the store was rewritten (new epoch) without it.
        for version, local in list(self._trips.items()):
            if local.persisted_at is None or state.is_tripped(version):
                continue
            if new_epoch or state.revision > local.persisted_at:
                del self._trips[version]
        self.metrics.routing_revision.set(state.revision)
        # Set every cohort seen so far (0 when no longer listed) rather than clear(): a cohort that left the plan
        # reads 0 instead of its series disappearing, which alerts would take for a scrape gap.
        self._cohorts_seen |= set(state.candidate_percent)
        for cohort in self._cohorts_seen:
            self.metrics.candidate_percent.labels(cohort).set(state.candidate_percent.get(cohort, 0.0))
        roles = {str(state.stable_version): "stable"}
        if state.candidate_version is not None:
            roles[str(state.candidate_version)] = "candidate"
        self._versions_seen |= set(roles)
        for label in self._versions_seen:
            for role in ("stable", "candidate"):
                self.metrics.version_role.labels(label, role).set(1.0 if roles.get(label) == role else 0.0)

    async def run(self) -> None:
        """Refresh forever (the background task of the app's lifespan)."""
        while True:
            await self.refresh()
            await asyncio.sleep(self.refresh_interval_s)

    def start(self) -> None:
        """Start the background refresh."""
        self._task = asyncio.create_task(self.run(), name="routing-refresh")

    async def stop(self) -> None:
        """Stop the background refresh and any trip still being written."""
        tasks = [t for t in (self._task, *self._pending) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def trip(self, version: int, reason: str) -> None:
        """Take a version out of service on this replica now, and record the trip in the store in the background."""
        if version in self._trips:
            return
        trip = GuardTrip(version=version, reason=reason, at=datetime.now(UTC), replica=REPLICA)
        self._trips[version] = LocalTrip(trip)
        self.metrics.guard_trips.labels(str(version)).inc()
        log.error("fast guard tripped version %s: %s", version, reason)
        task = asyncio.get_running_loop().create_task(self._persist(version))
        self._pending.add(task)  # keep a reference (the loop only holds weak ones) until it is done
        task.add_done_callback(self._pending.discard)

    async def _persist(self, version: int) -> None:
        """Write the trip into the routing document (other replicas and the DAG read it), then the event log."""
        local = self._trips.get(version)
        delay = 0.1
        while local is not None and local.persisted_at is None:
            try:
                mutate = functools.partial(_with_trip, trip=local.trip)
                saved = await asyncio.to_thread(self.store.update, mutate, by=REPLICA)
                local.persisted_at = saved.revision
                if saved.supersedes(self.state):
                    self._adopt(saved)
            except Exception as exc:  # the store is down or refused: the local trip stands, keep trying
                log.error("cannot record guard trip of version %s yet: %s", version, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            local = self._trips.get(version)
        if local is not None:
            event = {"type": "guard_trip", "revision": local.persisted_at, **local.trip.model_dump(mode="json")}
            for _ in range(5):  # the event log is an audit trail: a few tries, then log and give up
                try:
                    await asyncio.to_thread(self.store.append_event, event)
                    return
                except Exception as exc:
                    log.error("cannot append guard-trip event for version %s: %s", version, exc)
                    await asyncio.sleep(delay)


def _with_trip(state: RoutingState | None, trip: GuardTrip) -> RoutingState:
    if state is None:
        raise StepError("cannot record a guard trip: the routing state disappeared")
    return state.with_trip(trip)
