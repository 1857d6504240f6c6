"""Online features for one request from Feast, with each feature view's freshness budget enforced."""

from __future__ import annotations

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
    """Fetches the feature service's features for one (user, package, route) and checks their age.

    :param store: an open Feast FeatureStore (SQLite or Redis online store).
    :param clock: the instant freshness is judged at (now, or a fixed replay time).
    """

    def __init__(self, store: FeatureStore, clock: Callable[[], datetime], service: str = FEATURE_SERVICE) -> None:
        self._store = store
        self._service = store.get_feature_service(service)
        self._budgets = view_budgets(store, service)
        self._clock = clock

    def fetch(self, entity_ids: dict[str, int]) -> dict[str, Any]:
        """Feature name -> value; raises UnknownEntity, StaleFeatures or FeatureStoreUnavailable."""
        try:
            response = self._store.get_online_features(features=self._service, entity_rows=[entity_ids])
            raw = response.to_dict(include_event_timestamps=True)
        except Exception as exc:  # Feast surfaces the store's own errors (redis, sqlite3…): all mean "no answer"
            log.warning("online store lookup failed: %s", exc)
            raise FeatureStoreUnavailable(f"online feature store unavailable: {type(exc).__name__}") from None
        now = self._clock().timestamp()
        values: dict[str, Any] = {}
        stale: list[str] = []
        for budget in self._budgets:
            stamps = [raw[f"{name}__ts"][0] or 0 for name in budget.features]
            if all(raw[name][0] is None for name in budget.features):
                raise UnknownEntity(f"{budget.entity_key} {entity_ids[budget.entity_key]} has no {budget.view}")
            age_h = (now - min(stamps)) / 3600
            if age_h > budget.budget_hours:
                stale.append(f"{budget.view} is {age_h:.1f} h old (budget {budget.budget_hours:g} h)")
            values.update({name: raw[name][0] for name in budget.features})
        if stale:
            raise StaleFeatures("; ".join(stale))
        return values


def wall_clock() -> datetime:
    """Now, in UTC."""
    return datetime.now(UTC)
