"""The lean request path without servers: the ASGI predict endpoint, Triton answer parsing, warmup config, workers."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from fastapi.testclient import TestClient

from mlrelease.gateway.app import create_app
from mlrelease.gateway.auth import add_client
from mlrelease.gateway.cli import default_workers
from mlrelease.gateway.config import load_config
from mlrelease.gateway.model_client import ModelFailure, _outputs
from mlrelease.gateway.online_features import StaleFeatures
from mlrelease.gateway.triton_http import HttpAnswer
from mlrelease.serving.cpu_repo import cpu_config
from mlrelease.serving.triton_repo import ServingConfig, build_config, parse_pbtxt, to_pbtxt
from mlrelease.settings import Settings
from mlrelease_drills.devkit import write_gateway_config

OUTPUTS = ("eta_prediction", "confidence_score")  # the parcel spec's prediction and score
BODY = {"order_id": 1, "user_id": 2, "package_id": 3, "route_id": 4}
ANSWER = {
    "order_id": 1,
    "eta_prediction": 12.5,
    "confidence_score": 0.9,
    "model_version": 1,
    "cohort": "core",
    "source": "model",
    "routing_revision": 3,
}


class FakeService:
    """Answers ANSWER, or raises what it was given."""

    def __init__(self, raises: Exception | None = None) -> None:
        self.raises = raises
        self.seen: list[object] = []

    async def predict(self, request):
        self.seen.append(request)
        if self.raises:
            raise self.raises
        return {**ANSWER, "order_id": request.order_id}


@pytest.fixture
def client(tmp_path, monkeypatch):
    monkeypatch.setenv("MLRELEASE_HOME", str(tmp_path))
    key = add_client(tmp_path / "keys.yaml", "tests")
    config = write_gateway_config(
        tmp_path / "gateway.yaml",
        auth={"keys_file": str(tmp_path / "keys.yaml")},
        routing={"state_url": f"file://{tmp_path}/routing.json"},
    )
    app = create_app(load_config(config), Settings.from_env())
    app.state.services[app.state.config.model] = FakeService()  # no lifespan: no Feast, no Triton
    http = TestClient(app)
    http.headers["X-API-Key"] = key
    return http, app


def test_predict_answers_the_service_json(client):
    http, app = client
    response = http.post("/v1/predict", json=BODY)
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    assert response.json() == ANSWER
    assert app.state.services[app.state.config.model].seen[0].route_id == 4


def test_validation_errors_look_like_fastapis(client):
    http, _ = client
    missing = http.post("/v1/predict", json={k: v for k, v in BODY.items() if k != "route_id"})
    assert missing.status_code == 422 and missing.json()["detail"][0]["loc"] == ["body", "route_id"]
    wrong = http.post("/v1/predict", json={**BODY, "user_id": "five"})
    assert wrong.status_code == 422 and wrong.json()["detail"][0]["loc"] == ["body", "user_id"]
    broken = http.post("/v1/predict", content=b'{"order_id": 1,', headers={"Content-Type": "application/json"})
    assert broken.status_code == 422 and broken.json()["detail"][0]["type"] == "json_invalid"
    empty = http.post("/v1/predict", content=b"", headers={"Content-Type": "application/json"})
    assert empty.status_code == 422 and empty.json()["detail"][0]["loc"] == ["body"]
    extra = http.post("/v1/predict", json={**BODY, "pad": 1})
    assert extra.status_code == 422 and extra.json()["detail"][0]["loc"] == ["body", "pad"]


def test_auth_body_limit_and_service_refusals(client):
    http, app = client
    assert http.post("/v1/predict", json=BODY, headers={"X-API-Key": "nope"}).status_code == 401
    huge = http.post("/v1/predict", json={**BODY, "pad": "x" * 50_000})
    assert huge.status_code == 413 and huge.json()["error"] == "body_too_large"
    app.state.services[app.state.config.model] = FakeService(
        StaleFeatures("package_features is 18.0 h old (budget 6 h)")
    )
    stale = http.post("/v1/predict", json=BODY)
    assert stale.status_code == 400
    assert stale.json() == {
        "error": "feature_stale",
        "detail": "features too old to serve",
        "feature_stale_reason": "package_features is 18.0 h old (budget 6 h)",
    }


def test_other_routes_still_go_through_fastapi(client):
    http, _ = client
    assert http.get("/healthz").json() == {"status": "ok"}
    assert "/v1/predict" in http.get("/openapi.json").json()["paths"]
    assert http.get("/v1/predict").status_code == 405


def _answer(eta: list[float], confidence: list[float]) -> HttpAnswer:
    outputs = [
        {"name": name, "datatype": "FP32", "shape": [len(v), 1], "parameters": {"binary_data_size": 4 * len(v)}}
        for name, v in (("eta_prediction", eta), ("confidence_score", confidence))
    ]
    header = orjson.dumps({"model_name": "parcel_eta", "outputs": outputs})
    data = np.asarray(eta, np.float32).tobytes() + np.asarray(confidence, np.float32).tobytes()
    return HttpAnswer(200, len(header), header + data)


def test_triton_binary_answer_is_split_per_output():
    eta, confidence = _outputs(_answer([1.5, 2.5, float("nan")], [0.1, 0.2, 0.3]), 1, 3, OUTPUTS)
    assert eta[:2].tolist() == [1.5, 2.5] and np.isnan(eta[2])
    assert confidence.tolist() == pytest.approx([0.1, 0.2, 0.3])


def test_triton_errors_and_short_answers_are_model_failures():
    with pytest.raises(ModelFailure, match="HTTP 400 .*bad input"):
        _outputs(HttpAnswer(400, None, b'{"error": "bad input"}'), 1, 1, OUTPUTS)
    with pytest.raises(ModelFailure, match="answered 2 rows for 3"):
        _outputs(_answer([1.0, 2.0], [0.5, 0.5]), 1, 3, OUTPUTS)
    with pytest.raises(ModelFailure, match="unreadable answer"):
        _outputs(HttpAnswer(200, 5, b"garbage"), 1, 1, OUTPUTS)


def test_config_warms_each_instance_with_zero_rows_in_production_and_cpu_translation():
    production = build_config("parcel_eta", 14, ("eta_prediction", "confidence_score"), [1], ServingConfig())
    for config in (production, cpu_config(production)):
        parsed = parse_pbtxt(to_pbtxt(config))  # what Triton reads back from config.pbtxt
        samples = {w.name: w for w in parsed.model_warmup}
        assert sorted(samples) == ["zeros_batch_1", "zeros_batch_64"]
        for sample in samples.values():
            tensor = sample.inputs["features"]
            assert list(tensor.dims) == [14] and tensor.zero_data and tensor.data_type == 11  # TYPE_FP32
        assert samples["zeros_batch_64"].batch_size == 64


def test_warmup_batch_is_capped_by_max_batch_size():
    config = build_config(
        "parcel_eta", 14, ("eta_prediction",), [1], ServingConfig(max_batch_size=8, warmup_batch_sizes=(1, 64, 8))
    )
    assert [w.batch_size for w in config.model_warmup] == [1, 8]


@pytest.mark.parametrize(("cpu_max", "expected"), [("max 100000", None), ("150000 100000", 2), ("50000 100000", 1)])
def test_default_workers_follow_the_cgroup_quota(tmp_path, cpu_max, expected):
    (tmp_path / "cpu.max").write_text(cpu_max)
    workers = default_workers(tmp_path)
    assert workers >= 1
    if expected is not None:
        assert workers == min(expected, default_workers(tmp_path / "none"))


def test_metrics_stay_in_memory_in_a_process_that_inherited_feasts_multiprocess_dir(tmp_path):
    """`import feast` exports PROMETHEUS_MULTIPROC_DIR; a gateway started by such a process must not write its
    samples into that directory (the parent deletes it at exit) but keep them in memory, as it exports them."""
    import os
    import subprocess
    import sys

    script = (
        "from prometheus_client import generate_latest\n"
        "from mlrelease.gateway.metrics import GatewayMetrics\n"
        "m = GatewayMetrics()\n"
        "m.for_model('parcel_eta').observe_answer('core', '1', 'model', 12.0, 0.9, 0.004)\n"
        "print(generate_latest(m.registry).decode())\n"
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PROMETHEUS_MULTIPROCESS_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    assert 'mlrelease_gateway_requests_total{cohort="core",model="parcel_eta",source="model",version="1"} 1.0' in out
    assert list(tmp_path.iterdir()) == []
