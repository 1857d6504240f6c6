from datetime import UTC, date, datetime, timedelta

import pytest

from mlrelease.timewindow import Window, parse_date, parse_timestamp, run_key


def test_naive_timestamp_is_utc_and_offsets_are_converted():
    assert parse_timestamp("2026-11-29") == datetime(2026, 11, 29, tzinfo=UTC)
    assert parse_timestamp("2026-11-29T03:00:00+01:00") == datetime(2026, 11, 29, 2, tzinfo=UTC)
    assert parse_timestamp("2026-11-29T02:00:00Z") == datetime(2026, 11, 29, 2, tzinfo=UTC)


@pytest.mark.parametrize("bad", ["yesterday", "", "2026-13-01", "29/11/2026"])
def test_bad_timestamp_names_the_argument(bad):
    with pytest.raises(ValueError, match=r"bad --start"):
        parse_timestamp(bad, name="--start")


def test_bad_date_names_the_argument():
    with pytest.raises(ValueError, match="bad --end"):
        parse_date("2026-02-30", name="--end")
    assert parse_date("2026-02-28") == date(2026, 2, 28)


def test_window_rejects_empty_and_reversed():
    with pytest.raises(ValueError, match="empty window"):
        Window.parse("2026-11-29", "2026-11-29")
    with pytest.raises(ValueError, match="empty window"):
        Window.parse("2026-11-29", "2026-11-28")


def test_window_days_and_overlap():
    w = Window.parse("2026-11-28T02:00:00Z", "2026-11-29T02:00:00Z")
    assert w.days() == [date(2026, 11, 28), date(2026, 11, 29)]
    assert w.widened(timedelta(hours=3)).start == datetime(2026, 11, 27, 23, tzinfo=UTC)
    assert w.widened(timedelta(hours=3)).days()[0] == date(2026, 11, 27)
    # An end exactly at midnight does not touch the next day.
    assert Window.parse("2026-11-28", "2026-11-29").days() == [date(2026, 11, 28)]


def test_run_key_is_the_interval_end_in_utc():
    assert run_key(datetime(2026, 11, 29, 3, tzinfo=UTC) - timedelta(hours=1)) == "20261129T020000Z"
