"""Gateway configuration: the repo's YAML loads, and each kind of bad value is a StepError naming the problem."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlrelease.errors import StepError
from mlrelease.gateway.config import DEFAULT_CONFIG, GatewayConfig, load_config

BASE: dict[str, Any] = {"model": "parcel_eta"}


def _write(tmp_path: Path, raw: Any, name: str = "gateway.yaml") -> Path:
    path = tmp_path / name
    path.write_text(raw if isinstance(raw, str) else yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def test_repo_config_loads_with_the_spec_s_cohorts_in_order():
    config = load_config(DEFAULT_CONFIG)
    assert isinstance(config, GatewayConfig)
    assert config.cohorts.names == ("high_value", "long_tail", "core")
    assert config.cohorts.bucket_key == "user_id"
    assert config.cohorts.rules[-1].any_of == ()  # the catch-all
    assert config.guard.failures_to_trip == 3
    assert config.replay_as_of is None


def test_minimal_config_loads_with_defaults(tmp_path):
    config = load_config(_write(tmp_path, BASE))
    assert config.cohorts.names == ("high_value", "long_tail", "core")
    assert config.spec.fallback.params["km_per_hour"] == 55.0  # the served model's, from its release spec
    assert config.auth.header == "X-API-Key"


def test_override_replaces_yaml_value_and_none_is_ignored(tmp_path):
    path = _write(tmp_path, BASE)
    config = load_config(path, replay_as_of="2026-11-29T02:00:00Z", model=None)
    assert config.replay_as_of == datetime(2026, 11, 29, 2, tzinfo=UTC)
    assert config.model == "parcel_eta"


def test_cohorts_in_the_gateway_config_are_refused_naming_where_they_live_now(tmp_path):
    old = {**BASE, "cohorts": {"bucket_key": "user_id", "rules": [{"name": "core"}]}}
    with pytest.raises(StepError, match=r"cohorts: .*declared in its release spec \(models/<name>/release.yaml"):
        load_config(_write(tmp_path, old))
    old = {**BASE, "fallback": {"base_hours": 8, "confidence": 0.3}}
    with pytest.raises(StepError, match=r"fallback: .*declared in its release spec \(models/<name>/release.yaml"):
        load_config(_write(tmp_path, old))


def test_unknown_top_level_key_is_named(tmp_path):
    raw = copy.deepcopy(BASE) | {"modle": "typo"}
    with pytest.raises(StepError, match=r"modle: Extra inputs are not permitted"):
        load_config(_write(tmp_path, raw))


def test_unknown_nested_key_is_named(tmp_path):
    raw = copy.deepcopy(BASE) | {"guard": {"failures_to_trp": 3}}
    with pytest.raises(StepError, match=r"guard\.failures_to_trp: Extra inputs are not permitted"):
        load_config(_write(tmp_path, raw))


def test_replay_as_of_without_timezone_is_refused(tmp_path):
    raw = copy.deepcopy(BASE) | {"replay_as_of": "2026-11-29T02:00:00"}
    with pytest.raises(StepError, match=r"replay_as_of: .*needs a timezone"):
        load_config(_write(tmp_path, raw))


def test_replay_as_of_with_timezone_is_accepted(tmp_path):
    raw = copy.deepcopy(BASE) | {"replay_as_of": "2026-11-29T02:00:00+00:00"}
    assert load_config(_write(tmp_path, raw)).replay_as_of == datetime(2026, 11, 29, 2, tzinfo=UTC)


def test_eta_bounds_in_the_gateway_config_are_refused_naming_the_specs_output_range(tmp_path):
    raw = copy.deepcopy(BASE) | {"guard": {"min_eta_hours": 0, "max_eta_hours": 500}}
    with pytest.raises(StepError, match=r"min_eta_hours/max_eta_hours: .* release spec .*outputs\[\]\.range"):
        load_config(_write(tmp_path, raw))


def test_non_yaml_file_is_refused(tmp_path):
    path = _write(tmp_path, "cohorts: [unclosed\n  : : :\n", name="broken.yaml")
    with pytest.raises(StepError, match=r"is not valid YAML"):
        load_config(path)


def test_yaml_that_is_not_a_mapping_is_refused(tmp_path):
    path = _write(tmp_path, "- a\n- b\n", name="list.yaml")
    with pytest.raises(StepError, match=r"must be a mapping, got list"):
        load_config(path)


def test_missing_file_is_refused(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(StepError, match=r"cannot be read") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_an_empty_file_is_the_defaults_for_the_declared_model(tmp_path):
    config = load_config(_write(tmp_path, "", name="empty.yaml"))
    assert config.model == "parcel_eta" and config.cohorts.names == ("high_value", "long_tail", "core")


def test_a_model_no_spec_declares_is_named_with_the_declared_ones(tmp_path):
    config = load_config(_write(tmp_path, {"model": "route_risk"}))
    with pytest.raises(
        StepError, match=r"no model 'route_risk' is declared in .*models \(declared: late_delivery, parcel_eta\)"
    ):
        _ = config.cohorts


def test_a_step_reads_its_gateway_config_once_and_again_only_when_the_file_changes(tmp_path, monkeypatch):
    import mlrelease.gateway.config as gateway_config
    from mlrelease.settings import Settings

    path = _write(tmp_path, {**BASE, "feature_timeout_ms": 700})
    monkeypatch.setenv("MLRELEASE_GATEWAY_CONFIG", str(path))
    settings = Settings.from_env()
    reads: list[Path] = []
    real = gateway_config.load_config
    monkeypatch.setattr(gateway_config, "load_config", lambda p, **kw: reads.append(p) or real(p, **kw))
    first = gateway_config.step_gateway_config(settings)
    assert gateway_config.step_gateway_config(settings) is first and first.feature_timeout_ms == 700
    assert reads == [path.resolve()]
    _write(tmp_path, {**BASE, "feature_timeout_ms": 900, "max_body_bytes": 20_000})  # edited: read again
    assert gateway_config.step_gateway_config(settings).feature_timeout_ms == 900 and len(reads) == 2
