"""Online features for one request from Feast, with each feature view's freshness budget enforced."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from mlrelease.model.features import ENTITY_KEYS, FEATURE_SERVICE

if TYPE_CHECKING:
    from feast import FeatureStore

log = logging.getLogger(__name__)


class FeatureLookupError(Exception):
    """Base of the lookup errors the API maps to responses."""


class UnknownEntity(FeatureLookupError):
    """An id has no features at all in the online store."""


class StaleFeatures(FeatureLookupError):
    """A feature is older than its view's freshness budget."""


class FeatureStoreUnavailable(FeatureLookupError):
    """The online store did not answer."""


@dataclass(frozen=True)
class ViewBudget:
    """A feature view, the entity key it is looked up by, its features and its freshness budget."""

    view: str
    entity_key: str
    features: tuple[str, ...]
    budget_hours: float


def view_budgets(store: FeatureStore, service: str = FEATURE_SERVICE) -> list[ViewBudget]:
    """Per view of the feature service: join key, features and the `freshness_budget_hours` tag."""
    budgets = []
    for projection in store.get_feature_service(service).feature_view_projections:
        view = store.get_feature_view(projection.name)
        keys = [k for k in view.join_keys if k in ENTITY_KEYS]
        if len(keys) != 1 or "freshness_budget_hours" not in view.tags:
            raise ValueError(f"feature view {view.name} needs one of {ENTITY_KEYS} and a freshness_budget_hours tag")
        budgets.append(
            ViewBudget(
                view=view.name,
                entity_key=keys[0],
                features=tuple(f.name for f in projection.features),
                budget_hours=float(view.tags["freshness_budget_hours"]),
            )
        )
    return budgets


class FeatureLookup:
    """Fetches the feature service's features for (user, package, route) rows and checks their age.

    :param store: an open Feast FeatureStore (SQLite or Redis online store).
    :param clock: the instant freshness is judged at (now, or a fixed replay time).
    """

    def __init__(self, store: FeatureStore, clock: Callable[[], datetime], service: str = FEATURE_SERVICE) -> None:
        self._store = store
        self._service = store.get_feature_service(service)
        self._budgets = view_budgets(store, service)
        self._clock = clock

    def fetch_many(self, rows: list[dict[str, int]]) -> list[dict[str, Any] | FeatureLookupError]:
        """One online read for many requests; per row its features or the error that refuses it."""
        try:
            response = self._store.get_online_features(features=self._service, entity_rows=rows)
            raw = response.to_dict(include_event_timestamps=True)
        except Exception as exc:  # Feast surfaces the store's own errors (redis, sqlite3…): all mean "no answer"
            log.warning("online store lookup failed: %s", exc)
            down = FeatureStoreUnavailable(f"online feature store unavailable: {type(exc).__name__}")
            return [down for _ in rows]
        now = self._clock().timestamp()
        return [self._check_row(raw, i, ids, now) for i, ids in enumerate(rows)]

    def _check_row(
        self, raw: dict[str, list[Any]], i: int, ids: dict[str, int], now: float
    ) -> dict[str, Any] | FeatureLookupError:
        values: dict[str, Any] = {}
        stale: list[str] = []
        for budget in self._budgets:
            if all(raw[name][i] is None for name in budget.features):
                return UnknownEntity(f"{budget.entity_key} {ids[budget.entity_key]} has no {budget.view}")
            age_h = (now - min(raw[f"{name}__ts"][i] or 0 for name in budget.features)) / 3600
            if age_h > budget.budget_hours:
                stale.append(f"{budget.view} is {age_h:.1f} h old (budget {budget.budget_hours:g} h)")
            values.update({name: raw[name][i] for name in budget.features})
        return StaleFeatures("; ".join(stale)) if stale else values


class BatchingLookup:
    """Coalesces concurrent lookups into one online read: while a read runs, new requests queue for the next.

    Feast's per-call overhead (~1 ms of Python) dominates a one-row read, so under load this cuts the CPU
    per request several times; with no load a request is read alone, with no added wait.

    :param lookup: the underlying FeatureLookup.
    :param max_batch: most rows per read.
    """

    def __init__(self, lookup: FeatureLookup, max_batch: int = 64, max_waiting: int = 2048) -> None:
        self.lookup = lookup
        self.max_batch = max_batch
        # Bounded: during a store outage new requests get a 503 at once instead of queueing behind thousands.
        self._queue: asyncio.Queue[tuple[dict[str, int], asyncio.Future[dict[str, Any]]]] = asyncio.Queue(max_waiting)
        self._worker: asyncio.Task[None] | None = None

    async def fetch(self, entity_ids: dict[str, int]) -> dict[str, Any]:
        """Features for one request (raises the lookup errors), read together with whatever else is waiting."""
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._drain(), name="feature-batches")
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        try:
            self._queue.put_nowait((entity_ids, future))
        except asyncio.QueueFull:
            raise FeatureStoreUnavailable("online feature store overloaded: too many lookups waiting") from None
        return await future

    async def _drain(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while not self._queue.empty() and len(batch) < self.max_batch:
                batch.append(self._queue.get_nowait())
            batch = [(ids, future) for ids, future in batch if not future.done()]  # callers that timed out
            if not batch:
                continue
            try:
                results = await asyncio.to_thread(self.lookup.fetch_many, [ids for ids, _ in batch])
            except Exception as exc:  # a bug, not an outage: fail these requests, keep serving the next ones
                log.exception("feature batch failed")
                results = [FeatureStoreUnavailable(f"feature lookup failed: {type(exc).__name__}")] * len(batch)
            for (_, future), result in zip(batch, results, strict=True):
                if future.done():  # the caller timed out and went away
                    continue
                if isinstance(result, FeatureLookupError):
                    future.set_exception(result)
                else:
                    future.set_result(result)

    async def close(self) -> None:
        """Stop the batching task."""
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)


def wall_clock() -> datetime:
    """Now, in UTC."""
    return datetime.now(UTC)
