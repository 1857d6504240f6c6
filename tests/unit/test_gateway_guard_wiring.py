"""How the gateway feeds the candidate's fast guard: stable judged at the candidate's budget, a failed batch once."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np

from mlrelease.gateway.config import DEFAULT_CONFIG, load_config
from mlrelease.gateway.metrics import GatewayMetrics
from mlrelease.gateway.model_client import ModelAnswer, ModelFailure
from mlrelease.gateway.service import PredictService, _Call

CANDIDATE, STABLE = 2, 1


class _Router:
    """A routing state with a candidate in it, and the trips the service asked for."""

    def __init__(self) -> None:
        self.state = SimpleNamespace(candidate_version=CANDIDATE, stable_version=STABLE)
        self.trips: list[tuple[int, str]] = []

    def trip(self, version: int, reason: str) -> None:
        self.trips.append((version, reason))


def _service(infer: Any) -> tuple[PredictService, _Router]:
    config = load_config(DEFAULT_CONFIG)
    router = _Router()
    model = SimpleNamespace(predict=infer)  # the model call under the service, faked
    metrics = GatewayMetrics().for_model(config.model)
    return PredictService(config, config.spec, None, model, router, metrics), router  # type: ignore[arg-type]


def _call(service: PredictService, version: int, candidate: bool) -> ModelAnswer | None:
    timeout_ms = service.config.guard.candidate_timeout_ms if candidate else service.config.guard.stable_timeout_ms
    row = np.zeros((1, 14), np.float32)
    return asyncio.run(service._call(version, row, _Call("core", version, 1, 0), timeout_ms, candidate=candidate))  # noqa: SLF001


def test_a_slowdown_that_times_out_the_candidate_also_counts_against_stable_so_it_never_trips():
    """Serving slows past the candidate's 500 ms budget but within stable's 2 s: without judging stable at the
    candidate's budget, every candidate timeout beside a stable answer would trip the candidate in 7 calls."""
    budget_s = load_config(DEFAULT_CONFIG).guard.candidate_timeout_ms / 1000

    async def slow(version: int, row: Any, timeout_s: float, role: str) -> ModelAnswer:
        if timeout_s <= budget_s:
            raise ModelFailure("timeout", f"version {version} did not answer in time")
        await asyncio.sleep(budget_s * 1.2)  # slower than the candidate's budget: sleep never returns early
        return ModelAnswer(10.0, 0.9)

    service, router = _service(slow)
    service.guard(CANDIDATE).observe("candidate", False, count=12)  # the guard needs a traffic share to weigh
    service.guard(CANDIDATE).observe("stable", False, count=88)
    for _ in range(service.guard(CANDIDATE).run_to_trip + 2):
        assert _call(service, CANDIDATE, candidate=True) is None
        assert _call(service, STABLE, candidate=False) is not None  # the client still gets stable's answer
    assert router.trips == []
    assert service.guard(CANDIDATE).runs["stable"] == service.guard(CANDIDATE).run_to_trip + 2  # all failures


def test_the_same_candidate_failures_beside_a_fast_stable_trip_it_in_a_run():
    async def broken_candidate(version: int, row: Any, timeout_s: float, role: str) -> ModelAnswer:
        if role == "candidate":
            raise ModelFailure("error", f"version {version}: HTTP 500")
        return ModelAnswer(10.0, 0.9)

    service, router = _service(broken_candidate)
    service.guard(CANDIDATE).observe("candidate", False, count=12)
    service.guard(CANDIDATE).observe("stable", False, count=88)
    calls = 0
    while not router.trips:
        calls += 1
        _call(service, CANDIDATE, candidate=True)
        _call(service, STABLE, candidate=False)
    assert router.trips[0][0] == CANDIDATE and calls <= service.guard(CANDIDATE).run_to_trip


def test_the_rows_of_one_failed_batch_are_one_failure_for_the_guard():
    """A batch of 40 rows fails in one Triton call: one piece of evidence, not 40 (which would trip a healthy one)."""
    shared = object()

    async def one_failed_batch(version: int, row: Any, timeout_s: float, role: str) -> ModelAnswer:
        if role == "candidate":
            raise ModelFailure("error", f"version {version}: HTTP 503", call=shared)
        return ModelAnswer(10.0, 0.9)

    service, router = _service(one_failed_batch)
    service.guard(CANDIDATE).observe("candidate", False, count=12)
    service.guard(CANDIDATE).observe("stable", False, count=88)
    for _ in range(40):
        _call(service, CANDIDATE, candidate=True)
        _call(service, STABLE, candidate=False)  # each row retried on stable
    assert router.trips == []
    assert service.guard(CANDIDATE).failures == 1
