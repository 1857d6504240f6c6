"""The gates a version needs before traffic: which are missing or failed, and how an override is refused or allowed."""

from __future__ import annotations

import pytest

from mlrelease.errors import GateFailed
from mlrelease.rollout.gates import REQUIRED_GATES, alert_override, gate_problems, require_gates

PASSED = dict(REQUIRED_GATES)


def test_a_version_that_passed_every_gate_has_no_problems():
    assert gate_problems(PASSED) == []
    assert require_gates(3, PASSED, "promote", None) == []


def test_missing_and_failed_gates_are_named_with_their_reasons():
    tags = {**PASSED, "shadow_status": "failed", "shadow_reason": "calibration: confidence does not track error"}
    del tags["benchmark_status"]
    assert gate_problems(tags) == [
        "benchmark_status missing (the step never passed it)",
        "shadow_status=failed (calibration: confidence does not track error)",
    ]
    with pytest.raises(GateFailed, match=r"promote refuses v3: benchmark_status missing .*--override-gates REASON"):
        require_gates(3, tags, "promote", None)
    assert len(require_gates(3, tags, "promote", "incident 42: shadow was misconfigured")) == 2


def test_an_override_without_a_webhook_says_it_was_not_alerted(monkeypatch):
    from mlrelease.settings import Settings

    monkeypatch.delenv("MLRELEASE_ALERT_WEBHOOK", raising=False)
    webhook = Settings.from_env().alert_webhook
    sent = alert_override(3, "rollout-stage", ["shadow_status=failed"], "incident 42", webhook)
    assert sent["alerted"] is False and "MLRELEASE_ALERT_WEBHOOK is not set" in sent["why"]
    assert sent["event"] == "gates_overridden" and sent["reason"] == "incident 42"


def test_pre_traffic_gates_are_not_repeated_while_the_candidates_rollout_holds_traffic(tmp_path, monkeypatch):
    from mlrelease.rollout.gates import held_by_open_rollout
    from mlrelease.rollout.store import RolloutStore
    from mlrelease.settings import Settings
    from tests.unit.records import rollout_record

    monkeypatch.setenv("MLRELEASE_HOME", str(tmp_path))
    settings = Settings.from_env()
    assert held_by_open_rollout(settings, 2, "benchmark") is None  # no rollout: the gate runs
    record = rollout_record()
    RolloutStore.from_settings(settings, "parcel_eta").begin(record)
    held = held_by_open_rollout(settings, 2, "benchmark")
    assert held is not None and held["status"].startswith("skipped: v2's rollout holds traffic (stage 1")
    assert held_by_open_rollout(settings, 3, "benchmark") is None  # another version's gates still run
