"""One gateway serving several models: its config, its predict paths and OpenAPI, readiness and metrics per model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mlrelease.errors import StepError
from mlrelease.gateway.app import create_app
from mlrelease.gateway.auth import add_client
from mlrelease.gateway.config import load_config
from mlrelease.gateway.metrics import GatewayMetrics
from mlrelease.settings import Settings
from mlrelease_drills.devkit import write_gateway_config

BOTH = ["late_delivery", "parcel_eta"]
BODY = {"order_id": 1, "user_id": 2, "package_id": 3, "route_id": 4}


def _config(tmp_path: Path, **fields: Any) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(fields), encoding="utf-8")
    return path


def test_the_first_served_model_is_the_default_and_each_keeps_its_own_state(tmp_path):
    config = load_config(_config(tmp_path, models=BOTH))
    assert config.model == "late_delivery" and config.served_models == ("late_delivery", "parcel_eta")
    settings = Settings.from_env().for_model("parcel_eta")
    states = {m: config.state_url(settings, m) for m in BOTH}
    assert states["parcel_eta"].endswith("/gateway/parcel_eta/routing.json") and len(set(states.values())) == 2
    assert config.decision_dir(settings, "late_delivery").parts[-2:] == ("late_delivery", "decisions")
    explicit = load_config(_config(tmp_path, model="parcel_eta", models=BOTH))
    assert explicit.served_models == ("parcel_eta", "late_delivery")  # the default first, whatever the list's order


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"models": ["parcel_eta", "parcel_eta"]}, "names a model twice"),
        ({"model": "route_risk", "models": BOTH}, "is not one of models"),
        ({"models": BOTH, "routing": {"state_url": "file:///tmp/r.json"}}, "a file holds one model's routing state"),
        ({"models": BOTH, "decision_log": {"directory": "/tmp/d"}}, "writes each model's log under"),
    ],
)
def test_a_config_that_would_mix_models_state_is_refused_naming_the_field(tmp_path, fields, problem):
    with pytest.raises(StepError, match=problem):
        load_config(_config(tmp_path, **fields))


def test_an_undeclared_served_model_fails_at_start_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MLRELEASE_HOME", str(tmp_path))
    config = write_gateway_config(tmp_path / "g.yaml", models=["parcel_eta", "route_risk"], auth={"required": False})
    with pytest.raises(StepError, match="route_risk"):
        create_app(load_config(config), Settings.from_env())


class Answers:
    """A model's PredictService stand-in: answers with its model's name, and remembers what it was asked."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.seen: list[int] = []

    async def predict(self, request: Any) -> dict[str, Any]:
        self.seen.append(request.order_id)
        return {"order_id": request.order_id, "served_by": self.model}


@pytest.fixture
def two_models(tmp_path, monkeypatch):
    """An app serving both example models (no lifespan: no Feast, no Triton), each with a stand-in service."""
    monkeypatch.setenv("MLRELEASE_HOME", str(tmp_path))
    key = add_client(tmp_path / "keys.yaml", "tests")
    config = write_gateway_config(tmp_path / "g.yaml", models=BOTH, auth={"keys_file": str(tmp_path / "keys.yaml")})
    app = create_app(load_config(config), Settings.from_env())
    app.state.services.update({m: Answers(m) for m in BOTH})
    return TestClient(app), key, app


def test_each_models_path_reaches_its_own_service_and_v1_predict_the_default(two_models):
    http, key, app = two_models
    auth = {"X-API-Key": key}
    assert http.post("/v1/models/parcel_eta/predict", json=BODY, headers=auth).json()["served_by"] == "parcel_eta"
    late = http.post("/v1/models/late_delivery/predict", json={**BODY, "order_id": 7}, headers=auth)
    assert late.json() == {"order_id": 7, "served_by": "late_delivery"}
    assert http.post("/v1/predict", json={**BODY, "order_id": 9}, headers=auth).json()["served_by"] == "late_delivery"
    assert app.state.services["late_delivery"].seen == [7, 9] and app.state.services["parcel_eta"].seen == [1]


def test_a_model_not_served_is_a_404_naming_the_served_ones_after_the_key_check(two_models):
    http, key, _ = two_models
    assert http.post("/v1/models/route_risk/predict", json=BODY).status_code == 401  # the key first, as for any model
    unknown = http.post("/v1/models/route_risk/predict", json=BODY, headers={"X-API-Key": key})
    assert unknown.status_code == 404 and unknown.json() == {
        "error": "unknown_model",
        "detail": "this gateway serves no model 'route_risk'; it serves ['late_delivery', 'parcel_eta']",
    }
    assert http.post("/v1/models/a/b/predict", json=BODY, headers={"X-API-Key": key}).status_code == 404


def test_the_openapi_documents_each_models_answer_under_its_own_path(two_models):
    http, _, _ = two_models
    schema = http.get("/openapi.json").json()
    paths = schema["paths"]
    assert {"/v1/models/parcel_eta/predict", "/v1/models/late_delivery/predict", "/v1/predict"} <= set(paths)
    assert {"/v1/models/parcel_eta/routing", "/v1/models/late_delivery/routing", "/v1/routing"} <= set(paths)

    def answer_fields(path: str) -> set[str]:
        ref = paths[path]["post"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
        return set(schema["components"]["schemas"][ref.rsplit("/", 1)[1]]["properties"])

    assert {"is_late", "late_probability"} <= answer_fields("/v1/models/late_delivery/predict")
    assert {"eta_prediction", "confidence_score"} <= answer_fields("/v1/models/parcel_eta/predict")
    assert answer_fields("/v1/predict") == answer_fields("/v1/models/late_delivery/predict")


def test_readiness_lists_every_model_and_needs_one_routing_state(two_models):
    http, _, _ = two_models
    reply = http.get("/readyz")  # no lifespan: no routing state read for either model
    assert reply.status_code == 503
    assert set(reply.json()["models"]) == set(BOTH)
    assert all(not m["ready"] and m["mode"] == "no_routing_state" for m in reply.json()["models"].values())


def test_each_models_series_carry_its_name():
    metrics = GatewayMetrics()
    metrics.for_model("parcel_eta").observe_answer("core", "2", "model", 12.0, 0.9, 0.004)
    metrics.for_model("late_delivery").model_failures.labels("2", "nan").inc()
    assert metrics.for_model("parcel_eta") is metrics.for_model("parcel_eta")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        for s in family.samples
    }
    requests = {labels: v for (name, labels), v in samples.items() if name == "mlrelease_gateway_requests_total"}
    assert requests == {(("cohort", "core"), ("model", "parcel_eta"), ("source", "model"), ("version", "2")): 1.0}
    failures = {labels for (name, labels), _ in samples.items() if name == "mlrelease_gateway_model_failures_total"}
    assert failures == {(("kind", "nan"), ("model", "late_delivery"), ("version", "2"))}


def test_a_step_of_a_model_the_config_does_not_serve_never_gets_that_configs_explicit_state(tmp_path):
    """A one-model config with an explicit routing file or decision folder (deploy's, for one): another model's
    steps reading it would judge and route with the first model's state, so they are refused naming why."""
    settings = Settings.from_env()
    explicit = load_config(
        _config(
            tmp_path,
            model="parcel_eta",
            routing={"state_url": f"file://{tmp_path}/routing.json"},
            decision_log={"directory": str(tmp_path / "decisions")},
        )
    )
    assert explicit.decision_dir(settings, "parcel_eta") == tmp_path / "decisions"
    with pytest.raises(StepError, match=r"serves \['parcel_eta'\], not 'late_delivery': its routing.state_url"):
        explicit.state_url(settings, "late_delivery")
    with pytest.raises(StepError, match="not 'late_delivery': its decision_log.directory"):
        explicit.decision_dir(settings, "late_delivery")
    by_model = load_config(_config(tmp_path, model="parcel_eta"))  # defaults: each model's own, served or not
    assert by_model.decision_dir(settings, "late_delivery").parts[-2:] == ("late_delivery", "decisions")
