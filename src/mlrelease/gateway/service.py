"""The predict path, apart from HTTP: features → cohort → version → answer, with retry on stable and fallback."""

from __future__ import annotations

import asyncio
import time
import zlib
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from mlrelease.gateway.api_models import PredictRequest
from mlrelease.gateway.batcher import MicroBatcher
from mlrelease.gateway.cohorts import assign_cohort, bucket
from mlrelease.gateway.config import GatewayConfig
from mlrelease.gateway.decision_log import DecisionLog
from mlrelease.gateway.guard import BreakerState, CircuitBreaker
from mlrelease.gateway.metrics import ModelMetrics
from mlrelease.gateway.model_client import ModelAnswer, ModelFailure, TritonModelClient
from mlrelease.gateway.online_features import BatchingLookup, FeatureStoreUnavailable
from mlrelease.gateway.router import REPLICA, Router
from mlrelease.gateway.run_pool import RunPool, RunReporter
from mlrelease.gateway.split_guard import SplitGuard
from mlrelease.model.feature_codec import FeatureCodec
from mlrelease.release_spec import ReleaseSpec

INVALID_ANSWERS = ("nan", "out_of_range")  # answers no version may give: judged exactly, not against stable


class RoutingStateMissing(Exception):
    """No routing state was ever read: the gateway does not know which version is stable."""


class PredictService:
    """Answers one PredictRequest; the HTTP layer maps its exceptions to responses.

    :param config: the gateway config.
    :param spec: the served model's release spec (its features, cohorts, outputs and fallback).
    :param lookup: Feast online lookup with freshness checks (batched).
    :param model: async Triton client.
    :param router: current routing state and local trips.
    :param metrics: the served model's metrics.
    :param decisions: the decision log every model call is recorded in.
    :param batcher: coalesces concurrent rows per version into one Triton call (None: one call per request).
    :param pool: where the replicas pool the candidate's failure runs (None: this replica's own runs only).
    :param replica: this replica's name in the pool.
    """

    def __init__(
        self,
        config: GatewayConfig,
        spec: ReleaseSpec,
        lookup: BatchingLookup,
        model: TritonModelClient,
        router: Router,
        metrics: ModelMetrics,
        decisions: DecisionLog | None = None,
        batcher: MicroBatcher | None = None,
        pool: RunPool | None = None,
        replica: str = REPLICA,
    ) -> None:
        self.config = config
        self.spec = spec  # the model's rules and outputs, looked up in its spec once, not on every request
        self.cohorts = spec.cohorts
        self._encode_row = FeatureCodec(spec.features).encode_row
        self._outputs = spec.prediction_and_score()  # the response's field names
        self._fallback = spec.fallback_answer()
        self.lookup = lookup
        self.model = model
        self.router = router
        self.metrics = metrics
        self.decisions = decisions
        self.batcher = batcher
        # Rows go through the micro-batcher when there is one; either way one row in, one answer or failure out.
        self._infer = batcher.predict if batcher is not None else model.predict
        self._breakers: dict[int, CircuitBreaker] = {}
        self._guards: dict[int, SplitGuard] = {}
        self._version_series: dict[int, tuple[Any, Any]] = {}
        self.reporter = RunReporter(pool, replica, self._pooled) if pool is not None else None

    def breaker(self, version: int) -> CircuitBreaker:
        """The version's circuit breaker (created on first use)."""
        if version not in self._breakers:
            guard = self.config.guard
            self._breakers[version] = CircuitBreaker(guard.failures_to_trip, guard.window_s, guard.stable_open_s)
        return self._breakers[version]

    def guard(self, candidate: int) -> SplitGuard:
        """The candidate version's relative fast guard on this replica (created on first use)."""
        if candidate not in self._guards:
            guard = self.config.guard
            self._guards[candidate] = SplitGuard(
                ratio=guard.failure_ratio,
                alpha=guard.false_trip_rate,
                window_s=guard.window_s,
                invalid_to_trip=guard.invalid_to_trip,
                burst_failures=guard.burst_failures,
            )
        return self._guards[candidate]

    async def features_for(self, request: PredictRequest) -> dict[str, Any]:
        """Supplied features, or the online store's (raises the lookup errors)."""
        if request.features is not None:
            return dict(request.features.__dict__)  # validated already; a shallow copy is all model_dump did here
        started = time.perf_counter()
        ids = {"user_id": request.user_id, "package_id": request.package_id, "route_id": request.route_id}
        timeout_s = self.config.feature_timeout_ms / 1000
        try:
            # The store's own client may retry for seconds (redis-py backs off up to 10 s): answer 503 long before.
            async with asyncio.timeout(timeout_s):
                return await self.lookup.fetch(ids)
        except TimeoutError:
            raise FeatureStoreUnavailable(f"online feature lookup took over {timeout_s * 1000:.0f} ms") from None
        finally:
            self.metrics.feature_latency.observe(time.perf_counter() - started)

    async def predict(self, request: PredictRequest) -> dict[str, Any]:
        """Route the request and answer it (the model's response fields); a failing candidate is retried on stable,
        a failing stable falls back."""
        started = time.perf_counter()
        features = await self.features_for(request)
        attributes = {
            **features,
            "order_id": request.order_id,
            "user_id": request.user_id,
            "package_id": request.package_id,
            "route_id": request.route_id,
        }
        cohort = assign_cohort(self.cohorts, attributes)
        state = self.router.state
        user = attributes[self.cohorts.bucket_key]
        canary_bucket = bucket(user)
        route = self.router.route(cohort, canary_bucket)
        if state is None or route is None:
            raise RoutingStateMissing(self.router.last_error or "no routing state has been read yet")
        version, role = route
        # The arm the request is judged in is its user's assignment, whoever answers it (see rollout/windows.py).
        call = _Call(
            cohort, self.router.assigned(state, cohort, canary_bucket), zlib.crc32(str(user).encode()), canary_bucket
        )
        row = self._encode_row(features)
        answer: ModelAnswer | None = None
        source: Literal["model", "fallback_rule"]
        if role == "candidate":
            answer = await self._call(version, row, call, self.config.guard.candidate_timeout_ms, candidate=True)
            if answer is None:  # the client never sees a candidate failure: answer from stable instead
                version = state.stable_version
                call = call.retried()
        if answer is None:
            if self.breaker(version).allow():
                answer = await self._call(version, row, call, self.config.guard.stable_timeout_ms, candidate=False)
            else:  # stable rests: the outage finder must see these users served no model, as the candidate's are not
                self._decided(call, version, "stable", "unavailable", 0.0, row)
                # …and so must the candidate's guard: its calls still fail in these seconds while stable makes none,
                # and a crash both versions share would read as the candidate's alone
                self._guarded(False, failed="unavailable", reason="stable rests behind its breaker")
        if answer is None:
            fallback = self._fallback(features)
            prediction, score = (fallback[name] for name in self._outputs)
            served, source = None, "fallback_rule"
        else:
            prediction, score, served, source = answer.prediction, answer.score, version, "model"
        self.metrics.observe_answer(
            cohort, str(served or "none"), source, prediction, score, time.perf_counter() - started
        )
        # The fields of the model's response (api_models.response_model), unvalidated: each value is built here from
        # validated parts, and validating the answer again cost as much as the rest of the bookkeeping.
        return {
            "order_id": request.order_id,
            self._outputs[0]: prediction,
            self._outputs[1]: score,
            "model_version": served,
            "cohort": cohort,
            "source": source,
            "routing_revision": state.revision,
        }

    async def _call(
        self, version: int, row: Any, call: _Call, timeout_ms: float, *, candidate: bool
    ) -> ModelAnswer | None:
        """One guarded model call: None on a hard failure (recorded; the candidate's guard or stable's breaker told)."""
        breaker = self.breaker(version)
        latency, breaker_gauge = self._series(version)
        role = "candidate" if candidate else "stable"
        started = time.perf_counter()
        try:
            answer = await self._infer(version, row, timeout_ms / 1000, role)
        except ModelFailure as failure:
            self._decided(call, version, role, failure.kind, time.perf_counter() - started, row)
            self.metrics.model_failures.labels(str(version), failure.kind).inc()
            self._guarded(candidate, failed=failure.kind, reason=str(failure), call=failure.call)
            if not candidate:  # stable's breaker rests a failing stable (the rule answers meanwhile)
                breaker.record_failure()
                breaker_gauge.set(breaker.state)
            return None
        elapsed = time.perf_counter() - started
        self._decided(call, version, role, "ok", elapsed, row, answer)
        latency.observe(elapsed)  # what the request waited for its answer: batching wait included
        # Stable judged at the candidate's budget: a stable answer the candidate's timeout would have cut off is a
        # failure for the guard, so a slowdown of serving splits between the arms, not onto the candidate alone.
        too_slow = not candidate and elapsed * 1000 > self.config.guard.candidate_timeout_ms
        self._guarded(candidate, failed="slower than the candidate's timeout" if too_slow else None)
        if breaker.state is not BreakerState.CLOSED:
            breaker.record_success()
            breaker_gauge.set(breaker.state)
        return answer

    def _guarded(self, candidate: bool, *, failed: str | None, reason: str = "", call: object | None = None) -> None:
        """Tell the candidate's relative guard about one model call (by the version that made it: a stable retry is a
        stable call of the same seconds), and trip the candidate on its evidence. `failed`: the failure kind; `call`:
        the failed model call its batch shared."""
        state = self.router.state
        if state is None or state.candidate_version is None:
            return
        if candidate and self.guard(state.candidate_version).tripped:  # routed here again: the trip was cleared
            del self._guards[state.candidate_version]
        guard = self.guard(state.candidate_version)
        if candidate and failed in INVALID_ANSWERS:
            tripped = guard.invalid_answer()
        else:
            tripped = guard.observe("candidate" if candidate else "stable", failed is not None, call=call)
        if tripped:
            self.router.trip(state.candidate_version, f"{guard.describe()}; last: {reason}")
        elif self.reporter is not None and self.reporter.latest() != (state.candidate_version, *guard.clean_run):
            self.reporter.update(state.candidate_version, *guard.clean_run)

    def heartbeat(self) -> None:
        """Write this replica's run of the current candidate to the pool, changed or not (the pool's liveness)."""
        state = self.router.state
        if self.reporter is None or state is None or state.candidate_version is None:
            return
        candidate = state.candidate_version
        if self._tripped(candidate):  # out of service: no calls, so no run (a frozen one would re-trip it later)
            self._guards.pop(candidate, None)
            self.reporter.update(candidate, -1, False, force=True)
            return
        guard = self._guards.get(candidate)
        self.reporter.update(candidate, *(guard.clean_run if guard else (-1, False)), force=True)

    def _tripped(self, version: int) -> bool:
        """Whether `version` is out of service: tripped here, or by a replica whose trip the routing state holds."""
        state = self.router.state
        return version in self.router.locally_tripped or (state is not None and state.is_tripped(version))

    def _pooled(self, candidate: int, pooled: int) -> None:
        """The pool's answer to a write: trip the candidate when the replicas' runs add up to a run no healthy
        version shows (not a version that is no longer the candidate, nor one tripped already)."""
        state = self.router.state
        if state is None or state.candidate_version != candidate or self._tripped(candidate):
            return
        guard = self._guards.get(candidate)
        if guard is not None and guard.pooled_trip(pooled):
            self.router.trip(candidate, guard.describe())

    def _series(self, version: int) -> tuple[Any, Any]:
        """The version's latency histogram and breaker gauge children (labels() per call costs a lock and a tuple)."""
        series = self._version_series.get(version)
        if series is None:
            label = str(version)
            series = self._version_series[version] = (
                self.metrics.model_latency.labels(label),
                self.metrics.breaker_state.labels(label),
            )
            series[1].set(self.breaker(version).state)
        return series

    def _decided(
        self, call: _Call, version: int, role: str, outcome: str, latency_s: float, row: Any, answer: Any = None
    ) -> None:
        """Record one model call (or a request stable's breaker rested) in the arm series and the decision log."""
        self.metrics.arms.observe(
            cohort=call.cohort,
            assigned=call.assigned,
            bucket=call.bucket,
            retry=call.retry,
            outcome=outcome,
            latency_s=latency_s,
            prediction=answer.prediction if answer else None,
            score=answer.score if answer else None,
        )
        if self.decisions is None:
            return
        encoded = np.ascontiguousarray(row[0], dtype=np.float32)
        self.decisions.record(
            cohort=call.cohort,
            version=version,
            role=role,
            outcome=outcome,
            latency_s=latency_s,
            assigned=call.assigned,
            unit=call.unit,
            retry=call.retry,
            eta=answer.prediction if answer else None,  # the log's names for the prediction and the score
            confidence=answer.score if answer else None,
            # one numpy pass instead of 14 Python round() calls; float64 first so 5 decimals print as before
            features=encoded.astype(np.float64).round(5).tolist() if self.decisions.with_features else None,
            key=zlib.crc32(encoded.tobytes()),  # the request's identity for the guardrails (same inputs, same key)
        )


@dataclass(frozen=True, slots=True)
class _Call:
    """What the decision log and the guard need to know about a request besides its answer."""

    cohort: str
    assigned: int  # the version the user is assigned to (the arm it is judged in)
    unit: int  # a hash of the user: the unit of analysis
    bucket: int  # the user's canary bucket: its Prometheus analysis unit (gateway/arm_metrics.py)
    retry: bool = False  # this call answers, on stable, a candidate-assigned request whose candidate call failed

    def retried(self) -> _Call:
        """The same request, now being retried on stable."""
        return _Call(self.cohort, self.assigned, self.unit, self.bucket, retry=True)
