"""check-freshness pushes its metrics to a Pushgateway: a real HTTP server on loopback receives the push.

The conftest `receiver` records JSON POSTs (webhooks); `push_to_gateway` sends a PUT with a Prometheus
text body, so this module has its own receiver. Feast itself is exercised by test_feast_steps.py: here a
small stand-in store lists the views, so the test isolates what the push adds.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

import mlrelease.steps.check_freshness as step
from mlrelease.errors import GateFailed
from mlrelease.registry import MODEL_NAME
from mlrelease.settings import Settings
from tests.conftest import free_port

pytestmark = pytest.mark.integration
END = datetime(2026, 11, 29, 2, tzinfo=UTC)
GROUP_PATH = f"/metrics/job/{step.PUSH_JOB}/model/{MODEL_NAME}"


@dataclass
class Push:
    """One request the fake Pushgateway received."""

    method: str
    path: str
    content_type: str
    body: str
    samples: dict[str, dict[str, float]] = field(default_factory=dict)


class PushReceiver:
    """A real HTTP server on a free loopback port that records every PUT/POST (answering `status`)."""

    def __init__(self, status: int = 200) -> None:
        self.pushes: list[Push] = []
        pushes = self.pushes

        class Handler(http.server.BaseHTTPRequestHandler):
            def _record(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
                pushes.append(Push(self.command, self.path, self.headers.get("Content-Type", ""), body))
                self.send_response(status)
                self.end_headers()

            do_PUT = do_POST = _record  # noqa: N815 - http.server's naming

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


def _samples(body: str) -> dict[str, dict[str, float]]:
    """{sample name: {feature_view or "": value}} parsed the way Prometheus parses the exposition."""
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            out.setdefault(s.name, {})[s.labels.get("feature_view", "")] = s.value
    return out


@pytest.fixture
def pushgateway() -> Iterator[PushReceiver]:
    """A fake Pushgateway that accepts every push."""
    rec = PushReceiver()
    yield rec
    rec.close()


@pytest.fixture
def two_views(home, monkeypatch):
    """Two online views (route 9 h, user 36 h budget) and their watermarks: route 2 h behind END, user 40 h."""
    views = [
        SimpleNamespace(name="route_features", online=True, tags={"freshness_budget_hours": "9"}),
        SimpleNamespace(name="user_features", online=True, tags={"freshness_budget_hours": "36"}),
    ]
    monkeypatch.setattr(step, "open_store", lambda settings: SimpleNamespace(list_feature_views=lambda: views))
    marks = {"route_features": END - timedelta(hours=2), "user_features": END - timedelta(hours=40)}
    (home / "state").mkdir(parents=True, exist_ok=True)
    (home / "state" / "feast_watermarks.json").write_text(json.dumps({v: t.isoformat() for v, t in marks.items()}))
    return marks


def test_push_puts_the_registry_under_the_job_and_model_group(pushgateway):
    results = [step.assess("route_features", timedelta(hours=9), END - timedelta(hours=2), END)]
    step.push_freshness_metrics(step.freshness_registry(results, checked_at=1_800_000_000.0), pushgateway.url)

    [push] = pushgateway.pushes
    assert (push.method, push.path) == ("PUT", GROUP_PATH)  # PUT replaces the whole group: no stale views linger
    assert push.content_type.startswith("text/plain")
    samples = _samples(push.body)
    assert samples["mlrelease_feature_last_event_timestamp_seconds"] == {
        "route_features": (END - timedelta(hours=2)).timestamp()
    }
    assert samples["mlrelease_feature_freshness_check_timestamp_seconds"] == {"": 1_800_000_000.0}
    assert samples["mlrelease_feature_freshness_budget_seconds"] == {"route_features": 9 * 3600.0}


def test_stale_check_still_pushes_before_failing_the_gate(two_views, pushgateway, monkeypatch):
    monkeypatch.setenv(step.PUSHGATEWAY_ENV, pushgateway.url)
    with pytest.raises(GateFailed, match="user_features lag 40.0h > budget 36h"):
        step.check_freshness(Settings.from_env(), END)

    [push] = pushgateway.pushes
    samples = _samples(push.body)
    assert samples["mlrelease_feature_fresh"] == {"route_features": 1.0, "user_features": 0.0}
    assert samples["mlrelease_feature_last_event_timestamp_seconds"] == {
        view: ts.timestamp() for view, ts in two_views.items()
    }
    # the pushed body is the same registry as the textfile the step wrote
    textfile = (Settings.from_env().artifacts_dir / "20261129T020000Z" / "freshness.prom").read_text()
    assert _samples(textfile) == samples


def test_fresh_check_reports_the_push(two_views, pushgateway, monkeypatch):
    monkeypatch.setenv(step.PUSHGATEWAY_ENV, pushgateway.url)
    outcome = step.check_freshness(Settings.from_env(), END - timedelta(hours=10))  # user view 30 h: within 36 h
    assert outcome["pushgateway"] == {"url": pushgateway.url, "pushed": True}
    assert [p.path for p in pushgateway.pushes] == [GROUP_PATH]


def test_unreachable_or_refusing_pushgateway_does_not_decide_the_gate(two_views, monkeypatch):
    nobody = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv(step.PUSHGATEWAY_ENV, nobody)
    outcome = step.check_freshness(Settings.from_env(), END - timedelta(hours=10))
    assert outcome["pushgateway"]["pushed"] is False
    assert outcome["pushgateway"]["url"] == nobody and "URLError" in outcome["pushgateway"]["error"]

    refusing = PushReceiver(status=500)
    try:
        monkeypatch.setenv(step.PUSHGATEWAY_ENV, refusing.url)
        outcome = step.check_freshness(Settings.from_env(), END - timedelta(hours=10))
    finally:
        refusing.close()
    assert len(refusing.pushes) == 1
    assert outcome["pushgateway"]["pushed"] is False and "500" in outcome["pushgateway"]["error"]


def test_without_the_variable_nothing_is_pushed(two_views, monkeypatch):
    monkeypatch.delenv(step.PUSHGATEWAY_ENV, raising=False)
    assert "pushgateway" not in step.check_freshness(Settings.from_env(), END - timedelta(hours=10))
