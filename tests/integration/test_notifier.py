"""The failure notifier posts real HTTP requests to a real local receiver."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from mlrelease_airflow.notifiers import WebhookAlertNotifier, webhook_url

pytestmark = pytest.mark.integration


def _context():
    ti = SimpleNamespace(
        dag_id="nightly_release",
        task_id="validate_data",
        run_id="scheduled__2026-11-29",
        try_number=2,
        log_url="http://airflow.local/log?x=1",
    )
    return {
        "ti": ti,
        "dag_run": SimpleNamespace(run_id="scheduled__2026-11-29"),
        "exception": RuntimeError("data quality failed (2 checks)"),
        "data_interval_end": "2026-11-29T02:00:00+00:00",
    }


def test_json_alert_from_env_webhook(receiver, monkeypatch):
    monkeypatch.setenv("MLRELEASE_ALERT_WEBHOOK", receiver.url)
    WebhookAlertNotifier(conn_id="mlrelease_alerts_absent").notify(_context())
    assert len(receiver.bodies) == 1
    body = receiver.bodies[0]["body"]
    assert receiver.bodies[0]["path"] == "/hooks/alerts"
    assert body == {
        "event": "task_failed",
        "dag_id": "nightly_release",
        "task_id": "validate_data",
        "run_id": "scheduled__2026-11-29",
        "try_number": 2,
        "data_interval_end": "2026-11-29T02:00:00+00:00",
        "error": "data quality failed (2 checks)",
        "log_url": "http://airflow.local/log?x=1",
    }


def test_slack_payload_from_an_airflow_connection(receiver, monkeypatch):
    monkeypatch.delenv("MLRELEASE_ALERT_WEBHOOK", raising=False)
    monkeypatch.setenv(
        "AIRFLOW_CONN_MLRELEASE_ALERTS", json.dumps({"conn_type": "http", "extra": {"url": receiver.url}})
    )
    assert webhook_url("mlrelease_alerts") == receiver.url
    WebhookAlertNotifier(payload_format="slack").notify(_context())
    body = receiver.bodies[0]["body"]
    assert body["text"].startswith(":rotating_light: *nightly_release.validate_data* failed")
    assert "data quality failed" in body["text"] and "<http://airflow.local/log?x=1|logs>" in body["text"]
    assert body["blocks"][0]["text"]["type"] == "mrkdwn"


def test_connection_given_as_uri(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_MLRELEASE_ALERTS", "http://127.0.0.1:9999/hooks%2Falerts")
    assert webhook_url("mlrelease_alerts") == "http://127.0.0.1:9999/hooks/alerts"


def test_receiver_error_is_raised_not_swallowed(monkeypatch):
    from tests.conftest import free_port

    monkeypatch.setenv("MLRELEASE_ALERT_WEBHOOK", f"http://127.0.0.1:{free_port()}/nothing-listens")
    import requests

    with pytest.raises(requests.ConnectionError):
        WebhookAlertNotifier(conn_id="mlrelease_alerts_absent", timeout=2).notify(_context())
