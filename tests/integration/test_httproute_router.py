"""The Gateway API TrafficRouter: the rollout drives an HTTPRoute through the real `kubernetes` client.

No API server can run here, so the client talks to `FakeKubeApi` (tests/kube_api_server.py): it answers
like the API server (merge patch, resourceVersion preconditions, generations), validates every object
against the Gateway API schema and plays a controller. What the tests check is what the router sends
and what traffic the resulting route means under Gateway API matching rules.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from kubernetes import client as k8s

from mlrelease.errors import StepError
from mlrelease.rollout.context import RolloutContext
from mlrelease.rollout.guardrails import Verdict
from mlrelease.rollout.httproute import HTTPRouteConfig, route_manifest, weight
from mlrelease.rollout.httproute_api import KubernetesRouteApi, RouteConflict
from mlrelease.rollout.httproute_router import HTTPRouteTrafficRouter
from mlrelease.rollout.machine import ActionKind, Phase, RolloutState, apply, next_action
from mlrelease.rollout.plan import load_plan
from mlrelease.rollout.store import RolloutRecord
from mlrelease.rollout.traffic_router import Routing
from mlrelease.settings import Settings
from tests.gateway_api_schema import validate_gateway_api
from tests.kube_api_server import FakeKubeApi

pytestmark = pytest.mark.integration

CONFIG = HTTPRouteConfig(accept_timeout_s=2)
PLAN = load_plan().allocated(("high_value", "long_tail", "core"))
T0 = datetime(2026, 11, 29, 2, tzinfo=UTC)
COHORTS = ("high_value", "long_tail", "core")  # core has no rule of its own: it follows "*"


def candidate_share(route: dict, cohort: str | None, candidate: int) -> float:
    """The percentage of a request's traffic that reaches `candidate`, by Gateway API matching precedence.

    The matching rule is the one with the most header matches among those whose matches all hold
    (path prefix holds for every model request here); its backendRefs split traffic by weight.
    """
    best = None
    for rule in route["spec"]["rules"]:
        for match in rule["matches"]:
            headers = match.get("headers", [])
            if all(h["name"] == CONFIG.cohort_header and h["value"] == cohort for h in headers):
                if best is None or len(headers) > best[0]:
                    best = (len(headers), rule)
    assert best is not None, f"no rule matches cohort {cohort}"
    backends = best[1]["backendRefs"]
    total = sum(b["weight"] for b in backends)
    suffix = f"/versions/{candidate}"
    to_candidate = sum(
        b["weight"] for b in backends if b["filters"][0]["urlRewrite"]["path"]["replacePrefixMatch"].endswith(suffix)
    )
    return 100.0 * to_candidate / total


@pytest.fixture
def kube():
    with FakeKubeApi() as api:
        api.create(route_manifest(CONFIG, Routing(stable_version=1)))
        yield api


def _router(api: FakeKubeApi, ready_calls: list | None = None, config: HTTPRouteConfig = CONFIG):
    configuration = k8s.Configuration()
    configuration.host = api.url
    calls = ready_calls if ready_calls is not None else []
    return HTTPRouteTrafficRouter(config, KubernetesRouteApi(k8s.ApiClient(configuration)), calls.append, poll_s=0.05)


def _route(api: FakeKubeApi) -> dict:
    return api.objects[(CONFIG.namespace, CONFIG.name)]


def _patches(api: FakeKubeApi) -> list[dict]:
    return [r for r in api.requests if r["method"] == "PATCH"]


def test_generated_routes_are_valid_gateway_api_objects():
    routings = [
        Routing(stable_version=1),
        Routing(1, 2, {"high_value": 100}),
        Routing(1, 2, {"high_value": 100, "long_tail": 0, "*": 95}),
        Routing(1, 2, {"*": 33.33}),
    ]
    assert validate_gateway_api([route_manifest(CONFIG, r) for r in routings]) == [None] * len(routings)
    broken = route_manifest(CONFIG, routings[1])
    broken["spec"]["rules"][0]["backendRefs"][1]["weight"] = -1
    assert "weight must be >= 0" in validate_gateway_api([broken])[0]


def test_the_rollout_plan_through_the_route_sends_each_cohort_its_share(kube):
    """Drive the real state machine; after each routing change, read what the route means per cohort."""
    ctx = RolloutContext(None, None, _router(kube), None, None, COHORTS)  # type: ignore[arg-type]
    record = RolloutRecord(
        model="parcel_eta", run_key="20261129T020000Z", candidate_version=2, stable_version=1,
        profile="demo", plan=PLAN, started_at=T0,
    )  # fmt: skip
    tail_fails = {"high_value": Verdict.PASS, "long_tail": Verdict.FAIL, "core": Verdict.PASS}
    passing = {c: Verdict.PASS for c in COHORTS}
    state, now, seen = RolloutState(candidate_version=2, stable_version=1), T0, []
    for _ in range(50):
        action = next_action(state, PLAN, "demo", now, tail_fails if state.stage == 2 else passing)
        if action.kind is ActionKind.NONE:
            break
        before, state = state, apply(state, action, PLAN, now)
        # What the steps route (steps/rollout/): a stage when it opens; a cohort rollback within the
        # stage that breached (the next stage is routed when it opens); promotion and full rollback.
        routed = {
            ActionKind.OPEN_STAGE: state,
            ActionKind.ROLLBACK_COHORT: before.model_copy(update={"excluded_cohorts": state.excluded_cohorts}),
            ActionKind.PROMOTE: state,
            ActionKind.ROLLBACK_ALL: state,
        }.get(action.kind)
        if routed is not None:
            ctx.route(record, routed, reason=f"{action.kind} {PLAN.stage(action.stage).name}")
            route = _route(kube)
            seen.append((action.kind, {c: candidate_share(route, c, 2) for c in (*COHORTS, None)}))
        now += timedelta(seconds=10)
    # Every judged cohort keeps its concurrent control slice on stable.
    assert seen[0] == (ActionKind.OPEN_STAGE, {"high_value": 50, "long_tail": 0, "core": 0, None: 0})
    assert (ActionKind.OPEN_STAGE, {"high_value": 50, "long_tail": 50, "core": 0, None: 0}) in seen
    # The long tail failed in stage 2: it alone goes back to stable, the others carry on.
    assert (ActionKind.ROLLBACK_COHORT, {"high_value": 50, "long_tail": 0, "core": 0, None: 0}) in seen
    # Stage 3 is everyone with stable keeping a 5 % control group — except the rolled-back long tail.
    assert (ActionKind.OPEN_STAGE, {"high_value": 95, "long_tail": 0, "core": 95, None: 95}) in seen
    assert state.phase is Phase.PAUSED
    assert len(_patches(kube)) == len(seen)
    assert all(p["content_type"] == "application/merge-patch+json" for p in _patches(kube))
    assert _route(kube)["metadata"]["generation"] == 1 + len(seen)


def test_rollback_and_promotion_leave_one_backend(kube):
    router = _router(kube)
    router.apply(Routing(1, 2, {"*": 50}), reason="stage")
    assert candidate_share(_route(kube), "long_tail", 2) == 50
    promoted = router.apply(Routing(stable_version=2), reason="promote")
    assert promoted == Routing(stable_version=2, revision=2)
    rules = _route(kube)["spec"]["rules"]
    assert all(len(r["backendRefs"]) == 1 for r in rules)
    assert {r["backendRefs"][0]["filters"][0]["urlRewrite"]["path"]["replacePrefixMatch"] for r in rules} == {
        "/v2/models/parcel_eta/versions/2"
    }
    assert router.current() == promoted
    assert _route(kube)["metadata"]["annotations"]["mlrelease.io/routing-reason"] == "promote"


def test_the_patch_is_conditional_and_checks_readiness_first(kube):
    ready: list = []
    router = _router(kube, ready)
    router.apply(Routing(1, 2, {"high_value": 100}), reason="stage 1")
    assert ready == [[1, 2]]
    patch = _patches(kube)[0]
    assert patch["path"] == "/apis/gateway.networking.k8s.io/v1/namespaces/mlrelease/httproutes/parcel-eta"
    assert patch["body"]["metadata"]["resourceVersion"] == "101"
    assert set(patch["body"]) == {"metadata", "spec"} and set(patch["body"]["spec"]) == {"rules"}
    assert weight(100) == 10000 and patch["body"]["spec"]["rules"][0]["backendRefs"][1]["weight"] == 10000


def test_a_missing_route_fails_before_anything_moves():
    with FakeKubeApi() as api:
        ready: list = []
        with pytest.raises(StepError, match="HTTPRoute mlrelease/parcel-eta does not exist.*no traffic was moved"):
            _router(api, ready).apply(Routing(1, 2, {"high_value": 100}), reason="stage 1")
        assert not _patches(api) and not ready


def test_a_version_that_is_not_ready_is_not_routed(kube):
    def not_ready(versions):
        raise StepError(f"parcel_eta version(s) {versions[1:]} are not ready on Triton")

    router = HTTPRouteTrafficRouter(CONFIG, _router(kube).api, not_ready)
    with pytest.raises(StepError, match=r"\[2\] are not ready"):
        router.apply(Routing(1, 2, {"high_value": 100}), reason="stage 1")
    assert not _patches(kube)


def test_a_hand_edited_route_is_refused(kube):
    _router(kube).apply(Routing(1, 2, {"high_value": 100}), reason="stage 1")
    _route(kube)["spec"]["rules"][0]["backendRefs"][1]["weight"] = 0  # someone's emergency edit
    with pytest.raises(StepError, match="changed outside mlrelease"):
        _router(kube).apply(Routing(1, 2, {"high_value": 100, "long_tail": 100}), reason="stage 2")
    assert len(_patches(kube)) == 1


def test_a_concurrent_routing_change_makes_the_patch_conflict(kube):
    other = _router(kube)

    def meanwhile(versions):  # another writer moves traffic between our read and our patch
        other.apply(Routing(1, 2, {"long_tail": 50}), reason="someone else")

    router = HTTPRouteTrafficRouter(CONFIG, _router(kube).api, meanwhile)
    with pytest.raises(RouteConflict, match="changed while the rollout was patching it"):
        router.apply(Routing(1, 2, {"high_value": 100}), reason="stage 1")
    route = _route(kube)  # the other writer's routing stands; ours was not applied over it
    assert (candidate_share(route, "high_value", 2), candidate_share(route, "long_tail", 2)) == (0, 50)


@pytest.mark.parametrize(
    ("controller", "message"),
    [("refuse", "not accepted: Accepted=False \\(NotAllowedByListeners"), ("silent", "no controller accepted")],
)
def test_the_change_counts_only_once_the_controller_accepts_it(controller, message):
    with FakeKubeApi(controller=controller) as api:
        api.create(route_manifest(CONFIG, Routing(stable_version=1)))
        config = CONFIG.model_copy(update={"accept_timeout_s": 0.3})
        with pytest.raises(StepError, match=message):
            _router(api, config=config).apply(Routing(1, 2, {"high_value": 100}), reason="stage 1")


def test_rbac_refusal_names_the_problem():
    rules = [
        {
            "apiGroups": ["gateway.networking.k8s.io"],
            "resources": ["httproutes"],
            "verbs": ["get"],
            "resourceNames": ["parcel-eta"],
        }
    ]
    with FakeKubeApi(rbac_rules=rules) as api:
        api.create(route_manifest(CONFIG, Routing(stable_version=1)))
        with pytest.raises(StepError, match="RBAC: the step's service account may not patch this HTTPRoute"):
            _router(api).apply(Routing(1, 2, {"high_value": 100}), reason="stage 1")


def test_bad_route_config_is_a_clear_error():
    with pytest.raises(ValueError, match="(?s)cohort_header.*not a valid HTTP header name"):
        HTTPRouteConfig(cohort_header="x cohort")
    with pytest.raises(ValueError, match="(?s)namespace.*not a DNS-1123 label"):
        HTTPRouteConfig(namespace="ML_Release")
    with pytest.raises(ValueError, match="cohorts must be distinct"):
        HTTPRouteConfig(cohorts=("high_value", "*"))


def test_a_status_write_between_read_and_patch_does_not_fail_the_change(kube):
    """Controllers rewrite status (resourceVersion moves) all the time; only a routing change is a conflict."""

    def heartbeat(versions):
        kube.status_write(CONFIG.namespace, CONFIG.name)

    router = HTTPRouteTrafficRouter(CONFIG, _router(kube).api, heartbeat, poll_s=0.05)
    router.apply(Routing(1, 2, {"high_value": 100}), reason="stage 1")
    assert candidate_share(_route(kube), "high_value", 2) == 100
    assert [r["method"] for r in kube.requests].count("PATCH") == 2  # the 409, then the retried patch


def test_a_route_mlrelease_did_not_create_is_left_alone(kube):
    foreign = route_manifest(CONFIG, Routing(stable_version=1))
    del foreign["metadata"]["annotations"]
    with FakeKubeApi() as api:
        api.create(foreign)
        with pytest.raises(StepError, match="not managed by mlrelease.*nothing was changed"):
            _router(api).apply(Routing(1, 2, {"high_value": 100}), reason="stage 1")
        assert not _patches(api)


def test_no_stage_opens_when_the_guardrails_cannot_see_the_routed_traffic(kube, monkeypatch):
    monkeypatch.delenv("MLRELEASE_METRICS_SOURCE", raising=False)
    ctx = RolloutContext(Settings.from_env(), None, _router(kube), None, None, COHORTS)  # type: ignore[arg-type]
    with pytest.raises(StepError, match="does not see the traffic that httproute://mlrelease/parcel-eta routes"):
        ctx.require_observed()
    assert not _patches(kube)


def test_the_gateway_router_refuses_where_the_cluster_routes_with_an_httproute(tmp_path, monkeypatch):
    from mlrelease.rollout.traffic_router_factory import open_traffic_router

    mounted = tmp_path / "httproute.yaml"  # deploy/ mounts this only in httproute mode
    mounted.write_text("name: parcel-eta\n")
    monkeypatch.setenv("MLRELEASE_HTTPROUTE_CONFIG", str(mounted))
    monkeypatch.delenv("MLRELEASE_TRAFFIC_ROUTER", raising=False)
    with pytest.raises(StepError, match="set MLRELEASE_TRAFFIC_ROUTER=httproute"):
        open_traffic_router(Settings.from_env(), "parcel_eta")


class ArmsDocument:
    """The arm gateways' routing document, in memory; notes the route's generation when it is written."""

    location, observed_by = "memory", frozenset({"decision_log", "prometheus"})

    def __init__(self, api: FakeKubeApi) -> None:
        self.api, self.routing, self.written_at_generation = api, Routing(stable_version=1), []

    def current(self) -> Routing:
        return self.routing

    def apply(self, routing: Routing, *, reason: str, clear_trips: bool = False) -> Routing:
        route = self.api.objects[(ARMS.namespace, ARMS.name)]
        self.written_at_generation.append(route["metadata"]["generation"])
        self.routing = routing
        return routing


ARMS = HTTPRouteConfig(accept_timeout_s=2, backends="gateways", cohorts=("high_value", "long_tail", "core"))


def test_with_arm_gateways_the_versions_are_written_before_the_route_moves_and_their_trips_are_read():
    from dataclasses import replace

    with FakeKubeApi() as api:
        api.create(route_manifest(ARMS, Routing(stable_version=1)))
        arms = ArmsDocument(api)
        configuration = k8s.Configuration()
        configuration.host = api.url
        router = HTTPRouteTrafficRouter(
            ARMS, KubernetesRouteApi(k8s.ApiClient(configuration)), lambda versions: None, arms=arms, arms_refresh_s=0
        )
        assert router.observed_by == {"decision_log", "prometheus"}  # a stage may open: the arms see every call
        before = api.objects[(ARMS.namespace, ARMS.name)]["metadata"]["generation"]
        router.apply(Routing(1, 2, {"high_value": 5}), reason="stage 1")
        after = api.objects[(ARMS.namespace, ARMS.name)]["metadata"]["generation"]
        assert arms.written_at_generation == [before] and after == before + 1  # the document first, then the route
        assert arms.routing.candidate_version == 2
        arms.routing = replace(arms.routing, tripped={2: "fast guard: 5 of 5 candidate calls failed"})
        assert router.current().tripped == {2: "fast guard: 5 of 5 candidate calls failed"}  # the analysis sees it
    with pytest.raises(StepError, match="backends 'gateways' and the arm gateways' routing disagree"):
        HTTPRouteTrafficRouter(ARMS, None, lambda versions: None)  # type: ignore[arg-type]
