"""Point-in-time-correct training data: orders (labels) joined to features through the Feast feature service."""

from __future__ import annotations

from datetime import timedelta

import pandas as pd

from mlrelease.data.schema import TABLES
from mlrelease.errors import StepError
from mlrelease.model.features import ENTITY_KEYS, FEATURE_SERVICE, TARGET
from mlrelease.quality.ledger import PartitionFile, ledger
from mlrelease.settings import Settings
from mlrelease.sources import covered_hours, partition_file, read_window
from mlrelease.timewindow import Window

MIN_COVERAGE = 0.9  # train only when at least 90 % of the training window's days are present


def training_window(window: Window, days: int) -> Window:
    """The `days` before the run's interval end: the orders the model learns from."""
    return Window(window.end - timedelta(days=days), window.end)


def window_partitions(settings: Settings, train_window: Window) -> dict[str, list[str]]:
    """Table → the days (`YYYY-MM-DD`) of the window whose partition exists: what the training frame is built from."""
    days = train_window.days()
    return {
        table: [day.isoformat() for day in days if partition_file(settings.offline_dir / table, day).is_file()]
        for table in TABLES
    }


def orders_source(settings: Settings) -> str:
    """The URI of the orders table (labels and entity keys of every training row; Feast joins the features)."""
    return (settings.offline_dir / "orders").as_uri()


def historical_frame(settings: Settings, train_window: Window) -> pd.DataFrame:
    """Each order in the window with its label and the feature values as of the order's event time."""
    from mlrelease.feast_store import open_store
    from mlrelease.spark.session import start_engine

    covered = covered_hours(settings.offline_dir / "orders", train_window)
    wanted = (train_window.end - train_window.start).total_seconds() / 3600
    if covered < MIN_COVERAGE * wanted:
        raise StepError(
            f"orders cover only {covered:.0f}h of the {wanted:.0f}h training window "
            f"[{train_window.start}, {train_window.end}): load the missing days or lower --training-days"
        )
    # Train learns only from partitions that passed validate-data with the bytes they have now.
    ledger(settings.home).require(
        [
            PartitionFile(table, day, partition_file(settings.offline_dir / table, day))
            for table in TABLES
            for day in train_window.days()
            if partition_file(settings.offline_dir / table, day).is_file()
        ],
        "train",
    )
    orders = read_window(settings.offline_dir / "orders", train_window, allow_missing=True)
    if orders.empty:
        raise StepError(f"no orders in the training window [{train_window.start}, {train_window.end})")
    entity_df = orders[["order_id", *ENTITY_KEYS, "event_timestamp", TARGET]].copy()
    entity_df["event_timestamp"] = pd.to_datetime(entity_df["event_timestamp"], utc=True)
    # Spark: the session on the configured master, before Feast would build its own
    start_engine(settings, "training-frame")
    store = open_store(settings)
    try:
        service = store.get_feature_service(FEATURE_SERVICE)
        frame = store.get_historical_features(entity_df=entity_df, features=service).to_df()
    except Exception as exc:
        raise StepError(f"historical retrieval through {FEATURE_SERVICE} failed: {type(exc).__name__}: {exc}") from None
    return frame.sort_values(["event_timestamp", "order_id"]).reset_index(drop=True)


def time_split(frame: pd.DataFrame, holdout_share: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Earlier rows train, the latest `holdout_share` is the holdout (no future leaks into training)."""
    cut = int(len(frame) * (1 - holdout_share))
    return frame.iloc[:cut], frame.iloc[cut:]
