"""The gateway app as uvicorn workers build it (no servers: the lifespan, which opens Feast and Triton, is not run)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from mlrelease.errors import StepError
from mlrelease.gateway.app import create_app_from_env
from mlrelease_drills.devkit import write_gateway_config


def test_workers_get_the_replay_instant_and_config_from_the_environment(tmp_path, monkeypatch):
    config = write_gateway_config(
        tmp_path / "gateway.yaml", auth={"required": False}, routing={"state_url": f"file://{tmp_path}/r.json"}
    )
    monkeypatch.setenv("MLRELEASE_HOME", str(tmp_path))
    monkeypatch.setenv("MLRELEASE_GATEWAY_CONFIG", str(config))
    monkeypatch.setenv("MLRELEASE_GATEWAY_REPLAY_AS_OF", "2026-11-29T02:00:00+00:00")
    app = create_app_from_env()
    assert app.state.config.replay_as_of == datetime(2026, 11, 29, 2, tzinfo=UTC)
    assert {"/v1/predict", "/v1/routing", "/healthz", "/readyz", "/metrics"} <= {r.path for r in app.routes}


def test_refuses_to_start_without_api_clients(tmp_path, monkeypatch):
    config = write_gateway_config(tmp_path / "gateway.yaml", auth={"keys_file": str(tmp_path / "none.yaml")})
    monkeypatch.setenv("MLRELEASE_HOME", str(tmp_path))
    monkeypatch.setenv("MLRELEASE_GATEWAY_CONFIG", str(config))
    monkeypatch.delenv("MLRELEASE_GATEWAY_REPLAY_AS_OF", raising=False)
    with pytest.raises(StepError, match="no API clients in .*none.yaml: add one with `mlrelease gateway-key add NAME`"):
        create_app_from_env()


def test_not_ready_until_a_routing_state_is_known(tmp_path, monkeypatch):
    """No routing state read yet: no request can be routed, so the replica stays out of its Service (503)."""
    from fastapi.testclient import TestClient

    config = write_gateway_config(
        tmp_path / "gateway.yaml", auth={"required": False}, routing={"state_url": f"file://{tmp_path}/r.json"}
    )
    monkeypatch.setenv("MLRELEASE_HOME", str(tmp_path))
    monkeypatch.setenv("MLRELEASE_GATEWAY_CONFIG", str(config))
    reply = TestClient(create_app_from_env()).get("/readyz")  # no lifespan: nothing read, nothing opened
    assert reply.status_code == 503
    unready = {
        "ready": False,
        "mode": "no_routing_state",
        "stable_ready": False,
        "routing_revision": None,
        "stable_version": None,
        "store_ok": True,  # no read failed (none was made: no lifespan)
    }
    assert reply.json() == {**unready, "models": {"parcel_eta": unready}}
