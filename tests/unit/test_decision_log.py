"""The gateway's decision log: buffered per-replica writes, incremental reads, retention (files only)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

from mlrelease.gateway.decision_log import DecisionLog, DecisionReader
from mlrelease.rollout.decision_log_source import DecisionLogSource, summarize


def _call(log: DecisionLog, **overrides):
    entry = dict(cohort="core", version=1, role="stable", outcome="ok", latency_s=0.002, eta=20.0, confidence=0.9)
    entry.update(overrides)
    log.record(**entry, features=[0.0] * 14)


def test_records_are_buffered_then_flushed_and_read_back_incrementally(tmp_path):
    log = DecisionLog(tmp_path)
    _call(log)
    since = datetime.now(UTC) - timedelta(seconds=5)
    reader = DecisionReader(tmp_path)
    assert reader.read(since) == []  # nothing reaches the disk before a flush
    log.flush()
    _call(log, version=2, role="candidate", outcome="nan")
    log.flush()
    first = reader.read(since)
    assert [(r["version"], r["outcome"]) for r in first] == [(1, "ok"), (2, "nan")]
    assert "eta" not in first[1] and len(first[0]["features"]) == 14
    (path,) = tmp_path.glob("*.jsonl")
    with open(path, "a") as out:
        out.write('{"t": 1, "cohort": "co')  # a replica mid-write: the cut line waits for its newline
    assert len(reader.read(since)) == 2
    with open(path, "a") as out:
        out.write('re"}\ngarbage\n')
    assert len(reader.read(datetime(1970, 1, 1, tzinfo=UTC))) == 3  # the completed line; garbage skipped


def test_sampling_keeps_every_failure(tmp_path):
    log = DecisionLog(tmp_path, sample_rate=0.01)
    for _ in range(300):
        _call(log)
        _call(log, outcome="error")
    log.flush()
    records = DecisionReader(tmp_path).read(datetime.now(UTC) - timedelta(minutes=1))
    outcomes = [r["outcome"] for r in records]
    assert outcomes.count("error") == 300 and outcomes.count("ok") < 30


def test_old_hourly_files_are_deleted_when_a_new_hour_starts(tmp_path):
    old = tmp_path / "20200101T00-host-1.jsonl"
    old.write_text(json.dumps({"t": 1}) + "\n")
    log = DecisionLog(tmp_path, retention_hours=1)
    _call(log)
    log.flush()
    assert not old.exists() and len(list(tmp_path.glob("*.jsonl"))) == 1


def test_the_background_flusher_writes_without_being_asked(tmp_path):
    async def scenario():
        log = DecisionLog(tmp_path, flush_interval_s=0.05)
        log.start()
        _call(log)
        await asyncio.sleep(0.2)
        written = list(tmp_path.glob("*.jsonl"))
        _call(log, version=3)
        await log.stop()  # what is left is written on stop
        return written

    assert asyncio.run(scenario())
    assert len(DecisionReader(tmp_path).read(datetime.now(UTC) - timedelta(minutes=1))) == 2


def test_source_summarises_per_cohort_and_version_and_across_cohorts(tmp_path):
    log = DecisionLog(tmp_path)
    for i in range(10):
        _call(
            log, cohort="long_tail", version=2, role="candidate", confidence=0.3 if i < 4 else 0.9, latency_s=i / 1000
        )
    _call(log, cohort="long_tail", version=2, role="candidate", outcome="timeout", latency_s=0.5)
    _call(log, cohort="core", version=1)
    log.flush()
    windows = DecisionLogSource(tmp_path).windows(datetime.now(UTC) - timedelta(minutes=1), datetime.now(UTC))
    tail = windows[("long_tail", 2)]
    assert (tail.requests, tail.total("failed"), tail.total("low_confidence"), tail.total("answers")) == (11, 1, 4, 10)
    assert windows[("*", 2)].requests == 11 and windows[("*", 1)].requests == 1
    assert summarize([]).requests == 0


def test_a_record_time_never_lies_in_the_future(tmp_path, monkeypatch):
    # A reader's window ends "now"; a time rounded up past now would drop a record just flushed (a CI flake).
    monkeypatch.setattr("mlrelease.gateway.decision_log.time.time", lambda: 100.00006)
    log = DecisionLog(tmp_path)
    _call(log)
    log.flush()
    (path,) = tmp_path.glob("*.jsonl")
    assert json.loads(path.read_text())["t"] <= 100.00006
