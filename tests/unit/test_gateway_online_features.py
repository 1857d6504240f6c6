"""The feature lookup against a fake online reader: values, unknown ids, staleness, outages and shared reads."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime

import pytest

from mlrelease.gateway.online_features import (
    BatchingLookup,
    FeatureLookup,
    FeatureStoreUnavailable,
    StaleFeatures,
    UnknownEntity,
)
from mlrelease.gateway.online_reader import ViewPlan

NOW = datetime(2026, 11, 29, 2, tzinfo=UTC)
HOUR = 3600
PLANS = [
    ViewPlan(name="user_features", entity_key="user_id", features=("tier", "orders_30d"), budget_hours=36),
    ViewPlan(name="package_features", entity_key="package_id", features=("weight_kg",), budget_hours=6),
]


class FakeReader:
    """Holds per view {id: (event seconds, values)}; records every read's rows; may fail or block."""

    plans = PLANS

    def __init__(self, fail: Exception | None = None) -> None:
        at = int(NOW.timestamp())
        self.tables = {
            "user_features": {1: (at - 2 * HOUR, {"tier": "premium", "orders_30d": 4})},
            "package_features": {
                10: (at - 1 * HOUR, {"weight_kg": 2.5}),
                11: (at - 8 * HOUR, {"weight_kg": 1.0}),
                12: (at, {"weight_kg": None}),
            },
        }
        self.reads: list[list[dict[str, int]]] = []
        self.threads: list[int] = []  # the thread each read ran on
        self.fail = fail
        self.gate = threading.Event()
        self.gate.set()

    def read(self, rows):
        self.reads.append(list(rows))
        self.threads.append(threading.get_ident())
        self.gate.wait(5)
        if self.fail is not None:
            raise self.fail
        return [[self.tables[p.name].get(row[p.entity_key], (0, None)) for row in rows] for p in self.plans]


def _lookup(reader: FakeReader) -> FeatureLookup:
    return FeatureLookup(reader, lambda: NOW)  # type: ignore[arg-type]


def test_fresh_rows_get_every_views_values_merged():
    (answer,) = _lookup(FakeReader()).fetch_many([{"user_id": 1, "package_id": 10}])
    assert answer == {"tier": "premium", "orders_30d": 4, "weight_kg": 2.5}


def test_an_id_a_view_does_not_know_is_refused_with_its_key_and_view():
    (answer,) = _lookup(FakeReader()).fetch_many([{"user_id": 2, "package_id": 10}])
    assert isinstance(answer, UnknownEntity)
    assert str(answer) == "user_id 2 has no user_features"


def test_a_view_older_than_its_budget_is_stale_and_says_by_how_much():
    (answer,) = _lookup(FakeReader()).fetch_many([{"user_id": 1, "package_id": 11}])
    assert isinstance(answer, StaleFeatures)
    assert str(answer) == "package_features is 8.0 h old (budget 6 h)"


def test_a_known_id_with_a_null_feature_keeps_the_null():
    (answer,) = _lookup(FakeReader()).fetch_many([{"user_id": 1, "package_id": 12}])
    assert answer == {"tier": "premium", "orders_30d": 4, "weight_kg": None}


def test_each_row_of_a_batch_gets_its_own_verdict():
    rows = [{"user_id": 1, "package_id": 10}, {"user_id": 1, "package_id": 11}, {"user_id": 3, "package_id": 10}]
    answers = _lookup(FakeReader()).fetch_many(rows)
    assert [type(a).__name__ for a in answers] == ["dict", "StaleFeatures", "UnknownEntity"]


def test_a_store_error_makes_every_row_of_the_read_unavailable():
    answers = _lookup(FakeReader(fail=ConnectionError("refused"))).fetch_many([{"user_id": 1, "package_id": 10}] * 2)
    assert all(isinstance(a, FeatureStoreUnavailable) for a in answers)
    assert "ConnectionError" in str(answers[0])


def test_concurrent_requests_share_one_read_while_another_runs():
    reader = FakeReader()

    async def scenario():
        lookup = BatchingLookup(_lookup(reader))
        reader.gate.clear()  # the first read blocks until the others have queued behind it
        first = asyncio.ensure_future(lookup.fetch({"user_id": 1, "package_id": 10}))
        await asyncio.sleep(0.05)
        rest = [asyncio.ensure_future(lookup.fetch({"user_id": 1, "package_id": p})) for p in (10, 11, 99)]
        await asyncio.sleep(0.05)
        reader.gate.set()
        answers = await asyncio.gather(first, *rest, return_exceptions=True)
        await lookup.close()
        return answers

    answers = asyncio.run(scenario())
    assert [len(rows) for rows in reader.reads] == [1, 3]
    assert answers[0] == answers[1] == {"tier": "premium", "orders_30d": 4, "weight_kg": 2.5}
    assert isinstance(answers[2], StaleFeatures) and isinstance(answers[3], UnknownEntity)


def test_a_caller_that_timed_out_does_not_break_the_next_reads():
    reader = FakeReader()

    async def scenario():
        lookup = BatchingLookup(_lookup(reader))
        reader.gate.clear()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await lookup.fetch({"user_id": 1, "package_id": 10})
        reader.gate.set()
        answer = await lookup.fetch({"user_id": 1, "package_id": 10})
        await lookup.close()
        return answer

    assert asyncio.run(scenario()) == {"tier": "premium", "orders_30d": 4, "weight_kg": 2.5}


@pytest.mark.parametrize("inline", [False, True])
def test_a_local_store_is_read_on_the_loop_and_a_networked_one_on_a_thread(inline):
    reader = FakeReader()

    async def scenario():
        lookup = BatchingLookup(_lookup(reader), inline=inline)
        # Requests parsed in one loop iteration queue before the read starts: one read answers them all.
        answers = await asyncio.gather(
            *(lookup.fetch({"user_id": 1, "package_id": p}) for p in (10, 11, 99)), return_exceptions=True
        )
        await lookup.close()
        return threading.get_ident(), answers

    loop_thread, answers = asyncio.run(scenario())
    assert [len(rows) for rows in reader.reads] == [3]
    assert (reader.threads == [loop_thread]) is inline
    assert answers[0] == {"tier": "premium", "orders_30d": 4, "weight_kg": 2.5}
    assert isinstance(answers[1], StaleFeatures) and isinstance(answers[2], UnknownEntity)
