"""The staged rollout end to end: real gateway, Triton (good and faulty versions), Feast, MLflow, traffic at 200 req/s.

Each scenario runs the rollout steps in the order the DAG runs them, under a compressed plan, while
`mlrelease traffic` sends ≥ 200 req/s through the gateway; no client request may fail, whatever happens.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import yaml

from mlrelease.errors import GateFailed, Skipped, StepError
from mlrelease.gateway import traffic
from mlrelease.gateway.config import load_config
from mlrelease.model.features import FEATURES
from mlrelease.model.onnx_export import OUTPUTS
from mlrelease.registry import CHALLENGER, CHAMPION, MODEL_NAME, Registry
from mlrelease.rollout.gates import REQUIRED_GATES
from mlrelease.rollout.machine import Phase
from mlrelease.rollout.store import RolloutBusy, RolloutStore
from mlrelease.serving import local_triton
from mlrelease.serving.triton_repo import model_repository, set_version_policy, versions_present
from mlrelease.steps import rollout as steps
from mlrelease.steps.shadow import shadow
from mlrelease.timewindow import parse_timestamp, run_key
from mlrelease_drills import devkit
from mlrelease_drills.devkit import (
    ERRORS,
    GOOD,
    HEALTHY_CANDIDATE,
    LOW_CONFIDENCE_LONG_TAIL,
    NAN_FEW_LONG_TAIL,
    SHIFTED_HIGH_VALUE,
    SLOW,
)
from tests.conftest import REPO, WINDOW_END
from tests.integration.prometheus_server import prometheus_server
from tests.integration.serving_world import MLRELEASE, World, gateway_process, serving_world
from tests.small_world_plan import GOOD_PLAN, PLAN

pytestmark = pytest.mark.integration
AS_OF = parse_timestamp(WINDOW_END, name="end")
RATE = 200.0
WARM_UP_S = 3.0  # traffic before a stage opens: the gateway and both versions warm
ARMS = ("stable", "candidate")  # Gateway API mode: one gateway per arm behind the HTTPRoute


@pytest.fixture(scope="module")
def world(tmp_path_factory, clean_offline) -> Iterator[World]:
    with pytest.MonkeyPatch.context() as mp:
        with serving_world(tmp_path_factory.mktemp("rollout-world"), clean_offline, mp) as built:
            config = built.config_file("gw")
            mp.setenv("MLRELEASE_GATEWAY_CONFIG", str(config))  # the gateway's and the step processes'
            built.settings = replace(built.settings, gateway_config=config)  # the in-process steps'
            plan = built.home / "plan.yaml"
            plan.write_text(yaml.safe_dump(PLAN), encoding="utf-8")
            (built.home / "good-plan.yaml").write_text(yaml.safe_dump(GOOD_PLAN), encoding="utf-8")
            client = Registry.from_settings(built.settings).client()
            client.create_registered_model(MODEL_NAME)
            for version in versions_present(model_repository(built.settings), MODEL_NAME):
                created = client.create_model_version(MODEL_NAME, source=str(built.home), run_id=None)
                assert int(created.version) == version
            built.routing(_config(), "set", "--stable", str(GOOD))
            yield built


@pytest.fixture(scope="module")
def gateway(world) -> Iterator[str]:
    with gateway_process(_config()) as url:
        yield url


def _config() -> Path:
    """The gateway config every step and the gateway read (MLRELEASE_GATEWAY_CONFIG)."""
    return Path(os.environ["MLRELEASE_GATEWAY_CONFIG"])


@pytest.fixture(scope="module")
def bodies(world) -> list[dict[str, Any]]:
    pool = traffic.order_pool(world.settings.offline_dir, AS_OF, load_config().cohorts)
    return traffic.build_requests(pool, 3_000, None, supply_features=False, seed=3)


@pytest.fixture
def fresh(world) -> Iterator[World]:
    """GOOD champion and stable, no candidate, no rollout record: each scenario starts the same."""
    _start_fresh(world)
    yield world


def _start_fresh(world: World) -> None:
    _serve(world, [GOOD])
    Registry.from_settings(world.settings).client().set_registered_model_alias(MODEL_NAME, CHAMPION, str(GOOD))
    world.routing(_config(), "set", "--stable", str(GOOD), "--candidate", "0", "--clear-trips")
    shutil.rmtree(world.settings.home / "rollout", ignore_errors=True)


class Release:
    """Runs the DAG's rollout tasks for one candidate, in order, like the nightly run does."""

    def __init__(self, world: World, version: int, end: str = WINDOW_END, plan: str = "plan.yaml") -> None:
        self.world, self.version, self.end = world, version, parse_timestamp(end, name="end")
        self.key = run_key(self.end)
        self.plan = world.home / plan
        _serve(world, [GOOD, version])
        client = Registry.from_settings(world.settings).client()
        client.set_registered_model_alias(MODEL_NAME, CHALLENGER, str(version))
        for tag, passed in REQUIRED_GATES.items():  # this world's versions passed the gates before the rollout
            client.set_model_version_tag(MODEL_NAME, str(version), tag, passed)

    def stage(self, n: int) -> dict[str, Any]:
        return steps.rollout_stage(self.world.settings, n, self.version, self.key, profile="demo", plan_path=self.plan)

    def wait_and_analyze(self, n: int) -> dict[str, Any]:
        opened = self.stage(n)
        time.sleep(max(0.0, parse_timestamp(opened["analyze_at"], name="at").timestamp() - time.time()))
        return steps.analyze(self.world.settings, n, self.version, self.key)

    def all_stages(self) -> list[dict[str, Any]]:
        return [self.wait_and_analyze(n) for n in range(1, 4)]

    def record(self) -> Any:
        return RolloutStore.from_settings(self.world.settings, MODEL_NAME).read()


def _serve(world: World, versions: list[int]) -> None:
    """Triton serves exactly these versions (what validate-serving leaves: champion + candidate)."""
    from mlrelease.serving.endpoint import publish_to_local_server

    root = model_repository(world.settings)
    if set_version_policy(root, MODEL_NAME, versions):
        publish_to_local_server(world.settings, root)
        client = world.client()
        client.load(MODEL_NAME)
        for version in versions:
            client.wait_ready(MODEL_NAME, version)
            # Warm it up as validate-serving and shadow do before a real rollout: a version's first calls
            # after a load are several times slower and would decide a short stage's p99 on their own.
            for _ in range(30):
                try:
                    client.infer(MODEL_NAME, version, np.zeros((1, len(FEATURES)), dtype=np.float32), OUTPUTS)
                except StepError:  # the version that refuses every inference: nothing to warm
                    break
        client.close()


def _aliases(world: World) -> dict[str, int | None]:
    registry = Registry.from_settings(world.settings)
    return {alias: registry.alias_version(alias) for alias in (CHAMPION, CHALLENGER)}


def _routing(world: World) -> dict[str, Any]:
    proc = subprocess.run(
        [MLRELEASE, "routing", "show", "--config", str(_config())], capture_output=True, text=True, check=True
    )
    return dict(json.loads(proc.stdout)["state"])


def test_good_candidate_is_promoted_with_no_client_errors(fresh, gateway, bodies):
    release = Release(fresh, HEALTHY_CANDIDATE, plan="good-plan.yaml")
    with devkit.background_traffic(gateway, bodies, fresh.api_key, RATE) as report:
        time.sleep(WARM_UP_S)
        report_shadow = shadow(fresh.settings, HEALTHY_CANDIDATE, release.end, plan_path=release.plan)
        results = release.all_stages()
        promoted = steps.promote(fresh.settings, HEALTHY_CANDIDATE, release.key)
    # a retrained model of the same quality: its answers differ row by row, within the shadow's tolerances
    assert report_shadow["status"] == "passed" and 0.0 < report_shadow["median_relative_diff"]
    assert report_shadow["disagreement_share"] <= 0.10
    # latency judged on interleaved pairs, with Triton's own per-version queue and compute time beside it
    assert report_shadow["latency_verdict"] == "pass" and report_shadow["latency_pairs"] >= 50
    server = report_shadow["server_side_us"]
    assert set(server) == {str(GOOD), str(HEALTHY_CANDIDATE)} and all(v["calls"] > 0 for v in server.values())
    assert [r["action"] for r in results] == ["advance", "advance", "promote"]
    assert all(v == "pass" for r in results for v in r["verdicts"].values()), results
    assert results[2]["samples"]["*"]["stable"] >= 40  # the last stage's pooled control slice
    assert promoted["status"] == "promoted" and promoted["previous_version"] == GOOD
    assert _aliases(fresh) == {CHAMPION: HEALTHY_CANDIDATE, CHALLENGER: None}
    routing = _routing(fresh)
    assert (routing["stable_version"], routing["candidate_version"]) == (HEALTHY_CANDIDATE, None)
    assert report.errors == 0, report.summary()  # the achieved rate is a benchmark's business (bench_rollout)
    assert any(f"/v{HEALTHY_CANDIDATE}/model" in key for key in report.served)
    # The previous champion stays loaded for the keep window, then retire unloads it.
    assert fresh.client().version_ready(MODEL_NAME, GOOD)
    time.sleep(1.0)
    steps.retire(fresh.settings, HEALTHY_CANDIDATE, release.key)
    assert not fresh.client().version_ready(MODEL_NAME, GOOD)
    # Every step is idempotent: rerunning them changes nothing.
    assert release.stage(3)["status"] == "already opened"
    assert steps.analyze(fresh.settings, 3, HEALTHY_CANDIDATE, release.key)["status"] == "already analysed"
    assert steps.promote(fresh.settings, HEALTHY_CANDIDATE, release.key)["status"] == "already promoted"
    assert release.record().phase is Phase.PROMOTED


def test_a_candidate_whose_shadow_failed_is_refused_where_traffic_moves(fresh, receiver, monkeypatch):
    release = Release(fresh, HEALTHY_CANDIDATE)
    client = Registry.from_settings(fresh.settings).client()
    client.set_model_version_tag(MODEL_NAME, str(HEALTHY_CANDIDATE), "shadow_status", "failed")
    client.set_model_version_tag(MODEL_NAME, str(HEALTHY_CANDIDATE), "shadow_reason", "latency slower than +10%")
    client.delete_model_version_tag(MODEL_NAME, str(HEALTHY_CANDIDATE), "benchmark_status")
    before = _routing(fresh)
    with pytest.raises(
        GateFailed,
        match=r"rollout-stage refuses v\d+: benchmark_status missing .*; "
        r"shadow_status=failed \(latency slower than \+10%\)",
    ):
        release.stage(2)
    assert _routing(fresh) == before and release.record() is None  # no traffic moved, no rollout recorded
    # A human may route it anyway: explicitly, recorded in the history and on the version, and alerted.
    opened = steps.rollout_stage(
        replace(fresh.settings, alert_webhook=receiver.url),  # MLRELEASE_ALERT_WEBHOOK of the step's process
        1,
        HEALTHY_CANDIDATE,
        release.key,
        profile="demo",
        plan_path=release.plan,
        override_gates="on-call: shadow latency was a noisy neighbour",
    )
    assert opened["status"] == "opened"
    (event,) = [e for e in release.record().history if e.kind == "gates_overridden"]
    assert event.detail["reason"] == "on-call: shadow latency was a noisy neighbour" and event.detail["alerted"]
    assert (
        client.get_model_version(MODEL_NAME, str(HEALTHY_CANDIDATE))
        .tags["gates_overridden"]
        .startswith("rollout-stage")
    )
    (alert,) = [b["body"] for b in receiver.bodies]
    assert alert["event"] == "gates_overridden" and "shadow_status=failed" in alert["gates"][1]
    steps.rollback(fresh.settings, release.key, reason="test over")


def test_a_restarted_triton_gets_its_versions_back_and_a_rollback_still_reaches_stable(fresh):
    from mlrelease.serving import local_triton

    release = Release(fresh, HEALTHY_CANDIDATE)
    assert release.stage(1)["status"] == "opened"  # stage 1: high_value half on the candidate
    local_triton.down(fresh.settings)
    started = local_triton.up(fresh.settings)  # what a person (or a supervisor) runs after the crash
    # the policy's versions, no manual load
    assert started["serving"][MODEL_NAME]["reloaded"] == [GOOD, HEALTHY_CANDIDATE]
    assert all(fresh.client().version_ready(MODEL_NAME, v) for v in (GOOD, HEALTHY_CANDIDATE))
    # A restart that forgets them (a bare server): the rollback reloads stable itself, then moves traffic.
    fresh.client().unload(MODEL_NAME)
    deadline = time.monotonic() + 30
    while fresh.client().version_ready(MODEL_NAME, GOOD) and time.monotonic() < deadline:
        time.sleep(0.2)
    steps.rollback(fresh.settings, release.key, reason="Triton lost its models mid-stage")
    routing = _routing(fresh)
    assert (routing["stable_version"], routing["candidate_version"]) == (GOOD, None)
    assert release.record().phase is Phase.ROLLED_BACK
    assert _aliases(fresh) == {CHAMPION: GOOD, CHALLENGER: None}
    assert fresh.client().version_ready(MODEL_NAME, GOOD)
    assert not fresh.client().version_ready(MODEL_NAME, HEALTHY_CANDIDATE)


def test_every_verdict_read_from_a_real_prometheus_rolls_back_a_slow_candidate_and_promotes_a_good_one(
    fresh, gateway, bodies, tmp_path
):
    """MLRELEASE_METRICS_SOURCE=prometheus: the steps read every guardrail's evidence with PromQL from a Prometheus
    scraping the gateway every second (its per-unit arm series), never from the decision log. A slow candidate is
    rolled back at the first stage by the latency contract; a healthy one passes every stage and is promoted."""
    port = gateway.rsplit(":", 1)[1]
    default = fresh.settings
    with prometheus_server(tmp_path / "prometheus", [f"127.0.0.1:{port}"]) as prometheus:
        fresh.settings = replace(default, metrics_source="prometheus", prometheus_url=prometheus.url)
        try:
            slow = Release(fresh, SLOW)
            outcome, report = _traffic_then(fresh, gateway, bodies, lambda: slow.wait_and_analyze(1))
            assert isinstance(outcome, GateFailed) and "* latency: shift +" in str(outcome), outcome
            assert slow.record().phase is Phase.ROLLED_BACK and report.errors == 0, report.summary()
            assert steps.status(fresh.settings)["metrics_source"] == f"{prometheus.url} (model {MODEL_NAME})"
            _start_fresh(fresh)
            good = Release(fresh, HEALTHY_CANDIDATE, plan="good-plan.yaml")
            results, report = _traffic_then(fresh, gateway, bodies, good.all_stages)
            assert [r["action"] for r in results] == ["advance", "advance", "promote"], results
            assert all(v == "pass" for r in results for v in r["verdicts"].values()), results
            assert steps.promote(fresh.settings, HEALTHY_CANDIDATE, good.key)["status"] == "promoted"
            assert report.errors == 0, report.summary()
        finally:
            fresh.settings = default


@contextmanager
def gateway_api_mode(world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Any]]:
    """Gateway API mode with arm gateways: an HTTPRoute (held by the Kubernetes API stand-in, which plays the
    controller) routes each user by the cohort and canary-bucket headers to the stable or the candidate gateways
    (two real gateway processes, `routing.arm: stable` / `candidate`, reading the routing document the rollout
    writes), through a data-plane stand-in that routes by the route as it stands; Prometheus scrapes both arms. The
    steps run with MLRELEASE_TRAFFIC_ROUTER=httproute and every verdict from Prometheus. Yields the data plane's URL
    and the API stand-in."""
    from mlrelease.rollout.httproute import HTTPRouteConfig, load_httproute_config, route_manifest
    from mlrelease.rollout.traffic_router import Routing
    from mlrelease_drills.devkit import free_port
    from tests.kube_api_server import FakeKubeApi

    state_url = f"file://{world.home / 'gw' / 'routing.json'}"  # the document the steps write (the world's config)
    arms = {arm: world.config_file(f"gw-{arm}", routing={"state_url": state_url, "arm": arm}) for arm in ARMS}
    route_file = tmp_path / "httproute.yaml"
    route_file.write_text(
        yaml.safe_dump(
            {
                "model": MODEL_NAME,
                "backends": "gateways",
                "cohorts": list(load_config().cohorts.names),
                "triton_url": world.triton_url,
                "accept_timeout_s": 5,
            }
        ),
        encoding="utf-8",
    )
    config: HTTPRouteConfig = load_httproute_config(route_file)
    with ExitStack() as stack, FakeKubeApi() as kube:
        kube.create(route_manifest(config, Routing(stable_version=GOOD)))
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "stand-in", "cluster": {"server": kube.url}}],
                    "users": [{"name": "step", "user": {"token": "stand-in"}}],
                    "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "step"}}],
                    "current-context": "stand-in",
                }
            ),
            encoding="utf-8",
        )
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        urls = {arm: stack.enter_context(gateway_process(path)) for arm, path in arms.items()}
        port = free_port()
        services = [f"--service={getattr(config, f'{arm}_service')}={url}" for arm, url in urls.items()]
        plane = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.httproute_dataplane",
                f"--kube={kube.url}",
                f"--namespace={config.namespace}",
                f"--name={config.name}",
                f"--port={port}",
                *services,
            ],
            cwd=REPO,
        )
        stack.callback(plane.wait, 20)
        stack.callback(plane.terminate)
        prometheus = stack.enter_context(
            prometheus_server(tmp_path / "prometheus", [u.removeprefix("http://") for u in urls.values()])
        )
        default = world.settings
        world.settings = replace(
            default,
            traffic_router="httproute",
            httproute_config=route_file,
            metrics_source="prometheus",
            prometheus_url=prometheus.url,
        )
        stack.callback(setattr, world, "settings", default)
        plane_url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:  # up once it answers (a 404: no rule matches /healthz)
            try:
                requests.get(f"{plane_url}/healthz", timeout=1)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline and plane.poll() is None, "the data plane did not start"
                time.sleep(0.2)
        yield plane_url, kube


def test_a_staged_rollout_in_gateway_api_mode_rolls_a_slow_candidate_back_and_promotes_a_good_one(
    fresh, bodies, tmp_path, monkeypatch
):
    """MLRELEASE_TRAFFIC_ROUTER=httproute with `backends: gateways`: every stage moves the HTTPRoute (the stand-in's
    controller accepts each generation before the stage counts as open), users reach the arm gateways by their cohort
    and bucket headers, and every verdict is read from Prometheus scraping the two arms. A slow candidate is rolled
    back at stage 1; a healthy one passes all three stages and is promoted; no client request fails."""
    from mlrelease.gateway.traffic import route_headers
    from mlrelease.rollout.httproute import ANNOTATION_ROUTING

    pool = traffic.order_pool(fresh.settings.offline_dir, AS_OF, load_config().cohorts)
    headers = route_headers(pool, bodies, "x-mlrelease-cohort", "x-mlrelease-bucket", load_config().cohorts.bucket_key)
    path = f"/v1/models/{MODEL_NAME}/predict"
    with gateway_api_mode(fresh, tmp_path, monkeypatch) as (plane, kube):

        def during(run):
            return _traffic_then(fresh, plane, bodies, run, path, headers)

        slow = Release(fresh, SLOW)
        outcome, report = during(lambda: slow.wait_and_analyze(1))
        assert isinstance(outcome, GateFailed) and "* latency: shift +" in str(outcome), outcome
        assert slow.record().phase is Phase.ROLLED_BACK and report.errors == 0, report.summary()
        assert any(f"/v{SLOW}/model" in served for served in report.served), report.served  # the route sent users
        route = kube.objects[("mlrelease", "parcel-eta")]
        assert json.loads(route["metadata"]["annotations"][ANNOTATION_ROUTING])["candidate_version"] is None
        assert {r["backendRefs"][0]["name"] for r in route["spec"]["rules"]} == {"mlrelease-gateway-stable"}
        _start_fresh(fresh)
        good = Release(fresh, HEALTHY_CANDIDATE, plan="good-plan.yaml")
        results, report = during(good.all_stages)
        assert [r["action"] for r in results] == ["advance", "advance", "promote"], results
        assert all(v == "pass" for r in results for v in r["verdicts"].values()), results
        assert steps.promote(fresh.settings, HEALTHY_CANDIDATE, good.key)["status"] == "promoted"
        assert report.errors == 0, report.summary()
        patches = [r for r in kube.requests if r["method"] == "PATCH"]
        assert len(patches) >= 5  # slow: stage 1, rollback; good: three stages, promotion
        # Promoted: the new champion is stable (the stable gateways serve it, told first), and the route sends everyone
        # to them; the candidate gateways get nobody until the next rollout.
        route = kube.objects[("mlrelease", "parcel-eta")]
        assert json.loads(route["metadata"]["annotations"][ANNOTATION_ROUTING])["stable_version"] == HEALTHY_CANDIDATE
        assert {r["backendRefs"][0]["name"] for r in route["spec"]["rules"]} == {"mlrelease-gateway-stable"}
        assert _routing(fresh)["stable_version"] == HEALTHY_CANDIDATE
        assert steps.status(fresh.settings)["routing_store"] == "httproute://mlrelease/parcel-eta"


def test_erroring_candidate_is_rolled_back_at_the_first_stage(fresh, gateway, bodies):
    release = Release(fresh, ERRORS)
    with devkit.background_traffic(gateway, bodies, fresh.api_key, RATE) as report:
        time.sleep(WARM_UP_S)
        with pytest.raises(GateFailed, match="rolled back v5 to v1.*fast_guard"):
            release.wait_and_analyze(1)
        time.sleep(0.5)
    assert report.errors == 0, report.summary()
    record = release.record()
    assert record.phase is Phase.ROLLED_BACK and record.stage == 1
    routing = _routing(fresh)
    assert (routing["stable_version"], routing["candidate_version"], routing["guard_trips"]) == (GOOD, None, [])
    assert _aliases(fresh) == {CHAMPION: GOOD, CHALLENGER: None}
    assert not fresh.client().version_ready(MODEL_NAME, ERRORS)  # unloaded after the drain
    tags = Registry.from_settings(fresh.settings).version_tags(ERRORS)
    assert tags["rollout_status"] == "rolled_back" and "fast_guard" in tags["rollout_reason"]
    # The failed run's later tasks refuse, and a rerun of the analysis reaches the same verdict.
    with pytest.raises(GateFailed, match="was rolled back"):
        release.stage(2)
    with pytest.raises(GateFailed, match="was rolled back"):
        steps.analyze(fresh.settings, 1, ERRORS, release.key)


def test_a_second_run_cannot_start_a_rollout_while_one_is_active(fresh, gateway):
    first = Release(fresh, HEALTHY_CANDIDATE)
    first.stage(1)
    second = Release(fresh, ERRORS, end="2026-11-30T02:00:00+00:00")
    with pytest.raises(RolloutBusy, match="v2 is still being rolled out.*20261129T020000Z"):
        second.stage(1)
    assert first.stage(1)["status"] == "already opened"  # the owner's rerun is fine
    steps.rollback(fresh.settings, first.key, reason="test over")
    assert first.record().phase is Phase.ROLLED_BACK


def test_bootstrap_has_nothing_to_roll_out(fresh):
    with pytest.raises(Skipped, match="champion already"):
        Release(fresh, GOOD).stage(1)
    with pytest.raises(Skipped, match="champion already"):
        shadow(fresh.settings, GOOD, parse_timestamp(WINDOW_END, name="end"))
    with pytest.raises(Skipped, match="nothing to roll back"):  # the DAG's rollback after an earlier failure
        steps.rollback(fresh.settings, run_key(parse_timestamp(WINDOW_END, name="end")), reason="train failed")


def test_promotion_refuses_an_unchecked_candidate(fresh):
    release = Release(fresh, HEALTHY_CANDIDATE)
    release.stage(1)
    with pytest.raises(StepError, match="has not passed the last stage"):
        steps.promote(fresh.settings, HEALTHY_CANDIDATE, release.key)
    assert _aliases(fresh)[CHAMPION] == GOOD
    steps.rollback(fresh.settings, release.key, reason="test over")


def test_unreachable_routing_state_fails_before_touching_traffic(fresh, monkeypatch):
    working = _config()
    broken = fresh.config_file("dead-store", routing={"state_url": "redis://127.0.0.1:1/0"})
    monkeypatch.setattr(fresh, "settings", replace(fresh.settings, gateway_config=broken))
    release = Release(fresh, HEALTHY_CANDIDATE)
    with pytest.raises(StepError, match="redis://127.0.0.1:1/0"):
        release.stage(1)
    record = release.record()
    assert record.stage_opened_at is None  # nothing was recorded as opened
    monkeypatch.setattr(fresh, "settings", replace(fresh.settings, gateway_config=working))
    assert release.stage(1)["status"] == "opened"  # once the store is back, the same run resumes
    steps.rollback(fresh.settings, release.key, reason="test over")


def _traffic_then(fresh, gateway, bodies, run, path: str = "/v1/predict", headers=None) -> Any:
    """Run `run()` while traffic flows (after a warm-up); returns (its result or exception, traffic report).
    `path` and each body's `headers`: as `devkit.background_traffic` takes them (e.g. an upstream's route headers)."""
    with devkit.background_traffic(gateway, bodies, fresh.api_key, RATE, path, headers) as report:
        time.sleep(WARM_UP_S)
        try:
            outcome = run()
        except Exception as exc:  # noqa: BLE001 - the scenario asserts on it
            outcome = exc
        time.sleep(0.5)
    return outcome, report


def test_nan_on_a_few_percent_of_the_long_tail_rolls_back_that_cohort_only(fresh, gateway, bodies):
    release = Release(fresh, NAN_FEW_LONG_TAIL)
    outcome, report = _traffic_then(fresh, gateway, bodies, lambda: [release.wait_and_analyze(n) for n in range(1, 3)])
    assert report.errors == 0, report.summary()
    assert isinstance(outcome, list), outcome
    first, second = outcome
    assert first["action"] == "advance" and first["verdicts"]["high_value"] == "pass"
    assert second["action"] == "rollback_cohort" and second["cohorts"] == ["long_tail"], (
        second["samples"],
        [r["reason"] for r in second["results"]],
    )
    assert second["verdicts"]["long_tail"] == "fail" and second["verdicts"]["high_value"] != "fail"
    assert any(r["metric"] in ("nan_rate", "fast_guard") for r in second["results"] if r["verdict"] == "fail")
    assert second["diagnosis"]["long_tail"]["report"].endswith("diagnose-long_tail.json")
    routing = _routing(fresh)  # the long tail is back on stable, high value keeps its candidate share
    assert routing["candidate_percent"] == {"high_value": 50.0, "long_tail": 0.0} and routing["guard_trips"] == []
    # The last stage passes for the other cohorts, but one champion cannot exclude a cohort: a human decides.
    outcome, report = _traffic_then(fresh, gateway, bodies, lambda: release.wait_and_analyze(3))
    assert isinstance(outcome, Skipped) and "long_tail was rolled back" in str(outcome), outcome
    assert release.record().phase is Phase.PAUSED and _aliases(fresh)[CHAMPION] == GOOD
    steps.rollback(fresh.settings, None, reason="abort after the drill")
    assert _routing(fresh)["candidate_version"] is None


def test_low_confidence_on_the_long_tail_is_caught_at_its_stage_and_diagnosed(fresh, gateway, bodies):
    release = Release(fresh, LOW_CONFIDENCE_LONG_TAIL)
    outcome, report = _traffic_then(fresh, gateway, bodies, lambda: [release.wait_and_analyze(n) for n in range(1, 3)])
    assert report.errors == 0, report.summary()
    assert isinstance(outcome, list), outcome
    first, second = outcome
    assert first["action"] == "advance"
    breach = [r for r in second["results"] if r["verdict"] == "fail"]
    assert second["action"] == "rollback_cohort" and {r["cohort"] for r in breach} == {"long_tail"}, second
    low = next(r for r in breach if r["metric"] == "low_confidence_share")
    assert low["candidate"] > 0.15 and low["stable"] is None and "limit 0.15" in low["reason"]
    assert low["band"]["lower"] > 0  # the band itself lies above the 15 % level: the evidence an alert quotes
    diagnosis = second["diagnosis"]["long_tail"]
    assert diagnosis["status"] == "ok" and len(diagnosis["top_shifts"]) == 5
    assert diagnosis["top_shifts"][0]["ks"] >= diagnosis["top_shifts"][-1]["ks"]
    steps.rollback(fresh.settings, release.key, reason="test over")


def test_slow_candidate_fails_the_latency_guardrail(fresh, gateway, bodies):
    release = Release(fresh, SLOW)
    outcome, report = _traffic_then(fresh, gateway, bodies, lambda: release.wait_and_analyze(1))
    assert report.errors == 0, report.summary()
    assert isinstance(outcome, GateFailed) and "* latency: shift +" in str(outcome), (
        [r["reason"] for r in outcome["results"]] if isinstance(outcome, dict) else outcome
    )
    assert release.record().phase is Phase.ROLLED_BACK


def test_shifted_predictions_fail_the_shadow_gate_on_the_same_orders(fresh, gateway, bodies):
    release = Release(fresh, SHIFTED_HIGH_VALUE)
    with pytest.raises(GateFailed, match="differ by more than 15%.*'high_value': 0.9"):
        shadow(fresh.settings, SHIFTED_HIGH_VALUE, release.end, plan_path=release.plan)
    report = json.loads((fresh.settings.artifacts_dir / release.key / "rollout" / "shadow.json").read_text())
    assert report["status"] == "failed" and report["disagreement_by_cohort"]["core"] == 0.0
    # paired on the same orders: the premium shippers' ETAs moved by ~1.5x, the other cohorts' not at all
    shifts = report["eta_shift_by_cohort"]
    assert shifts["high_value"]["verdict"] == "fail" and shifts["high_value"]["band"][0] > 1.2
    assert shifts["core"] == {**shifts["core"], "ratio": 1.0, "verdict": "pass"}
    tags = Registry.from_settings(fresh.settings).version_tags(SHIFTED_HIGH_VALUE)
    assert tags["shadow_status"] == "failed" and "high_value ETAs moved beyond" in tags["shadow_reason"]


def test_candidate_crashing_mid_stage_is_rolled_back_with_no_client_errors(fresh, gateway, bodies):
    release = Release(fresh, HEALTHY_CANDIDATE)

    def crash_then_analyze() -> dict[str, Any]:
        release.stage(1)
        time.sleep(1.0)
        # the candidate's instance goes away under load
        _serve(fresh, [GOOD])
        return release.wait_and_analyze(1)

    outcome, report = _traffic_then(fresh, gateway, bodies, crash_then_analyze)
    assert isinstance(outcome, GateFailed) and "fast_guard" in str(outcome), outcome
    assert report.errors == 0, report.summary()
    assert release.record().phase is Phase.ROLLED_BACK and _routing(fresh)["candidate_version"] is None


def test_a_killed_analysis_resumes_from_the_stored_state(fresh, gateway, bodies):
    release = Release(fresh, HEALTHY_CANDIDATE)

    def kill_then_resume() -> dict[str, Any]:
        release.stage(1)
        killed = subprocess.Popen(
            [MLRELEASE, "step", "analyze", "--stage", "1", "--model-version", str(HEALTHY_CANDIDATE)]
            + ["--end", WINDOW_END, "--poll-s", "0.2"]
        )
        time.sleep(1.5)  # mid-stage: no pass before the minimum exposure
        killed.kill()
        killed.wait()
        assert not [e for e in release.record().history if e.kind == "analysis"]
        return release.wait_and_analyze(1)

    outcome, report = _traffic_then(fresh, gateway, bodies, kill_then_resume)
    assert outcome["action"] == "advance", outcome
    assert [e.kind for e in release.record().history] == ["stage_opened", "analysis"]
    assert release.record().stage == 2
    steps.rollback(fresh.settings, release.key, reason="test over")


# Fault drills (issue 17): end states, not timings (bench/bench_drills.py measures those). After the fault, with
# only what the DAG does by itself (`analyze --tick` per check, a failed step retried, the `rollback` task after a
# gate verdict), no client request failed and `mlrelease rollout status` finds the record, routing, MLflow aliases
# and Triton's loaded versions in agreement.


def _as_the_dag_runs_it(release: Release, stage: int, within_s: float = 90.0) -> str:
    """`analyze --tick` until decided; a failed run (StepError) is retried; a gate verdict runs the `rollback` task
    (retried too). The outcome: the action, `rolled back` or `paused`."""
    settings, deadline = release.world.settings, time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            result = steps.analyze(settings, stage, release.version, release.key, tick=True)
        except GateFailed:
            while True:
                try:
                    steps.rollback(settings, release.key, reason="nightly_release rollback task")
                    return "rolled back"
                except StepError:
                    assert time.monotonic() < deadline, "the rollback task never succeeded"
                    time.sleep(0.5)
        except StepError:
            time.sleep(0.5)
            continue
        except Skipped:
            return "paused"
        if result["decided"]:
            return str(result["action"])
        time.sleep(0.2)
    raise AssertionError(f"stage {stage} undecided after {within_s:.0f} s")


def _consistent(settings) -> dict:
    status = steps.status(settings)
    assert status["consistent"], status["disagreements"]
    return status


def test_a_triton_killed_mid_stage_heals_with_no_manual_step(fresh, gateway, bodies):
    """kill -9 tritonserver: the supervisor restarts it with the declared versions and the rule answers meanwhile.
    Both versions failed together, so the healthy candidate is not blamed: stable's users show the outage too
    (the requests its breaker rested are recorded), the analysis cuts the whole outage out of the judged window,
    and the stage goes on (it advances, or pauses for a person at its maximum exposure when too little is left to
    judge) with all four sources of truth in agreement."""
    release = Release(fresh, HEALTHY_CANDIDATE)
    paths = local_triton.TritonPaths.from_settings(fresh.settings)
    with devkit.background_traffic(gateway, bodies, fresh.api_key, RATE) as report:
        time.sleep(WARM_UP_S)
        assert release.stage(1)["status"] == "opened"
        time.sleep(1.0)
        killed = local_triton.running_pid(paths)
        assert killed is not None
        os.kill(killed, signal.SIGKILL)
        deadline = time.monotonic() + 60  # model answers resume by themselves (the rule covers the meantime)
        while True:
            answer = requests.post(
                f"{gateway}/v1/predict", json=bodies[0], headers={"X-API-Key": fresh.api_key}, timeout=5
            ).json()
            if answer["source"] == "model":
                break
            assert time.monotonic() < deadline, "no model answer within 60 s of the kill"
            time.sleep(0.2)
        outcome = _as_the_dag_runs_it(release, 1)
    record = release.record()
    assert outcome in ("advance", "paused"), (outcome, [(e.kind, e.detail) for e in record.history[-3:]])
    assert report.errors == 0, report.summary()
    assert any(key.endswith("/fallback_rule") for key in report.served)  # the outage was covered by the rule
    cut = [
        outage
        for event in record.history
        if event.kind == "analysis"
        for outage in event.detail.get("outages", ())
        if outage["kind"] == "stable_failed" and not outage["ongoing"]
    ]
    assert cut, "the analysis never cut the outage out"
    status = _consistent(fresh.settings)
    assert status["aliases"] == {CHAMPION: GOOD, CHALLENGER: HEALTHY_CANDIDATE}
    assert status["triton"] == {
        "declared": [GOOD, HEALTHY_CANDIDATE],
        "loaded": [GOOD, HEALTHY_CANDIDATE],
        "refused": {},
    }
    assert local_triton.status(fresh.settings)["supervisor"]["restarts"] >= 1


def test_an_unreadable_routing_store_keeps_the_gateway_serving_and_the_steps_refuse_until_it_is_back(
    fresh, gateway, bodies
):
    """The file routing store unreadable mid-stage: the gateway keeps its last routing, `analyze` fails (and is
    retried) until the store is back; `rollout-stage` for the next stage fails before touching traffic."""
    release = Release(fresh, HEALTHY_CANDIDATE)
    path = Path(load_config().state_url(fresh.settings).removeprefix("file://"))
    headers = {"X-API-Key": fresh.api_key}
    with devkit.background_traffic(gateway, bodies, fresh.api_key, RATE) as report:
        time.sleep(WARM_UP_S)
        opened = release.stage(1)
        deadline = time.monotonic() + 10  # the gateway has adopted the stage's routing (it refreshes every 0.2 s)
        while (
            requests.get(f"{gateway}/v1/routing", headers=headers, timeout=5).json()["state"]["revision"]
            < opened["routing_revision"]
        ):
            assert time.monotonic() < deadline, "the gateway never read the stage's routing"
            time.sleep(0.1)
        with devkit.unreadable(path):
            time.sleep(1.0)  # several refreshes of the gateway (every 0.2 s)
            view = requests.get(f"{gateway}/v1/routing", headers=headers, timeout=5).json()
            assert "cannot be read" in view["store_error"]
            assert view["state"]["revision"] == opened["routing_revision"]
            assert view["state"]["candidate_version"] == HEALTHY_CANDIDATE
            with pytest.raises(StepError, match="cannot be read"):
                steps.analyze(fresh.settings, 1, HEALTHY_CANDIDATE, release.key, tick=True)
        assert _as_the_dag_runs_it(release, 1) == "advance"
        revision = release.record().revision
        with devkit.unreadable(path):
            with pytest.raises(StepError, match="cannot be read"):
                release.stage(2)
        record = release.record()
        assert record.revision == revision and record.stage == 2 and record.stage_opened_at is None
        assert _routing(fresh)["revision"] == opened["routing_revision"]  # traffic untouched
        assert release.stage(2)["status"] == "opened"  # the DAG's retry, once the store is back
        time.sleep(0.5)
    assert report.errors == 0, report.summary()
    _consistent(fresh.settings)
    steps.rollback(fresh.settings, release.key, reason="test over")
    _consistent(fresh.settings)
