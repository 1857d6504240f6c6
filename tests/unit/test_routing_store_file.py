"""The file routing store: versioned atomic updates under a lock, corrupt-file detection, the event log."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from mlrelease.errors import StepError
from mlrelease.gateway.file_routing_store import FileRoutingStore
from mlrelease.gateway.routing_state import RoutingState
from mlrelease.gateway.routing_store import RoutingStateCorrupt
from mlrelease.gateway.routing_store_factory import open_routing_store

MODEL = "parcel_eta"


def _bump_stable(current: RoutingState | None) -> RoutingState:
    """A mutation that counts: stable_version goes 1, 2, 3… one per update."""
    if current is None:
        return RoutingState(model=MODEL, stable_version=1)
    return current.model_copy(update={"stable_version": current.stable_version + 1})


def test_read_is_none_when_absent(tmp_path):
    store = FileRoutingStore(tmp_path / "gateway" / "routing.json")
    assert store.read() is None
    assert store.location == f"file://{tmp_path / 'gateway' / 'routing.json'}"
    assert not (tmp_path / "gateway" / "routing.json").exists()


def test_update_stamps_revision_author_and_time(tmp_path):
    path = tmp_path / "gateway" / "routing.json"
    store = FileRoutingStore(path)
    seen: list[RoutingState | None] = []

    def first(current: RoutingState | None) -> RoutingState:
        seen.append(current)
        # whatever revision/author the mutation sets, the store stamps its own
        return RoutingState(model=MODEL, stable_version=3, revision=42, updated_by="liar")

    before = datetime.now(UTC)
    one = store.update(first, by="alice")
    assert seen == [None]
    assert (one.revision, one.updated_by, one.stable_version) == (1, "alice", 3)
    assert one.updated_at is not None and before - timedelta(seconds=1) <= one.updated_at <= datetime.now(UTC)
    assert store.read() == one

    def second(current: RoutingState | None) -> RoutingState:
        assert current == one
        return current.model_copy(update={"candidate_version": 4, "candidate_percent": {"high_value": 5.0}})

    two = store.update(second, by="bob")
    assert (two.revision, two.updated_by, two.candidate_version) == (2, "bob", 4)
    assert two.updated_at >= one.updated_at
    assert store.read() == two
    three = store.update(lambda current: current, by="carol")
    assert three.revision == 3 and three.candidate_percent == {"high_value": 5.0}
    assert json.loads(path.read_text(encoding="utf-8"))["revision"] == 3  # the file holds what read() returns


def test_failing_mutation_leaves_the_document_alone(tmp_path):
    store = FileRoutingStore(tmp_path / "routing.json")
    store.update(_bump_stable, by="t")

    def refuse(current: RoutingState | None) -> RoutingState:
        raise StepError("refused")

    with pytest.raises(StepError, match="refused"):
        store.update(refuse, by="t")
    state = store.read()
    assert state is not None and state.revision == 1
    assert store.update(_bump_stable, by="t").revision == 2  # and the lock was released


def test_concurrent_updates_lose_nothing(tmp_path):
    threads_n, per_thread = 8, 12
    path = tmp_path / "routing.json"
    start = threading.Barrier(threads_n)
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        store = FileRoutingStore(path)  # each thread its own store object, as separate processes would have
        try:
            start.wait()
            for _ in range(per_thread):
                store.update(_bump_stable, by=f"thread-{i}")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert not any(t.is_alive() for t in threads)
    final = FileRoutingStore(path).read()
    assert final is not None
    assert final.revision == threads_n * per_thread
    assert final.stable_version == threads_n * per_thread  # every increment landed
    assert final.updated_by.startswith("thread-")


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "",
        json.dumps({"model": MODEL}),  # no stable_version
        json.dumps({"model": MODEL, "stable_version": 2, "candidate_version": 2}),  # valid JSON, invalid state
        json.dumps({"model": MODEL, "stable_version": 1, "surprise": True}),
    ],
)
def test_corrupt_file_names_the_file(tmp_path, content):
    path = tmp_path / "routing.json"
    path.write_text(content, encoding="utf-8")
    store = FileRoutingStore(path)
    with pytest.raises(RoutingStateCorrupt, match=r"is invalid") as info:
        store.read()
    assert str(path) in str(info.value)
    assert isinstance(info.value, StepError)
    with pytest.raises(RoutingStateCorrupt):
        store.update(_bump_stable, by="t")  # an update does not paper over a corrupt document
    assert path.read_text(encoding="utf-8") == content


def test_events_are_appended_in_order_and_limited(tmp_path):
    store = FileRoutingStore(tmp_path / "routing.json")
    assert store.read_events() == []
    for i in range(5):
        store.append_event({"type": "step", "n": i, "at": datetime(2026, 11, 29, i, tzinfo=UTC)})
    events = store.read_events()
    assert [e["n"] for e in events] == [0, 1, 2, 3, 4]
    assert events[0]["at"] == "2026-11-29 00:00:00+00:00"  # non-JSON values are stored as text
    assert [e["n"] for e in store.read_events(limit=2)] == [3, 4]  # the newest, oldest first
    assert [e["n"] for e in store.read_events(limit=50)] == [0, 1, 2, 3, 4]
    assert [e["n"] for e in FileRoutingStore(tmp_path / "routing.json").read_events(1)] == [4]
    assert store.read() is None  # events do not create the document


def test_read_events_limit_zero_returns_none(tmp_path):
    store = FileRoutingStore(tmp_path / "routing.json")
    for i in range(3):
        store.append_event({"n": i})
    assert store.read_events(limit=0) == []


def test_open_routing_store_file_url(tmp_path):
    store = open_routing_store("file:///x/y.json", "m")
    assert isinstance(store, FileRoutingStore)
    assert store.path == Path("/x/y.json")
    assert store.location == "file:///x/y.json"
    real = open_routing_store(f"file://{tmp_path / 'r.json'}", MODEL)
    assert isinstance(real, FileRoutingStore) and real.read() is None


@pytest.mark.parametrize("url", ["ftp://x", "file://", "x/y.json", "", "http://127.0.0.1/routing.json"])
def test_open_routing_store_refuses_other_urls(url):
    with pytest.raises(StepError, match=r"neither file:///path nor redis://"):
        open_routing_store(url, "m")
