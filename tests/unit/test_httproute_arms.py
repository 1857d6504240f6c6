"""Gateway API mode with arm gateways: the HTTPRoute assigns users (cohort and canary-bucket headers) to the stable or
the candidate gateways exactly as the built-in gateway's own split would, and an arm gateway judges every request it
gets in its arm."""

from __future__ import annotations

import random
import re

import pytest

from mlrelease.gateway.cohorts import BUCKETS, bucket
from mlrelease.gateway.metrics import GatewayMetrics
from mlrelease.gateway.router import Router
from mlrelease.gateway.routing_state import GuardTrip, RoutingState, assigned_version
from mlrelease.rollout.httproute import HTTPRouteConfig, buckets_below, route_rules
from mlrelease.rollout.machine import candidate_percent
from mlrelease.rollout.plan import load_plan
from mlrelease.rollout.traffic_router import Routing
from tests.httproute_dataplane import pick, rewritten
from tests.unit.records import rollout_record

ARMS = HTTPRouteConfig(backends="gateways", model="parcel_eta")
COHORTS = ("high_value", "long_tail", "core")  # core has no rule of its own: it follows "*"


@pytest.mark.parametrize("limit", [1, 2, 9, 10, 11, 99, 100, 101, 500, 700, 999, 1000, 1001, 4321, 5000, 9900, 9999])
def test_the_bucket_pattern_matches_exactly_the_buckets_below_the_limit(limit):
    pattern = re.compile(buckets_below(limit))
    assert [b for b in range(BUCKETS) if pattern.fullmatch(f"{b:04d}")] == list(range(limit))


def test_a_random_sample_of_limits_too():
    rng = random.Random(7)
    for limit in rng.sample(range(1, BUCKETS + 1), 40):
        pattern = re.compile(buckets_below(limit))
        assert sum(1 for b in range(BUCKETS) if pattern.fullmatch(f"{b:04d}")) == limit, limit
        assert pattern.fullmatch(f"{limit - 1:04d}") and not pattern.fullmatch(
            f"{limit:04d}" if limit < BUCKETS else ""
        )


def test_every_user_goes_to_the_arm_the_gateway_split_would_assign_at_every_stage():
    """For each stage of the shipped plan: every (cohort, bucket) through the route, by Gateway API matching, reaches
    the candidate gateways exactly when the gateway's own split assigns that user to the candidate."""
    plan = load_plan()
    record = rollout_record()
    rng = random.Random(0)
    path = f"/v1/models/{ARMS.model}/predict"
    for number in range(1, len(plan.stages) + 1):
        shares = candidate_percent(record.model_copy(update={"stage": number}), plan)
        routing = Routing(stable_version=1, candidate_version=2, candidate_percent=shares)
        state = RoutingState(model="parcel_eta", stable_version=1, candidate_version=2, candidate_percent=shares)
        route = {"spec": {"rules": route_rules(ARMS, routing)}}
        assert len(route["spec"]["rules"]) <= 16
        for cohort in COHORTS:
            for user_bucket in range(0, BUCKETS, 3):
                headers = {ARMS.cohort_header: cohort, ARMS.bucket_header: f"{user_bucket:04d}"}
                backend = pick(route, path, headers, rng)
                assert backend is not None and rewritten(backend, path, route) == path
                want = (
                    ARMS.candidate_service if assigned_version(state, cohort, user_bucket) == 2 else ARMS.stable_service
                )
                assert backend["name"] == want, (number, cohort, user_bucket)
    # No candidate: every rule goes to the stable gateways, and a request without the headers does too.
    route = {"spec": {"rules": route_rules(ARMS, Routing(stable_version=1))}}
    assert {r["backendRefs"][0]["name"] for r in route["spec"]["rules"]} == {ARMS.stable_service}
    assert pick(route, path, {}, rng)["name"] == ARMS.stable_service


def test_the_bucket_header_is_the_gateway_bucket_of_the_user():
    import pandas as pd

    from mlrelease.gateway.traffic import route_headers

    pool = pd.DataFrame({"order_id": [10, 11], "user_id": [501, 502], "cohort": ["high_value", "core"]})
    bodies = [{"order_id": 11, "user_id": 502}, {"order_id": 10, "user_id": 501}]
    assert route_headers(pool, bodies, "x-c", "x-b", "user_id") == [
        {"x-c": "core", "x-b": f"{bucket(502):04d}"},
        {"x-c": "high_value", "x-b": f"{bucket(501):04d}"},
    ]


def _router(arm, state):
    router = Router(
        store=None, metrics=GatewayMetrics().for_model("parcel_eta"), refresh_interval_s=1, model="parcel_eta", arm=arm
    )  # type: ignore[arg-type]
    router.state = state
    return router


def test_an_arm_gateway_serves_and_judges_every_request_in_its_arm():
    state = RoutingState(model="parcel_eta", stable_version=1, candidate_version=2, candidate_percent={"high_value": 5})
    low, high = 0, BUCKETS - 1  # the split would put bucket 0 on the candidate and 9999 on stable
    candidate, stable, split = _router("candidate", state), _router("stable", state), _router("split", state)
    for b in (low, high):
        assert candidate.route("core", b) == (2, "candidate") and candidate.assigned(state, "core", b) == 2
        assert stable.route("high_value", b) == (1, "stable") and stable.assigned(state, "high_value", b) == 1
    assert split.route("high_value", low) == (2, "candidate") and split.route("high_value", high) == (1, "stable")
    # A tripped candidate: the candidate gateways answer from stable, and still judge those users as the candidate's.
    from datetime import UTC, datetime

    trip = GuardTrip(version=2, reason="fast guard", at=datetime.now(UTC), replica="r1")
    tripped = state.with_trip(trip)
    candidate.state = tripped
    assert candidate.route("core", low) == (1, "stable") and candidate.assigned(tripped, "core", low) == 2
    # No candidate (a rollback): the candidate gateways serve and judge stable.
    candidate.state = none = RoutingState(model="parcel_eta", stable_version=1)
    assert candidate.route("core", low) == (1, "stable") and candidate.assigned(none, "core", low) == 1


def test_a_route_config_for_arm_gateways_is_checked():
    with pytest.raises(ValueError, match="at most 7 cohorts"):
        HTTPRouteConfig(backends="gateways", model="m", cohorts=tuple(f"c{i}" for i in range(8)))
    with pytest.raises(ValueError, match="must differ"):
        HTTPRouteConfig(backends="gateways", model="m", stable_service="gw", candidate_service="gw")
    with pytest.raises(ValueError, match="not a valid HTTP header name"):
        HTTPRouteConfig(backends="gateways", model="m", bucket_header="x bucket")
