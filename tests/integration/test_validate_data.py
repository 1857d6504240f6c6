"""validate-data on clean history: what it checks, what it approves, and its errors that are not verdicts."""

from __future__ import annotations

import json
import shutil
from datetime import timedelta

import pytest

from mlrelease.data.generate import generate
from mlrelease.errors import GateFailed, StepError
from mlrelease.quality.ledger import ledger
from mlrelease.settings import Settings
from mlrelease.steps.validate_data import validate_data
from mlrelease.timewindow import Window
from tests.conftest import HISTORY, ROWS_PER_DAY, WINDOW_END, WINDOW_START

pytestmark = pytest.mark.integration
WINDOW = Window.parse(WINDOW_START, WINDOW_END)
OVERLAP = timedelta(hours=2)
REPORT = "artifacts/parcel_eta/20261129T020000Z/data_quality"


def test_clean_window_passes_approves_its_partitions_and_builds_data_docs(home_with_data):
    result = validate_data(Settings.from_env(), WINDOW, overlap=OVERLAP)
    assert result["partitions"] == sorted(
        f"{t}/date={d}" for t in ("orders", "packages", "routes", "users") for d in ("2026-11-28", "2026-11-29")
    )
    # Orders of 11-29 after the interval end belong to the next run: counted, not checked, never dropped silently.
    assert result["tables"]["orders"]["outside_run_rows"] > 0
    assert all(t["max_psi"] < 0.25 for t in result["tables"].values())
    summary = json.loads((home_with_data / REPORT / "validation.json").read_text())
    assert summary["success"] and summary["failures"] == []
    orders_28 = summary["partitions"]["orders/date=2026-11-28"]
    assert orders_28["rows"] == ROWS_PER_DAY and orders_28["success"]
    assert orders_28["parameters"]["rows_min"] == ROWS_PER_DAY // 2  # half the median of the same hours before
    docs = home_with_data / REPORT / "gx_project/gx/uncommitted/data_docs/local_site/index.html"
    assert result["data_docs"] == str(docs) and docs.is_file()
    validations = list(docs.parent.glob("validations/**/*.html"))
    assert len(validations) == 8  # one Data Docs page per table and partition
    approved = ledger(home_with_data).read()
    assert set(approved) == set(result["partitions"])
    assert approved["orders/date=2026-11-28"]["sha256"] == orders_28["sha256"]


def test_training_days_that_never_passed_are_checked_once(home_with_data):
    first = validate_data(Settings.from_env(), WINDOW, overlap=OVERLAP, training_days=7)
    assert "orders/date=2026-11-22" in first["partitions"]  # train's window, checked on the first night
    again = validate_data(Settings.from_env(), WINDOW, overlap=OVERLAP, training_days=7)
    assert {p.split("=")[1] for p in again["partitions"]} == {"2026-11-28", "2026-11-29"}  # approved ones are not


def test_a_missing_partition_is_an_error_to_retry_not_a_verdict(home_with_data):
    shutil.rmtree(home_with_data / "data/offline/routes/date=2026-11-28")
    with pytest.raises(StepError, match=r"routes/date=2026-11-28: partition is missing .* rerun once it has") as err:
        validate_data(Settings.from_env(), WINDOW, overlap=OVERLAP)
    assert not isinstance(err.value, GateFailed)


def test_a_failure_withdraws_an_earlier_approval_of_the_same_partition(home_with_data):
    validate_data(Settings.from_env(), WINDOW, overlap=OVERLAP)
    assert "packages/date=2026-11-29" in ledger(home_with_data).read()
    # The next night: 11-29 is checked as a whole day now, and a null-ridden rewrite of 11-30 fails the run.
    offline = home_with_data / "data/offline"
    generate(
        offline,
        HISTORY[1] + timedelta(days=1),
        HISTORY[1] + timedelta(days=1),
        rows_per_day=ROWS_PER_DAY,
        seed=11,
        inject="nulls",
    )
    with pytest.raises(GateFailed):
        validate_data(
            Settings.from_env(),
            Window(WINDOW.start + timedelta(days=1), WINDOW.end + timedelta(days=1)),
            overlap=OVERLAP,
        )
    assert "packages/date=2026-11-29" not in ledger(home_with_data).read()


def test_missing_reference_is_an_explicit_error_unless_history_is_turned_off(home):
    generate(home / "data/offline", WINDOW.start.date(), WINDOW.end.date(), rows_per_day=ROWS_PER_DAY, seed=11)
    with pytest.raises(
        StepError, match=r"no reference data for users: only 0 of the 7 days before 2026-11-28 .*--reference-days 0"
    ):
        validate_data(Settings.from_env(), WINDOW, overlap=OVERLAP)
    result = validate_data(Settings.from_env(), WINDOW, overlap=OVERLAP, reference_days=0)
    assert all(t["max_psi"] is None for t in result["tables"].values())
