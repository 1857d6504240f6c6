"""Failure runs pooled across gateway replicas: a broken candidate stopped at the fleet's pace, a healthy one never."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np

from mlrelease.gateway.config import DEFAULT_CONFIG, load_config
from mlrelease.gateway.metrics import GatewayMetrics
from mlrelease.gateway.model_client import ModelAnswer, ModelFailure
from mlrelease.gateway.run_pool import RunReporter, pooled_run
from mlrelease.gateway.service import PredictService, _Call
from mlrelease.gateway.split_guard import SplitGuard

CANDIDATE, STABLE = 2, 1
NOW = 100.0


def test_runs_pool_only_while_every_live_replica_is_in_one_with_stable_answering_there():
    in_runs = {"a": (3, True, NOW), "b": (2, True, NOW), "c": (2, True, NOW - 1)}
    assert pooled_run(in_runs, NOW, live_s=3) == 7
    assert pooled_run({**in_runs, "d": (0, False, NOW)}, NOW, live_s=3) == 0  # d answers the candidate
    assert pooled_run({**in_runs, "d": (0, False, NOW - 10)}, NOW, live_s=3) == 7  # d is gone: silent 10 s
    assert pooled_run({**in_runs, "d": (-1, False, NOW)}, NOW, live_s=3) == 7  # d never called the candidate
    # stable did not answer on c during its run (it failed there, or rests behind its breaker): c's run may be an
    # outage of c's own, not the candidate's, and adds up with nothing
    assert pooled_run({**in_runs, "c": (20, False, NOW)}, NOW, live_s=3) == 0
    assert pooled_run({}, NOW, live_s=3) == 0


def test_a_replica_reports_minus_one_until_the_candidate_calls_there_and_its_run_with_stable_answering():
    guard = SplitGuard(ratio=1000, alpha=1e-4, window_s=10, clock=lambda: NOW)
    assert guard.clean_run == (-1, False)
    guard.observe("stable", False, count=5)
    assert guard.clean_run == (-1, False)
    guard.observe("candidate", True)
    assert guard.clean_run == (1, False)
    guard.observe("stable", False)
    guard.observe("candidate", True)
    assert guard.clean_run == (2, True)
    assert not guard.pooled_trip(guard.run_to_trip - 1)
    assert guard.pooled_trip(guard.run_to_trip) and guard.reason == "pooled"
    assert "across the gateway's replicas" in guard.describe()


def test_a_replica_whose_run_ended_does_not_trip_on_a_late_pooled_answer():
    guard = SplitGuard(ratio=1000, alpha=1e-4, window_s=10, clock=lambda: NOW)
    guard.observe("candidate", True)
    guard.observe("candidate", False)  # the candidate answered here before the pool's answer came back
    assert not guard.pooled_trip(guard.run_to_trip + 5) and not guard.tripped


class _MemoryPool:
    """The pool as Redis keeps it, in memory (every replica live)."""

    def __init__(self) -> None:
        self.runs: dict[str, tuple[int, bool, float]] = {}

    async def report(self, candidate: int, replica: str, run: int, answered: bool) -> int:
        self.runs[replica] = (run, answered, NOW)
        return pooled_run(self.runs, NOW, live_s=3.0)


class _Router:
    """A replica's routing state with a candidate in it (no trip stored yet), and the trips it was asked for."""

    def __init__(self) -> None:
        self.state = SimpleNamespace(
            candidate_version=CANDIDATE, stable_version=STABLE, is_tripped=lambda version: False
        )
        self.trips: list[tuple[int, str]] = []

    @property
    def locally_tripped(self) -> frozenset[int]:
        return frozenset(version for version, _ in self.trips)

    def trip(self, version: int, reason: str) -> None:
        self.trips.append((version, reason))


def _replicas(n: int, infer: Any) -> tuple[list[PredictService], list[_Router]]:
    config, pool = load_config(DEFAULT_CONFIG), _MemoryPool()
    routers = [_Router() for _ in range(n)]
    model = SimpleNamespace(predict=infer)
    services = [
        PredictService(
            config,
            config.spec,
            None,
            model,
            router,
            GatewayMetrics().for_model(config.model),
            pool=pool,
            replica=f"r{i}",
        )  # type: ignore[arg-type]
        for i, router in enumerate(routers)
    ]
    return services, routers


async def _call(service: PredictService, version: int, candidate: bool) -> ModelAnswer | None:
    timeout_ms = service.config.guard.candidate_timeout_ms if candidate else service.config.guard.stable_timeout_ms
    row = np.zeros((1, 14), np.float32)
    answer = await service._call(version, row, _Call("core", version, 1, 0), timeout_ms, candidate=candidate)  # noqa: SLF001
    await asyncio.sleep(0)  # the pool's answer (a task) lands before the next request
    await asyncio.sleep(0)
    return answer


def test_a_candidate_failing_everywhere_trips_on_the_pooled_run_before_any_replica_alone_would():
    async def broken_candidate(version: int, row: Any, timeout_s: float, role: str) -> ModelAnswer:
        if role == "candidate":
            raise ModelFailure("error", f"version {version}: HTTP 500")
        return ModelAnswer(10.0, 0.9)

    async def scenario() -> tuple[int, list[PredictService], list[_Router]]:
        services, routers = _replicas(3, broken_candidate)
        calls = 0
        while not any(r.trips for r in routers) and calls < 50:
            service = services[calls % 3]  # the load balancer spreads the requests
            calls += 1
            await _call(service, CANDIDATE, candidate=True)
            await _call(service, STABLE, candidate=False)
        return calls, services, routers

    calls, services, routers = asyncio.run(scenario())
    run_to_trip = services[0].guard(CANDIDATE).run_to_trip
    assert calls == run_to_trip  # the fleet's 7th back-to-back failure, ~2 on each replica (alone: 7 each)
    tripped = [s.guard(CANDIDATE) for s in services if s.guard(CANDIDATE).tripped]
    assert len(tripped) == 1 and tripped[0].reason == "pooled"
    assert max(s.guard(CANDIDATE).clean_run[0] for s in services) < run_to_trip


def test_runs_on_two_replicas_while_the_third_answers_the_candidate_never_trip_a_pooled_run():
    """A burst of 5 on one replica and 2 failures on another add up to 7, a run no healthy version shows, but the
    third replica answers the candidate: the failures were not back to back across the fleet."""
    answering = {"r2"}

    async def failing_on_r0_r1(version: int, row: Any, timeout_s: float, role: str) -> ModelAnswer:
        if role == "candidate" and replica_now[0] not in answering:
            raise ModelFailure("error", "stalled instance")
        return ModelAnswer(10.0, 0.9)

    replica_now = [""]

    async def scenario(third_answers: bool) -> list[_Router]:
        services, routers = _replicas(3, failing_on_r0_r1)
        plan = [(2, 1)] if third_answers else []
        plan += [(0, services[0].guard(CANDIDATE).burst_failures), (1, 2)]
        for replica, failures in plan:
            replica_now[0] = f"r{replica}"
            for _ in range(failures):
                await _call(services[replica], CANDIDATE, candidate=True)
                await _call(services[replica], STABLE, candidate=False)
        return routers

    assert all(not r.trips for r in asyncio.run(scenario(third_answers=True)))
    # the same failures while the third replica never called the candidate are back to back: they trip it
    assert any(r.trips for r in asyncio.run(scenario(third_answers=False)))


def test_a_tripped_candidate_leaves_the_pool_so_its_frozen_runs_never_trip_it_again():
    """Once a trip moved the traffic, no replica calls the candidate: each heartbeats -1 instead of the run it froze
    at, and a late pooled answer for a tripped version (or one no longer the candidate) trips nothing more."""

    async def broken_candidate(version: int, row: Any, timeout_s: float, role: str) -> ModelAnswer:
        if role == "candidate":
            raise ModelFailure("error", f"version {version}: HTTP 500")
        return ModelAnswer(10.0, 0.9)

    async def scenario() -> tuple[list[PredictService], list[_Router], _MemoryPool]:
        services, routers = _replicas(3, broken_candidate)
        pool = services[0].reporter.pool  # type: ignore[union-attr]
        calls = 0
        while not any(r.trips for r in routers):
            service = services[calls % 3]
            calls += 1
            await _call(service, CANDIDATE, candidate=True)
            await _call(service, STABLE, candidate=False)
        for router in routers:  # the stored trip adopted by every replica (what the routing refresh does)
            router.state.is_tripped = lambda version: version == CANDIDATE
        for service in services:
            service.heartbeat()
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        services[1]._pooled(CANDIDATE, 50)  # noqa: SLF001  (a late answer to an earlier write)
        return services, routers, pool  # type: ignore[return-value]

    services, routers, pool = asyncio.run(scenario())
    assert sum(len(r.trips) for r in routers) == 1  # one trip, one alert: not one per replica
    assert {run for run, _, _ in pool.runs.values()} == {-1}
    assert all(CANDIDATE not in s._guards for s in services)  # noqa: SLF001  (a reset starts from a fresh run)


def test_the_reporter_tries_a_failed_write_once_more_and_dedups_on_what_it_sent():
    class _Flaky(_MemoryPool):
        def __init__(self) -> None:
            super().__init__()
            self.failures = 1

        async def report(self, candidate: int, replica: str, run: int, answered: bool) -> int:
            if self.failures:
                self.failures -= 1
                raise ConnectionError("Redis blinked")
            return await super().report(candidate, replica, run, answered)

    pooled: list[int] = []

    async def scenario() -> _Flaky:
        pool = _Flaky()
        reporter = RunReporter(pool, "r0", lambda candidate, run: pooled.append(run))
        reporter.update(CANDIDATE, 0, False)  # the success that ended a run: its write must not be lost
        await reporter.close()
        return pool

    pool = asyncio.run(scenario())
    assert pool.runs["r0"][:2] == (0, False) and pooled == [0]
