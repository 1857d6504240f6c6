"""The gateway Router: adopting documents, local guard trips, persisting and clearing them (file store, no servers)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mlrelease.errors import StepError
from mlrelease.gateway.file_routing_store import FileRoutingStore
from mlrelease.gateway.metrics import GatewayMetrics
from mlrelease.gateway.router import Router
from mlrelease.gateway.routing_state import RoutingState
from mlrelease.gateway.routing_store import RoutingStoreUnavailable

MODEL = "parcel_eta"


def _write(store: FileRoutingStore, **fields) -> RoutingState:
    def mutate(current):
        base = current.model_dump() if current else {"model": MODEL, "stable_version": 1}
        return RoutingState.model_validate({**base, **fields})

    return store.update(mutate, by="test")


def _router(store) -> Router:
    return Router(store, GatewayMetrics().for_model(MODEL), refresh_interval_s=0.05, model=MODEL)


async def _settle(router: Router) -> None:
    for _ in range(100):
        if not router._pending:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("trip was not persisted")


def test_a_trip_is_local_at_once_then_recorded_and_cleared_by_a_later_write(tmp_path: Path):
    store = FileRoutingStore(tmp_path / "routing.json")
    _write(store, candidate_version=2, candidate_percent={"*": 100.0})

    async def scenario() -> None:
        router = _router(store)
        await router.refresh()
        assert router.route("core", 0) == (2, "candidate")
        router.trip(2, "nan: version 2 answered eta=nan")
        assert router.route("core", 0) == (1, "stable")  # before anything is written
        await _settle(router)
        stored = store.read()
        assert stored is not None and [t.version for t in stored.guard_trips] == [2]
        assert [e["type"] for e in store.read_events()] == ["guard_trip"]
        await router.refresh()
        assert router.route("core", 0) == (1, "stable")  # the recorded trip keeps it out
        _write(store, guard_trips=())  # an operator clears it, same version
        await router.refresh()
        assert router.route("core", 0) == (2, "candidate")

    asyncio.run(scenario())


def test_a_rewritten_store_is_adopted_and_an_older_revision_is_not(tmp_path: Path):
    path = tmp_path / "routing.json"
    store = FileRoutingStore(path)
    for _ in range(5):
        _write(store, candidate_version=2, candidate_percent={"*": 100.0})

    async def scenario() -> None:
        router = _router(store)
        await router.refresh()
        router.trip(2, "error")
        await _settle(router)
        assert router.state is not None and router.state.revision == 6
        stale = router.state.model_copy(update={"revision": 3})
        path.write_text(stale.model_dump_json())  # same epoch, older revision: ignored
        await router.refresh()
        assert router.state.revision == 6 and router.route("core", 0) == (1, "stable")
        path.unlink()  # the store is wiped and rewritten from scratch: revision 1 of a new epoch, no trips
        _write(store, candidate_version=2, candidate_percent={"*": 100.0})
        await router.refresh()
        assert router.state.revision == 1 and router.route("core", 0) == (2, "candidate")

    asyncio.run(scenario())


class FlakyStore(FileRoutingStore):
    """A file store whose first `failures` writes fail like a full disk."""

    def __init__(self, path: Path, failures: int) -> None:
        super().__init__(path)
        self.failures = failures

    def update(self, mutate, *, by):
        if self.failures > 0:
            self.failures -= 1
            raise RoutingStoreUnavailable("routing state cannot be written: [Errno 28] No space left on device")
        return super().update(mutate, by=by)


def test_a_failing_store_keeps_the_trip_local_and_retries(tmp_path: Path):
    store = FlakyStore(tmp_path / "routing.json", failures=0)
    _write(store, candidate_version=2, candidate_percent={"*": 100.0})
    store.failures = 2

    async def scenario() -> None:
        router = _router(store)
        await router.refresh()
        router.trip(2, "timeout")
        await asyncio.sleep(0.05)
        assert router.route("core", 0) == (1, "stable")
        assert store.read().guard_trips == ()  # not yet written
        await _settle(router)
        assert [t.version for t in store.read().guard_trips] == [2]

    asyncio.run(scenario())


def test_a_corrupt_or_foreign_document_keeps_the_last_good_state(tmp_path: Path):
    path = tmp_path / "routing.json"
    store = FileRoutingStore(path)
    good = _write(store, candidate_version=2, candidate_percent={"high_value": 100.0})

    async def scenario() -> None:
        router = _router(store)
        await router.refresh()
        path.write_text("{not json")
        await router.refresh()
        assert router.state == good and "is invalid" in (router.last_error or "")
        path.write_text(good.model_copy(update={"model": "other", "revision": 9}).model_dump_json())
        await router.refresh()
        assert router.state == good and "for model 'other'" in (router.last_error or "")

    asyncio.run(scenario())


def test_stop_cancels_a_trip_still_being_written(tmp_path: Path):
    store = FlakyStore(tmp_path / "routing.json", failures=0)
    _write(store, candidate_version=2, candidate_percent={"*": 100.0})
    store.failures = 10_000

    async def scenario() -> None:
        router = _router(store)
        await router.refresh()
        router.trip(2, "error")
        await asyncio.sleep(0.05)
        await router.stop()
        assert not router._pending

    asyncio.run(scenario())


def test_with_trip_needs_a_document():
    from mlrelease.gateway.router import _with_trip
    from mlrelease.gateway.routing_state import GuardTrip

    trip = GuardTrip(version=2, reason="x", at="2026-11-29T02:00:00Z", replica="r")
    with pytest.raises(StepError, match="routing state disappeared"):
        _with_trip(None, trip)


def test_a_redis_password_never_reaches_the_store_location():
    from mlrelease.gateway.redis_routing_store import RedisRoutingStore

    store = RedisRoutingStore("redis://:s3cret@redis.example:6380/2", MODEL)
    assert "s3cret" not in store.location and store.location.startswith("redis://redis.example:6380/2#")


def test_a_file_url_with_a_host_is_refused():
    from mlrelease.gateway.routing_store_factory import open_routing_store

    with pytest.raises(StepError, match="three slashes"):
        open_routing_store("file://gateway/routing.json", MODEL)


def test_routing_set_gives_a_new_candidate_no_traffic_unless_told():
    import argparse

    from mlrelease.gateway.config import load_config

    config = load_config()
    current = RoutingState(model=MODEL, stable_version=1, candidate_version=2, candidate_percent={"high_value": 100})
    from mlrelease.gateway.cli import updated_state

    def args(**kw):
        base = {"stable": None, "candidate": None, "percent": None, "clear_trips": False}
        return argparse.Namespace(**{**base, **kw})

    assert updated_state(current, args(candidate=3), config).candidate_percent == {}
    assert updated_state(current, args(candidate=2), config).candidate_percent == {"high_value": 100}
    assert updated_state(current, args(candidate=3, percent=["*=5"]), config).serving_versions() == [1, 3]
    assert updated_state(current, args(candidate=0), config).serving_versions() == [1]
    with pytest.raises(StepError, match="--stable is required"):
        updated_state(None, args(candidate=2), config)


def test_seven_percent_is_exactly_seven_hundred_buckets():
    from mlrelease.gateway.routing_state import choose

    state = RoutingState(model=MODEL, stable_version=1, candidate_version=2, candidate_percent={"*": 7})
    on_candidate = sum(choose(state, "core", b, frozenset())[1] == "candidate" for b in range(10_000))
    assert on_candidate == 700


def test_version_roles_follow_the_routing_state(tmp_path: Path):
    store = FileRoutingStore(tmp_path / "routing.json")
    _write(store, candidate_version=2, candidate_percent={"high_value": 100.0})

    def roles(router: Router) -> dict[tuple[str, str], float]:
        samples = router.metrics.registry.get_sample_value
        return {
            (v, r): samples("mlrelease_gateway_version_role", {"model": MODEL, "version": v, "role": r})
            for v in ("1", "2")
            for r in ("stable", "candidate")
        }

    async def scenario() -> None:
        router = _router(store)
        await router.refresh()
        assert roles(router) == {("1", "stable"): 1, ("1", "candidate"): 0, ("2", "stable"): 0, ("2", "candidate"): 1}
        _write(store, stable_version=2, candidate_version=None, candidate_percent={})  # promoted
        await router.refresh()
        assert roles(router) == {("1", "stable"): 0, ("1", "candidate"): 0, ("2", "stable"): 1, ("2", "candidate"): 0}

    asyncio.run(scenario())
