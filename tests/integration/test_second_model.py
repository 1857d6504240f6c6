"""The second example model, a binary classifier (models/late_delivery), through train → export → validate-serving →
benchmark on a real Triton, in processes that release it (MLRELEASE_MODEL=late_delivery) as the DAG's tasks do.

Nothing here is specific to late_delivery in the code under test: the spec names its features, label, training code,
outputs and gates, and the same steps that release the parcel ETA model release it.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mlrelease.data.generate import generate
from mlrelease.exit_codes import EXIT_GATE_FAILED, EXIT_STEP_ERROR
from mlrelease.release_spec import SPECS_DIR
from mlrelease.serving.triton_repo import parse_pbtxt
from mlrelease.timewindow import Window, run_key
from tests.conftest import HISTORY, ROWS_PER_DAY, WINDOW_END, WINDOW_START, free_port
from tests.integration.serving_world import MLRELEASE
from tests.small_world_plan import ERRORS_RATE, GOOD_PLAN, NAN_RATE
from tests.small_world_plan import PLAN as SMALL_PLAN

pytestmark = pytest.mark.integration
MODEL = "late_delivery"
WINDOW = Window.parse(WINDOW_START, WINDOW_END)
NEXT = Window(WINDOW.start + timedelta(days=1), WINDOW.end + timedelta(days=1))


def _run(env: dict[str, str], *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([MLRELEASE, *args], env=env, capture_output=True, text=True, timeout=600)
    if ok:
        assert done.returncode == 0, f"mlrelease {' '.join(args)}: rc {done.returncode}\n{done.stderr[-3000:]}"
    return done


def _step(env: dict[str, str], name: str, *args: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(_run(env, "step", name, *args).stdout)
    return result


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[tuple[dict[str, str], Path]]:
    """A home with history and a real Triton, and the environment of processes that release late_delivery."""
    home = tmp_path_factory.mktemp("second-model")
    generate(home / "data" / "offline", HISTORY[0], HISTORY[1] + timedelta(days=1), rows_per_day=ROWS_PER_DAY, seed=5)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLRELEASE_", "MLFLOW_", "FEAST_"))}
    env |= {"MLRELEASE_HOME": str(home), "MLRELEASE_XCOM_PATH": str(home / "xcom.json"), "MLRELEASE_MODEL": MODEL}
    env |= {f"MLRELEASE_TRITON_{name}_PORT": str(free_port()) for name in ("HTTP", "GRPC", "METRICS")}
    _step(env, "apply-features")
    _step(
        env, "validate-data", "--start", WINDOW.start.isoformat(), "--end", NEXT.end.isoformat(), "--training-days", "8"
    )
    _run(env, "triton", "up")
    try:
        yield env, home
    finally:
        _run(env, "triton", "down", ok=False)


@pytest.fixture(scope="module")
def bootstrapped(world) -> dict[str, Any]:
    """Version 1 of late_delivery trained, exported, validated on Triton and benchmarked: with no champion, champion."""
    env, _ = world
    trained = _step(env, "train", "--start", WINDOW.start.isoformat(), "--end", WINDOW.end.isoformat())
    version = str(trained["model_version"])
    return {
        "train": trained,
        "export": _step(env, "export", "--model-version", version),
        "validate": _step(env, "validate-serving", "--model-version", version),
        "benchmark": _step(env, "benchmark", "--model-version", version, "--rounds", "6"),
    }


def _client(home: Path) -> Any:
    """An MLflow client of the home's registry (not the process-wide one: other tests in this worker use their own)."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{home / 'mlflow' / 'mlflow.db'}"
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def test_the_classifier_is_trained_and_registered_by_its_spec(world, bootstrapped):
    _, home = world
    trained = bootstrapped["train"]
    assert trained["model_version"] == 1 and trained["decision"].startswith("bootstrap: no champion yet")
    metrics = trained["metrics"]
    # A gradient-boosted classifier of lateness on this data ranks well and is calibrated (the spec's gates).
    assert metrics["auc"] > 0.8 and metrics["calibration_error"] < 0.05, metrics
    assert abs(metrics["predicted_positive_rate"] - metrics["positive_rate"]) < 0.03, metrics
    assert 0.15 < metrics["positive_rate"] < 0.35

    client = _client(home)
    assert {name: int(v) for name, v in client.get_registered_model(MODEL).aliases.items()} == {
        "challenger": 1,
        "champion": 1,
    }
    assert [m.name for m in client.search_registered_models()] == [MODEL]  # the parcel model is untouched
    run = client.get_run(client.get_model_version(MODEL, "1").run_id)
    assert run.data.params["feature_service"] == "late_delivery_v1"
    assert run.data.params["training_entrypoint"] == "mlrelease.model.classifiers:fit_gradient_boosting"
    assert run.data.params["gate_min_auc"] == "0.7" and run.data.params["features"].startswith("tier,weight_kg,")
    assert {"log_loss", "auc", "calibration_error"} <= set(run.data.metrics)


def test_the_exported_graph_serves_the_specs_outputs_on_triton(world, bootstrapped):
    import onnx

    _, home = world
    exported, validated = bootstrapped["export"], bootstrapped["validate"]
    assert exported["status"] == "exported" and exported["parity_max_abs_diff"] < 1e-3
    served = Path(exported["path"])
    assert served == home / "model_repository" / MODEL / "1"
    graph = onnx.load(served / "model.onnx").graph
    assert [o.name for o in graph.output] == ["is_late", "late_probability"]
    assert graph.input[0].type.tensor_type.shape.dim[1].dim_value == 10
    config = parse_pbtxt((served.parent / "config.pbtxt").read_text())
    assert config.name == MODEL and [o.name for o in config.output] == ["is_late", "late_probability"]

    # Triton answered the parity sample as the export did, output by output.
    assert set(validated["max_abs_diff"]) == {"is_late", "late_probability"}, validated
    assert max(validated["max_abs_diff"].values()) < 1e-4, validated
    assert bootstrapped["benchmark"]["status"].startswith("bootstrap"), bootstrapped["benchmark"]

    # The parity file holds a probability and its 0/1 decision (P >= 0.5) per sampled row.
    parity = np.load(home / "exports" / MODEL / "1" / "parity.npz")
    probability, decision = parity["late_probability"], parity["is_late"]
    assert ((probability >= 0) & (probability <= 1)).all() and len(probability) == len(parity["features"])
    assert (decision == (probability >= 0.5)).all() and 0 < decision.mean() < 0.5


def test_a_retrain_is_judged_against_the_champion_by_the_classification_gates(world, bootstrapped):
    env, home = world
    done = _run(env, "step", "train", "--start", NEXT.start.isoformat(), "--end", NEXT.end.isoformat(), ok=False)
    client = _client(home)
    (run,) = client.search_runs(
        [client.get_experiment_by_name(MODEL).experiment_id],
        filter_string=f"tags.data_interval_end = '{run_key(NEXT.end)}'",
    )
    metrics, params, tags = run.data.metrics, run.data.params, run.data.tags
    assert params["champion_version"] == "1" and {"champion_log_loss", "champion_auc"} <= set(metrics)
    # The decision follows from the logged numbers and the spec's tolerances, whichever way it went.
    loss_limit = metrics["champion_log_loss"] * (1 + float(params["gate_log_loss_tolerance"]))
    auc_floor = metrics["champion_auc"] - float(params["gate_auc_tolerance"])
    within = metrics["log_loss"] <= loss_limit and metrics["auc"] >= auc_floor
    calibrated = metrics["calibration_error"] <= float(params["gate_max_calibration_error"])
    accepted = tags["decision"] == "accepted"
    assert accepted == (within and calibrated and metrics["auc"] >= float(params["gate_min_auc"])), (metrics, tags)
    assert done.returncode == (0 if accepted else EXIT_GATE_FAILED), done.stderr[-2000:]
    if accepted:
        assert int(client.get_registered_model(MODEL).aliases["challenger"]) == 2
    else:
        assert "candidate refused" in done.stderr


def test_a_process_that_does_not_name_its_model_is_refused_before_any_work(world):
    env, home = world
    unnamed = {k: v for k, v in env.items() if k != "MLRELEASE_MODEL"}
    repository = home / "model_repository"
    before = sorted(p.name for p in repository.iterdir()) if repository.is_dir() else []  # run alone: none yet
    done = _run(unnamed, "step", "train", "--start", NEXT.start.isoformat(), "--end", NEXT.end.isoformat(), ok=False)
    assert (done.returncode, done.stderr) == (
        EXIT_STEP_ERROR,
        f"mlrelease step train: error: {SPECS_DIR} declares 2 models (late_delivery, parcel_eta): set MLRELEASE_MODEL "
        "to the one this process releases\n",
    )
    assert (sorted(p.name for p in repository.iterdir()) if repository.is_dir() else []) == before
    named_wrong = {**env, "MLRELEASE_MODEL": "route_risk"}
    done = _run(named_wrong, "step", "export", "--model-version", "1", ok=False)
    assert done.returncode == EXIT_STEP_ERROR
    assert done.stderr.startswith("mlrelease step export: error: no model 'route_risk'")
    assert len(done.stderr.splitlines()) == 1


def test_one_triton_serves_every_model_whichever_process_starts_it(world, bootstrapped):
    import requests

    env, _ = world
    parcel_process = {**env, "MLRELEASE_MODEL": "parcel_eta"}
    _run(env, "triton", "down")
    up = json.loads(_run(parcel_process, "triton", "up").stdout)
    assert up["serving"][MODEL]["serving"] == [1] and up["serving"][MODEL]["reloaded"] == [1], up["serving"]
    ready = requests.get(f"{up['url']}/v2/models/{MODEL}/versions/1/ready", timeout=5)
    assert ready.status_code == 200


# The rollout tests' small-world plan (tests/small_world_plan.py) over late_delivery's own cohorts: this world's
# traffic is ~1/1000 of a production stage. Remote routes first, then bulky parcels (~4 % of the orders: 99 % of
# them on the candidate so its arm gathers evidence), then everyone with a control slice.
LATE_PLAN = {
    **{key: value for key, value in SMALL_PLAN.items() if key != "stages"},
    "stages": [
        {**SMALL_PLAN["stages"][0], "name": "remote_routes", "candidate_percent": {"remote_routes": 50}},
        {
            **SMALL_PLAN["stages"][2],
            "name": "bulky",
            "candidate_percent": {"remote_routes": 50, "bulky": 99},
            "judge": [],
            "max_exposure_s": {"production": 7200, "demo": 60},  # ~4 bulky requests a second reach its arm here
            "on_breach": "rollback_cohort",
            "guardrails": [{**ERRORS_RATE, "cohorts": ["remote_routes"]}, NAN_RATE],
        },
        SMALL_PLAN["stages"][2],
    ],
}
TRAFFIC_RATE = 100.0  # per model: two gateways, one Triton and the steps share this 2-core box


def _analyze(env: dict[str, str], version: str, stage: int) -> dict[str, Any] | None:
    """`analyze` as a non-deferrable task runs it (one process looks until the stage is decided); None when its verdict
    rolled the candidate back (the step exits with a gate failure, as the task fails)."""
    args = ("--model-version", version, "--end", NEXT.end.isoformat(), "--stage", str(stage))
    done = _run(env, "step", "analyze", *args, ok=False)
    if done.returncode == EXIT_GATE_FAILED:
        return None
    assert done.returncode == 0, f"{env['MLRELEASE_MODEL']} stage {stage}: {done.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _through_the_gates(env: dict[str, str], window: Window) -> str:
    """Train on `window`, then export, validate-serving and benchmark the version, as the nightly run's tasks do."""
    trained = _step(env, "train", "--start", window.start.isoformat(), "--end", window.end.isoformat())
    # a first version, or a retrain of the same quality (an earlier test may have trained it: its recorded version)
    assert trained["status"] in ("registered as challenger", "already trained for this data interval"), trained
    version = str(trained["model_version"])
    _step(env, "export", "--model-version", version)
    _step(env, "validate-serving", "--model-version", version)
    # 6 rounds (refused at 6 of 6, rate 1/64): a candidate as fast as its champion is settled by one unharmed round
    _step(env, "benchmark", "--model-version", version, "--rounds", "6")
    return version


def _crash(env: dict[str, str], model: str, serving: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's other versions go away in Triton under load (what a crashed instance looks like to callers)."""
    from mlrelease.serving.endpoint import publish_to_local_server
    from mlrelease.serving.triton_client import TritonClient
    from mlrelease.serving.triton_repo import model_repository, set_version_policy
    from mlrelease.settings import Settings

    monkeypatch.setenv("MLRELEASE_HOME", env["MLRELEASE_HOME"])
    settings = Settings.from_env()
    root = model_repository(settings)
    assert set_version_policy(root, model, serving)
    publish_to_local_server(settings, root)
    client = TritonClient(f"http://127.0.0.1:{env['MLRELEASE_TRITON_HTTP_PORT']}")
    try:
        client.load(model)
    finally:
        client.close()


def test_two_models_roll_out_at_once_and_one_rolling_back_leaves_the_other_promoted(world, bootstrapped, monkeypatch):
    """Both models' retrained candidates through every gate and into their rollouts in the same minutes, behind ONE
    gateway serving both (POST /v1/models/<name>/predict; a process bound to no model) and one Triton: the parcel
    candidate's instance crashes at its first stage and is rolled back, the classifier's goes on through its three
    stages and is promoted; each record, routing, alias set, fast guard and metric series stays its own.
    """
    import requests
    import yaml

    from mlrelease.gateway import traffic
    from mlrelease.release_spec import spec_named
    from mlrelease_drills import devkit

    env, home = world
    parcel = {**env, "MLRELEASE_MODEL": "parcel_eta"}
    assert _through_the_gates(parcel, WINDOW) == "1"  # the parcel model's first release: its champion
    versions = {MODEL: _through_the_gates(env, NEXT), "parcel_eta": _through_the_gates(parcel, NEXT)}
    assert versions == {MODEL: "2", "parcel_eta": "2"}
    interval = ("--start", NEXT.start.isoformat(), "--end", NEXT.end.isoformat())
    _run(env, "step", "materialize", *interval)  # the gateways read the night's features online (Feast prints too)
    plans = {MODEL: home / "late-plan.yaml", "parcel_eta": home / "parcel-plan.yaml"}
    plans[MODEL].write_text(yaml.safe_dump(LATE_PLAN), encoding="utf-8")
    plans["parcel_eta"].write_text(yaml.safe_dump(GOOD_PLAN), encoding="utf-8")
    config = devkit.write_gateway_config(
        home / "gateway-night.yaml", replay_as_of=NEXT.end.isoformat(), models=[MODEL, "parcel_eta"]
    )
    envs = {MODEL: env, "parcel_eta": parcel}
    for model_env in envs.values():  # each model's stable = its champion, v1
        _run(model_env, "routing", "init", "--config", str(config))
    key = json.loads(_run(env, "gateway-key", "add", "second-model").stdout)["api_key"]
    offline = home / "data" / "offline"
    bodies = {
        model: traffic.build_requests(
            traffic.order_pool(offline, NEXT.end, spec_named(model).cohorts), 3_000, None, supply_features=False, seed=3
        )
        for model in envs
    }
    release = {model: ("--model-version", versions[model], "--end", NEXT.end.isoformat()) for model in envs}
    paths = {model: f"/v1/models/{model}/predict" for model in envs}
    with (
        devkit.gateway_process(config, free_port(), env=env, unset=("MLRELEASE_MODEL",)) as url,
        devkit.background_traffic(url, bodies[MODEL], key, TRAFFIC_RATE, paths[MODEL]) as late_report,
        devkit.background_traffic(url, bodies["parcel_eta"], key, TRAFFIC_RATE, paths["parcel_eta"]) as parcel_report,
    ):
        answer = requests_post(url, key, bodies[MODEL][0], paths[MODEL])
        unknown = requests.post(f"{url}/v1/models/nope/predict", json=bodies[MODEL][0], headers={"X-API-Key": key})
        shadows = {model: _step(envs[model], "shadow", *release[model], "--plan", str(plans[model])) for model in envs}
        for model in envs:  # both rollouts open in the same minutes
            stage_args = ("--stage", "1", "--profile", "demo", "--plan", str(plans[model]))
            _step(envs[model], "rollout-stage", *release[model], *stage_args)
        _crash(env, "parcel_eta", [1], monkeypatch)  # the parcel candidate's instance goes away mid-stage
        parcel_verdict = _analyze(parcel, versions["parcel_eta"], 1)
        rolled_back = _step(parcel, "rollback", "--end", NEXT.end.isoformat(), "--reason", "nightly run failed")
        decided = [_analyze(env, versions[MODEL], 1)]
        for stage in (2, 3):
            stage_args = ("--stage", str(stage), "--profile", "demo", "--plan", str(plans[MODEL]))
            _step(env, "rollout-stage", *release[MODEL], *stage_args)
            decided.append(_analyze(env, versions[MODEL], stage))
        promoted = _step(env, "promote", *release[MODEL])
        ready = _ready_once(url, lambda r: r["models"][MODEL]["stable_version"] == 2)  # promote's write is read
        metrics = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in _samples(url)}

    # The gateway answers the classifier in its own outputs, inside their declared ranges; a model it does not serve
    # is a 404 naming the ones it does; it is ready, each model with its own stable version.
    assert unknown.status_code == 404 and unknown.json()["error"] == "unknown_model", unknown.text
    assert "late_delivery" in unknown.json()["detail"] and "parcel_eta" in unknown.json()["detail"]
    assert {m: (r["ready"], r["stable_version"]) for m, r in ready["models"].items()} == {
        MODEL: (True, 2),
        "parcel_eta": (True, 1),
    }, ready
    assert set(answer) >= {"is_late", "late_probability"} and "eta_prediction" not in answer, answer
    assert answer["is_late"] in (0.0, 1.0) and 0.0 <= answer["late_probability"] <= 1.0, answer
    assert answer["cohort"] in ("remote_routes", "bulky", "core") and answer["source"] == "model", answer
    # Each shadow judged its model by its task's contracts.
    assert {model: shadow["status"] for model, shadow in shadows.items()} == {MODEL: "passed", "parcel_eta": "passed"}
    assert shadows[MODEL]["served_quality"]["task"] == "binary_classification", shadows[MODEL]
    # The parcel candidate was rolled back by its fast guard; the classifier went on and was promoted.
    assert parcel_verdict is None and rolled_back["status"] == "rolled back", rolled_back
    assert [d and d["action"] for d in decided] == ["advance", "advance", "promote"], decided
    assert promoted["status"] == "promoted" and promoted["previous_version"] == 1, promoted
    status = {model: json.loads(_run(model_env, "rollout", "status").stdout) for model, model_env in envs.items()}
    assert all(s["consistent"] for s in status.values()), {m: s["disagreements"] for m, s in status.items()}
    assert {m: (s["rollout"]["model"], s["rollout"]["phase"]) for m, s in status.items()} == {
        MODEL: (MODEL, "promoted"),
        "parcel_eta": ("parcel_eta", "rolled_back"),
    }
    assert {m: (s["routing"]["stable_version"], s["routing"]["candidate_version"]) for m, s in status.items()} == {
        MODEL: (2, None),
        "parcel_eta": (1, None),
    }
    assert {m: s["aliases"]["champion"] for m, s in status.items()} == {MODEL: 2, "parcel_eta": 1}
    assert "fast_guard" in status["parcel_eta"]["rollout"]["reason"], status["parcel_eta"]["rollout"]
    # No client saw an error on either gateway: the parcel candidate's failures were answered by its stable.
    assert late_report.errors == 0 and parcel_report.errors == 0, (late_report.summary(), parcel_report.summary())
    assert {served.split("/")[0] for served in late_report.served} == {"remote_routes", "bulky", "core"}
    assert any("/v2/model" in served for served in late_report.served), late_report.served
    assert {served.split("/")[0] for served in parcel_report.served} == {"high_value", "long_tail", "core"}
    # Each model's series carry its name: the parcel candidate's failures (v2) are not the classifier's v2's.
    failures = {model: _sum(metrics, "mlrelease_gateway_model_failures_total", model=model) for model in envs}
    assert failures["parcel_eta"] > 0 and failures[MODEL] == 0, failures
    assert all(_sum(metrics, "mlrelease_gateway_requests_total", model=model) > 100 for model in envs), metrics
    # Each model's state lives apart: its routing, decisions and run artifacts under its own name.
    for model in envs:
        assert (home / "gateway" / model / "routing.json").is_file() and (home / "artifacts" / model).is_dir()


def _ready_once(url: str, settled: Any, within_s: float = 10.0) -> dict[str, Any]:
    """GET /readyz until `settled(body)` holds (a replica reads the routing store every 0.2 s), or the last body."""
    import time

    import requests

    deadline = time.monotonic() + within_s
    while True:
        body: dict[str, Any] = requests.get(f"{url}/readyz", timeout=5).json()
        if settled(body) or time.monotonic() > deadline:
            return body
        time.sleep(0.2)


def _samples(url: str) -> list[Any]:
    """Every sample of the gateway's Prometheus exposition."""
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(f"{url}/metrics", timeout=5).text
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def _sum(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    """The total of a metric's samples carrying `labels`."""
    return sum(v for (n, ls), v in metrics.items() if n == name and labels.items() <= dict(ls).items())


def requests_post(url: str, key: str, body: dict[str, Any], path: str = "/v1/predict") -> dict[str, Any]:
    """One predict call, as a client makes it."""
    import requests

    response = requests.post(f"{url}{path}", json=body, headers={"X-API-Key": key}, timeout=10)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer
