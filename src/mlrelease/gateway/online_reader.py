"""Online feature rows read straight through Feast's online store, one read per feature view, planned once.

`FeatureStore.get_online_features` resolves the feature service against the registry, converts entity rows to
protos, builds a response proto, converts it back to Python and re-reads the registry when its cache expires
— on every call. The gateway always asks for the same service with one int id per view, so all of that is
resolved here once at start-up and a read is just the online store's own `online_read` per view (Feast's key
serialization, SQL or Redis commands and value parsing) plus the value conversion `OnlineResponse.to_dict` does.
"""

from __future__ import annotations

import logging
import math
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from feast import FeatureStore

    from mlrelease.release_spec import Features

log = logging.getLogger(__name__)

# Per row of a read: the view's event time in whole seconds (0 when unknown) and its feature values, or None
# when the store holds no value of the view for that id.
ViewRow = tuple[int, dict[str, Any] | None]

# Value fields feast_value_type_to_python_type hands back as they are for a feature of a plain scalar type
# (it only transforms lists, sets, maps, JSON, timestamps, UUIDs and decimals): read directly, they skip its
# chain of checks. Any other field, or a feature of another type, still goes through Feast's function.
_PLAIN_FIELDS = frozenset({"int32_val", "int64_val", "float_val", "double_val", "string_val", "bytes_val", "bool_val"})
_PLAIN_TYPES = frozenset({"INT32", "INT64", "FLOAT", "DOUBLE", "STRING", "BYTES", "BOOL"})
# Entity key protos kept per view and id: ids recur (a route, a returning user), and building one through
# Feast's python_values_to_proto_values was an eighth of a one-row read. Cleared when full, not evicted by age.
_KEY_CACHE_SIZE = 100_000


@dataclass(frozen=True)
class ViewPlan:
    """One feature view of the service, resolved for serving: its name, the join key it is read by, the features
    asked for, the `freshness_budget_hours` tag, and for the read itself Feast's view (with the service's
    projection), the key's Feast value type and the features' value types."""

    name: str
    entity_key: str
    features: tuple[str, ...]
    budget_hours: float
    view: Any = None
    entity_type: Any = None
    feature_types: tuple[Any, ...] = ()

    @property
    def plain(self) -> tuple[bool, ...]:
        """Per feature: whether its type is a plain scalar (see _PLAIN_TYPES)."""
        return tuple(getattr(t, "name", None) in _PLAIN_TYPES for t in self.feature_types)


def plan_views(store: FeatureStore, features: Features) -> list[ViewPlan]:
    """The model's feature service's views in its order, each with one of its entity keys and a freshness budget tag."""
    plans = []
    entity_keys = features.entity_keys
    for projection in store.get_feature_service(features.service).feature_view_projections:
        # The same view object Feast's own pipeline reads with: the registry's view carrying this projection.
        view = store.get_feature_view(projection.name).with_projection(projection)
        keys = [k for k in view.join_keys if k in entity_keys]
        if len(keys) != 1 or "freshness_budget_hours" not in view.tags:
            raise ValueError(f"feature view {view.name} needs one of {entity_keys} and a freshness_budget_hours tag")
        if not getattr(view, "enabled", True):
            raise ValueError(f"feature view {view.name} is disabled and cannot serve features")
        (key_column,) = [c for c in view.entity_columns if c.name == keys[0]]
        types = {f.name: f.dtype.to_value_type() for f in view.features}
        names = tuple(f.name for f in projection.features)
        plans.append(
            ViewPlan(
                name=view.name,
                entity_key=keys[0],
                features=names,
                budget_hours=float(view.tags["freshness_budget_hours"]),
                view=view,
                entity_type=key_column.dtype.to_value_type(),
                feature_types=tuple(types[n] for n in names),
            )
        )
    return plans


class OnlineReader:
    """Reads the planned views for many (user, package, route) rows through the store's provider.

    :param store: an open Feast FeatureStore (SQLite or Redis online store).
    :param features: the model's input contract (its feature service's views are read, by its entity keys).
    """

    def __init__(self, store: FeatureStore, features: Features) -> None:
        from feast.protos.feast.types.EntityKey_pb2 import EntityKey
        from feast.type_map import feast_value_type_to_python_type, python_values_to_proto_values

        self.plans = plan_views(store, features)
        self._config = store.config
        self._provider = store.provider
        self._entity_key = EntityKey
        self._to_protos = python_values_to_proto_values
        self._to_python = feast_value_type_to_python_type
        self._keys: dict[str, dict[int, Any]] = {plan.name: {} for plan in self.plans}
        self._plain = {plan.name: plan.plain for plan in self.plans}

    def prepare_local_reads(self, busy_timeout_ms: float) -> bool:
        """Whether reads may run on the event loop: True for a local SQLite store once it is in WAL mode (a
        materialization writing then never blocks a read); False for a networked store (Redis, whose client may
        retry for seconds) or a SQLite file that stays in another mode, which are read on a worker thread."""
        from feast.infra.online_stores.sqlite import SqliteOnlineStore

        online_store = self._provider.online_store
        if not isinstance(online_store, SqliteOnlineStore):
            return False
        # Feast's own connection, the one its online_read uses (Feast has no public accessor; opened here, before
        # the first request). The busy timeout bounds a lock wait in any mode; Python's default is 5 s.
        conn = online_store._get_conn(self._config)
        conn.execute(f"PRAGMA busy_timeout = {max(1, int(busy_timeout_ms))}")
        try:
            mode = str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]).lower()
        except sqlite3.OperationalError as exc:  # a writer held the file past the busy timeout
            mode = f"unchanged ({exc})"
        if mode != "wal":
            log.warning("online store not in WAL mode (%s): reading it on a worker thread", mode)
            return False
        return True

    def read(self, rows: Sequence[dict[str, int]]) -> list[list[ViewRow]]:
        """Per planned view, per row in order: its event time and values (store errors propagate)."""
        return [self._read_view(plan, [row[plan.entity_key] for row in rows]) for plan in self.plans]

    def _read_view(self, plan: ViewPlan, ids: list[int]) -> list[ViewRow]:
        unique = list(dict.fromkeys(ids))  # an id asked for twice in one batch is read once, as Feast does
        keys = self._entity_keys(plan, unique)
        # A new list each call: Redis's online_read appends its timestamp field to the one it is given.
        found = self._provider.online_read(
            config=self._config, table=plan.view, entity_keys=keys, requested_features=list(plan.features)
        )
        by_id = {entity_id: self._row(plan, ts, data) for entity_id, (ts, data) in zip(unique, found, strict=True)}
        return [by_id[entity_id] for entity_id in ids]

    def _entity_keys(self, plan: ViewPlan, ids: list[int]) -> list[Any]:
        """EntityKey protos for the ids, as Feast's pipeline builds them (join key, value of the entity's type)."""
        cache = self._keys[plan.name]
        missing = [i for i in ids if i not in cache]
        if missing:
            if len(cache) + len(missing) > _KEY_CACHE_SIZE:
                cache.clear()
            for entity_id, value in zip(missing, self._to_protos(missing, plan.entity_type), strict=True):
                cache[entity_id] = self._entity_key(join_keys=[plan.entity_key], entity_values=[value])
        return [cache[i] for i in ids]

    def _row(self, plan: ViewPlan, ts: Any, data: dict[str, Any] | None) -> ViewRow:
        if not data:
            return 0, None
        values = {
            name: self._value(data[name], vtype, plain) if name in data else None
            for name, vtype, plain in zip(plan.features, plan.feature_types, self._plain[plan.name], strict=True)
        }
        if all(v is None for v in values.values()):  # Redis answers an unknown key with empty values, not nothing
            return 0, None
        # Whole seconds, floored: what get_online_features reported (a protobuf Timestamp's `seconds`).
        return (math.floor(ts.timestamp()) if ts is not None else 0), values

    def _value(self, proto: Any, vtype: Any, plain: bool) -> Any:
        """One ValueProto as Python, exactly as OnlineResponse.to_dict converts it."""
        field = proto.WhichOneof("val")
        if field is None:
            return None
        if plain and field in _PLAIN_FIELDS:
            return getattr(proto, field)
        return self._to_python(proto, vtype)
