"""The four source tables of the parcel-ETA domain: columns and types (their value rules: `config/gx/`)."""

from __future__ import annotations

from dataclasses import dataclass, field

USER_TIERS = ("standard", "plus", "premium")
PACKAGE_CATEGORIES = ("documents", "electronics", "apparel", "home", "furniture", "perishables", "other")
REGIONS = ("north", "south", "east", "west", "central", "islands")


@dataclass(frozen=True)
class Column:
    """One column of the physical contract: its name and type (value rules live in the suites of config/gx/)."""

    name: str
    dtype: str  # "int64", "float64", "string", "bool", "timestamp"


@dataclass(frozen=True)
class Table:
    """A date-partitioned source table keyed by `key`, with its event-time column."""

    name: str
    key: str
    columns: tuple[Column, ...]
    unique_key: bool = False
    drift_columns: tuple[str, ...] = field(default=())
    timestamp: str = "event_timestamp"
    # Ids minted together with the key (an order's package id): a re-publish under new keys renews them too, so
    # the content comparison ignores them like the key itself.
    identifiers: tuple[str, ...] = field(default=())

    @property
    def content_columns(self) -> list[str]:
        """What a row says, without its identity: every column but the key, the event time and the identifiers."""
        skip = {self.key, self.timestamp, *self.identifiers}
        return [c for c in self.column_names if c not in skip]

    @property
    def column_names(self) -> list[str]:
        """Column names in schema order."""
        return [c.name for c in self.columns]


USERS = Table(
    name="users",
    key="user_id",
    columns=(
        Column("user_id", "int64"),
        Column("event_timestamp", "timestamp"),
        Column("tier", "string"),
        Column("account_age_days", "int64"),
        Column("orders_30d", "int64"),
        Column("avg_declared_value_30d", "float64"),
    ),
    drift_columns=("orders_30d", "avg_declared_value_30d"),
)

PACKAGES = Table(
    name="packages",
    key="package_id",
    unique_key=True,
    columns=(
        Column("package_id", "int64"),
        Column("event_timestamp", "timestamp"),
        Column("weight_kg", "float64"),
        Column("volume_l", "float64"),
        Column("declared_value", "float64"),
        Column("category", "string"),
        Column("is_bulky", "bool"),
    ),
    drift_columns=("weight_kg", "declared_value"),
)

ROUTES = Table(
    name="routes",
    key="route_id",
    columns=(
        Column("route_id", "int64"),
        Column("event_timestamp", "timestamp"),
        Column("region", "string"),
        Column("distance_km", "float64"),
        Column("is_remote", "bool"),
        Column("congestion_index", "float64"),
        Column("avg_transit_hours_7d", "float64"),
    ),
    drift_columns=("distance_km", "congestion_index"),
)

ORDERS = Table(
    name="orders",
    key="order_id",
    unique_key=True,
    columns=(
        Column("order_id", "int64"),
        Column("event_timestamp", "timestamp"),
        Column("user_id", "int64"),
        Column("package_id", "int64"),
        Column("route_id", "int64"),
        Column("eta_hours", "float64"),
        Column("promised_hours", "float64"),
        Column("is_late", "bool"),
    ),
    drift_columns=("eta_hours",),
    identifiers=("package_id",),
)

TABLES: dict[str, Table] = {t.name: t for t in (USERS, PACKAGES, ROUTES, ORDERS)}
