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

BASE: dict[str, Any] = {
    "model": "parcel_eta",
    "cohorts": {
        "bucket_key": "user_id",
        "rules": [
            {"name": "high_value", "any_of": [{"field": "tier", "op": "eq", "value": "premium"}]},
            {"name": "long_tail", "any_of": [{"field": "is_remote", "op": "eq", "value": True}]},
            {"name": "core"},
        ],
    },
}


def _write(tmp_path: Path, raw: Any, name: str = "gateway.yaml") -> Path:
    path = tmp_path / name
    path.write_text(raw if isinstance(raw, str) else yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def _with_rules(rules: list[dict[str, Any]]) -> dict[str, Any]:
    raw = copy.deepcopy(BASE)
    raw["cohorts"]["rules"] = rules
    return raw


def _with_condition(condition: dict[str, Any]) -> dict[str, Any]:
    return _with_rules([{"name": "special", "any_of": [condition]}, {"name": "core"}])


def test_repo_config_loads_with_cohorts_in_order():
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
    assert config.fallback.km_per_hour == 55.0
    assert config.auth.header == "X-API-Key"


def test_override_replaces_yaml_value_and_none_is_ignored(tmp_path):
    path = _write(tmp_path, BASE)
    config = load_config(path, replay_as_of="2026-11-29T02:00:00Z", model=None)
    assert config.replay_as_of == datetime(2026, 11, 29, 2, tzinfo=UTC)
    assert config.model == "parcel_eta"


def test_unknown_condition_field_is_named(tmp_path):
    path = _write(tmp_path, _with_condition({"field": "shoe_size", "op": "eq", "value": 42}))
    with pytest.raises(StepError, match=r"is invalid: .*unknown field 'shoe_size'") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_catch_all_not_last_is_refused(tmp_path):
    rules = [
        {"name": "core"},
        {"name": "high_value", "any_of": [{"field": "tier", "op": "eq", "value": "premium"}]},
    ]
    with pytest.raises(StepError, match=r"catch-all.*rules without: \['core'\]"):
        load_config(_write(tmp_path, _with_rules(rules)))


def test_two_catch_alls_are_refused(tmp_path):
    rules = [
        {"name": "high_value", "any_of": [{"field": "tier", "op": "eq", "value": "premium"}]},
        {"name": "other"},
        {"name": "core"},
    ]
    with pytest.raises(StepError, match=r"catch-all.*rules without: \['other', 'core'\]"):
        load_config(_write(tmp_path, _with_rules(rules)))


def test_no_catch_all_is_refused(tmp_path):
    rules = [{"name": "high_value", "any_of": [{"field": "tier", "op": "eq", "value": "premium"}]}]
    with pytest.raises(StepError, match=r"catch-all.*rules without: \[\]"):
        load_config(_write(tmp_path, _with_rules(rules)))


def test_duplicate_cohort_names_are_refused(tmp_path):
    rules = [
        {"name": "core", "any_of": [{"field": "tier", "op": "eq", "value": "premium"}]},
        {"name": "core"},
    ]
    with pytest.raises(StepError, match=r"cohort names must be unique, got \['core', 'core'\]"):
        load_config(_write(tmp_path, _with_rules(rules)))


@pytest.mark.parametrize("op", ["in", "not_in"])
def test_membership_op_needs_a_list(tmp_path, op):
    path = _write(tmp_path, _with_condition({"field": "category", "op": op, "value": "furniture"}))
    with pytest.raises(StepError, match=rf"op '{op}' needs a list value, got 'furniture'"):
        load_config(path)


def test_membership_op_with_list_is_accepted(tmp_path):
    path = _write(tmp_path, _with_condition({"field": "category", "op": "in", "value": ["furniture"]}))
    assert load_config(path).cohorts.rules[0].any_of[0].value == ["furniture"]


@pytest.mark.parametrize(("value", "shown"), [("1000", "'1000'"), (True, "True"), (False, "False")])
def test_ordering_op_needs_a_number_not_a_string_or_bool(tmp_path, value, shown):
    path = _write(tmp_path, _with_condition({"field": "declared_value", "op": "gt", "value": value}))
    with pytest.raises(StepError, match=rf"op 'gt' needs a number, got {shown}"):
        load_config(path)


@pytest.mark.parametrize("value", [1000, 999.5])
def test_ordering_op_with_a_number_is_accepted(tmp_path, value):
    path = _write(tmp_path, _with_condition({"field": "declared_value", "op": "gt", "value": value}))
    assert load_config(path).cohorts.rules[0].any_of[0].value == value


def test_unknown_op_is_refused(tmp_path):
    path = _write(tmp_path, _with_condition({"field": "declared_value", "op": "between", "value": 1}))
    with pytest.raises(StepError, match=r"cohorts\.rules\.0\.any_of\.0\.op"):
        load_config(path)


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


def test_guard_eta_range_must_be_increasing(tmp_path):
    raw = copy.deepcopy(BASE) | {"guard": {"min_eta_hours": 10, "max_eta_hours": 10}}
    with pytest.raises(StepError, match=r"max_eta_hours must be above min_eta_hours"):
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


def test_empty_file_names_the_missing_cohorts(tmp_path):
    with pytest.raises(StepError, match=r"cohorts: Field required"):
        load_config(_write(tmp_path, "", name="empty.yaml"))
