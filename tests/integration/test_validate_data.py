"""Great Expectations suites and drift checks on clean and on every corrupted batch."""

from __future__ import annotations

import json

import pytest

from mlrelease.data.generate import generate
from mlrelease.errors import StepError
from mlrelease.settings import Settings
from mlrelease.steps.validate_data import validate_data
from mlrelease.timewindow import Window
from tests.conftest import HISTORY, ROWS_PER_DAY, WINDOW_END, WINDOW_START

pytestmark = pytest.mark.integration
WINDOW = Window.parse(WINDOW_START, WINDOW_END)
REPORT = "artifacts/20261129T020000Z/data_quality"


def _corrupt(home, mode):
    """Clean history, then the window's two days regenerated with the corruption."""
    offline = home / "data/offline"
    generate(offline, *HISTORY, rows_per_day=ROWS_PER_DAY, seed=11)
    generate(offline, WINDOW.start.date(), WINDOW.end.date(), rows_per_day=ROWS_PER_DAY, seed=11, inject=mode)


def test_clean_window_passes_and_writes_reports(home_with_data):
    result = validate_data(Settings.from_env(), WINDOW)
    assert result["success"]
    assert result["tables"]["orders"]["rows"] > 0
    assert all(t["max_psi"] < 0.25 for t in result["tables"].values())
    summary = json.loads((home_with_data / REPORT / "validation.json").read_text())
    assert summary["success"] and summary["failures"] == []
    assert summary["tables"]["orders"]["gx"]["success"] is True
    html = (home_with_data / REPORT / "report.html").read_text()
    assert "Data quality: PASSED" in html and "expect_column_values_to_be_unique" in html


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("nulls", r"routes\.distance_km: expect_column_values_to_not_be_null"),
        ("drift", r"routes\.distance_km: drift PSI \d+\.\d+ > 0\.25"),
        ("schema", r"routes\.table: expect_table_columns_to_match_set"),
        ("duplicates", r"orders\.order_id: expect_column_values_to_be_unique"),
    ],
)
def test_each_corruption_fails_naming_the_check(home, mode, expected):
    _corrupt(home, mode)
    with pytest.raises(StepError, match=expected):
        validate_data(Settings.from_env(), WINDOW)
    summary = json.loads((home / REPORT / "validation.json").read_text())
    assert not summary["success"]
    assert "Data quality: FAILED" in (home / REPORT / "report.html").read_text()


def test_schema_type_change_is_caught(home):
    _corrupt(home, "schema")
    with pytest.raises(StepError):
        validate_data(Settings.from_env(), WINDOW)
    failures = json.loads((home / REPORT / "validation.json").read_text())["failures"]
    assert any(f.startswith("packages.weight_kg: expect_column_values_to_be_in_type_list") for f in failures)


def test_row_count_drop_is_caught(home):
    offline = home / "data/offline"
    generate(offline, *HISTORY, rows_per_day=ROWS_PER_DAY, seed=11)
    generate(offline, WINDOW.start.date(), WINDOW.end.date(), rows_per_day=ROWS_PER_DAY // 10, seed=11)
    with pytest.raises(StepError, match=r"orders\.table: expect_table_row_count_to_be_between"):
        validate_data(Settings.from_env(), WINDOW)


def test_missing_reference_is_an_explicit_error_unless_drift_is_turned_off(home):
    generate(home / "data/offline", WINDOW.start.date(), WINDOW.end.date(), rows_per_day=ROWS_PER_DAY, seed=11)
    with pytest.raises(StepError, match=r"no reference data for users: only 2h of the 168h .*--reference-days 0"):
        validate_data(Settings.from_env(), WINDOW)
    result = validate_data(Settings.from_env(), WINDOW, reference_days=0)
    assert result["success"] and all(t["max_psi"] is None for t in result["tables"].values())
