"""A stable resting behind its breaker leaves a trace: the outage finder sees both arms' users served no model.

Without it a shared outage (Triton down) was one-sided in the decision log: the candidate's failed calls were
recorded while stable-assigned users, answered by the rule, left no record, so the cut could miss the outage and a
healthy candidate could be rolled back for a crash both versions shared.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from mlrelease.gateway.api_models import PredictRequest, SuppliedFeatures
from mlrelease.gateway.config import DEFAULT_CONFIG, load_config
from mlrelease.gateway.decision_log import DecisionLog
from mlrelease.gateway.metrics import GatewayMetrics
from mlrelease.gateway.model_client import ModelAnswer, ModelFailure
from mlrelease.gateway.routing_state import RoutingState, assigned_version, choose
from mlrelease.gateway.service import PredictService
from mlrelease.rollout.decision_log_source import DecisionLogSource
from mlrelease.rollout.outage import find_outages

STABLE, CANDIDATE = 1, 2
FEATURES = SuppliedFeatures(
    tier="standard",
    account_age_days=100,
    orders_30d=3,
    avg_declared_value_30d=50.0,
    weight_kg=2.0,
    volume_l=10.0,
    declared_value=40.0,
    category="books",
    is_bulky=False,
    region="north",
    distance_km=120.0,
    is_remote=False,
    congestion_index=0.3,
    avg_transit_hours_7d=20.0,
)


class _Router:
    """A fixed routing state: half of every cohort's users on the candidate."""

    def __init__(self) -> None:
        self.state = RoutingState(
            revision=1, model="m", stable_version=STABLE, candidate_version=CANDIDATE, candidate_percent={"*": 50}
        )
        self.locally_tripped: frozenset[int] = frozenset()
        self.last_error = None

    def route(self, cohort: str, bucket: int) -> Any:
        return choose(self.state, cohort, bucket, self.locally_tripped)

    def assigned(self, state: RoutingState, cohort: str, bucket: int) -> int:
        return assigned_version(state, cohort, bucket)

    def trip(self, version: int, reason: str) -> None:
        self.locally_tripped = self.locally_tripped | {version}


async def _down(version: int, row: Any, timeout_s: float, role: str) -> Any:
    raise ModelFailure("error", f"version {version}: connection refused")


def _serve_through_an_outage(directory) -> list[dict[str, Any]]:
    config = load_config(DEFAULT_CONFIG)
    decisions = DecisionLog(directory)
    model = SimpleNamespace(predict=_down)  # Triton down: every call of either version fails
    service = PredictService(
        config, config.spec, None, model, _Router(), GatewayMetrics().for_model(config.model), decisions
    )  # type: ignore[arg-type]

    async def requests() -> list[dict[str, Any]]:
        return [
            await service.predict(PredictRequest(order_id=i, user_id=i, package_id=i, route_id=i, features=FEATURES))
            for i in range(1, 201)
        ]

    answers = asyncio.run(requests())
    decisions.flush()
    return answers


def test_stable_assigned_requests_answered_by_the_rule_behind_an_open_breaker_are_recorded_unavailable(tmp_path):
    answers = _serve_through_an_outage(tmp_path)
    assert {a["source"] for a in answers} == {"fallback_rule"}  # the client is answered throughout
    records = DecisionLogSource(tmp_path)._reader.read(datetime.now(UTC) - timedelta(minutes=1))  # noqa: SLF001
    # stable's breaker opened after its failures (first calls or retries of failed candidate calls) ...
    failures_to_trip = load_config(DEFAULT_CONFIG).guard.failures_to_trip
    assert sum(r["role"] == "stable" and r["outcome"] == "error" for r in records) == failures_to_trip
    # ... and every stable-assigned request after that is recorded, though no call was made
    stable_first = [r for r in records if r["assigned"] == STABLE and not r.get("retry")]
    assert sum(r["outcome"] == "unavailable" for r in stable_first) >= len(stable_first) - failures_to_trip > 50


def _log_a_restart(directory, *, with_unavailable: bool) -> datetime:
    """A decision log of one Triton restart at 20 req/s per arm: stable's 3 failures open its breaker in second 0;
    for 4 s every candidate call fails while stable rests (the rule answers its users); then 36 s of answers."""
    since = datetime(2026, 11, 29, 2, 0, tzinfo=UTC)
    rows = []
    for second in range(40):
        for i in range(20):
            t = since.timestamp() + second + i / 20
            down = second < 5
            if second == 0 and i < 3:
                stable = "error"
            else:
                stable = "unavailable" if down else "ok"
            for arm, outcome in ((STABLE, stable), (CANDIDATE, "error" if down else "ok")):
                if outcome == "unavailable" and not with_unavailable:
                    continue  # what the gateway wrote before: nothing for a request its breaker rested
                rows.append(
                    {
                        "t": t,
                        "cohort": "core",
                        "version": arm,
                        "role": "x",
                        "assigned": arm,
                        "unit": i,
                        "outcome": outcome,
                        "latency_s": 0.002,
                        "w": 1.0,
                        "eta": 20.0,
                        "confidence": 0.9,
                    }
                )
    directory.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r) for r in rows]
    (directory / f"{since:%Y%m%dT%H}-replica.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return since


def _judged_candidate_failures(directory, since: datetime) -> float:
    source = DecisionLogSource(directory)
    until = since + timedelta(seconds=40)
    outages = find_outages(source.timeline(since, until, STABLE), max_gap_s=1.0)
    windows = source.windows(since, until, exclude=[(o.start, o.end) for o in outages])
    return windows[("*", CANDIDATE)].total("failed")


def test_a_restart_both_versions_shared_is_cut_out_whole_so_no_candidate_failure_is_judged(tmp_path):
    assert _judged_candidate_failures(tmp_path / "now", _log_a_restart(tmp_path / "now", with_unavailable=True)) == 0
    # without the breaker's records only stable's first second showed the outage: 4 s of candidate failures stayed
    before = tmp_path / "before"
    assert _judged_candidate_failures(before, _log_a_restart(before, with_unavailable=False)) == 80


def test_no_contract_reads_the_unavailable_records(tmp_path):
    since = _log_a_restart(tmp_path, with_unavailable=True)
    source = DecisionLogSource(tmp_path)
    until = since + timedelta(seconds=40)
    windows = source.windows(since, until)
    assert windows[("*", STABLE)].requests == 35 * 20 + 3  # the calls made: 3 failed, then 35 s of answers
    assert windows[("*", STABLE)].total("failed") == 3
    assert source.timeline(since, until, STABLE).calls.sum() == 40 * 20 * 2 - 5 * 20 + 3


def test_the_candidate_is_not_tripped_by_an_outage_stable_rests_through(tmp_path):
    """Both versions down: each request stable's breaker turns away is a stable failure for the relative guard too.
    Before, only the candidate's calls kept failing while stable rested, and the guard took a healthy candidate
    out of service on a crash both versions shared (the Triton-kill drill rolled it back)."""
    router = _Router()
    down = False

    async def triton(version: int, row: Any, timeout_s: float, role: str) -> Any:
        if down:
            raise ModelFailure("error", f"version {version}: connection refused")
        return ModelAnswer(20.0, 0.9)

    model = SimpleNamespace(predict=triton)
    config = load_config(DEFAULT_CONFIG)
    service = PredictService(
        config, config.spec, None, model, router, GatewayMetrics().for_model(config.model), DecisionLog(tmp_path)
    )  # type: ignore[arg-type]

    async def requests(first: int, n: int) -> None:
        for i in range(first, first + n):
            await service.predict(PredictRequest(order_id=i, user_id=i, package_id=i, route_id=i, features=FEATURES))

    asyncio.run(requests(1, 2000))  # healthy traffic first: the guard learns the arms' shares
    down = True
    asyncio.run(requests(2001, 400))
    assert router.locally_tripped == frozenset(), service.guard(CANDIDATE).describe()
