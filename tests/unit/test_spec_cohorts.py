"""A model's cohorts live in its release spec: ordered rules over its keys and input columns, each mistake named."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlrelease.errors import StepError
from mlrelease.release_spec import SPECS_DIR, load_spec

PARCEL = yaml.safe_load((SPECS_DIR / "parcel_eta" / "release.yaml").read_text(encoding="utf-8"))


def _spec_with(tmp_path: Path, cohorts: dict[str, Any]) -> Path:
    raw = copy.deepcopy(PARCEL)
    raw["cohorts"] = cohorts
    path = tmp_path / "parcel_eta" / "release.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def _rules(*rules: dict[str, Any]) -> dict[str, Any]:
    return {"bucket_key": "user_id", "rules": list(rules)}


def _special(condition: dict[str, Any]) -> dict[str, Any]:
    return _rules({"name": "special", "any_of": [condition]}, {"name": "core"})


def _refused(tmp_path: Path, cohorts: dict[str, Any], pattern: str) -> None:
    path = _spec_with(tmp_path, cohorts)
    with pytest.raises(StepError, match=pattern) as info:
        load_spec(path)
    assert str(info.value).startswith(f"release spec {path} is invalid: ") and "\n" not in str(info.value)


PREMIUM = {"field": "tier", "op": "eq", "value": "premium"}


def test_the_parcel_spec_declares_value_density_cohorts_in_order():
    spec = load_spec(SPECS_DIR / "parcel_eta" / "release.yaml")
    assert spec.cohorts.names == ("high_value", "long_tail", "core") and spec.cohorts.bucket_key == "user_id"
    assert spec.cohorts.fields() == {"tier", "declared_value", "is_remote", "is_bulky", "category"}


def test_a_rule_on_a_field_the_model_does_not_have_is_named(tmp_path):
    _refused(tmp_path, _special({"field": "shoe_size", "op": "eq", "value": 42}), r"unknown fields \['shoe_size'\]")


def test_the_bucket_key_must_be_an_entity_key(tmp_path):
    _refused(tmp_path, {**_rules({"name": "core"}), "bucket_key": "tier"}, r"bucket_key 'tier' is not one of the")


@pytest.mark.parametrize(
    ("rules", "pattern"),
    [
        (({"name": "core"}, {"name": "high_value", "any_of": [PREMIUM]}), r"catch-all.*rules without: \['core'\]"),
        (
            ({"name": "high_value", "any_of": [PREMIUM]}, {"name": "other"}, {"name": "core"}),
            r"catch-all.*rules without: \['other', 'core'\]",
        ),
        (({"name": "high_value", "any_of": [PREMIUM]},), r"catch-all.*rules without: \[\]"),
        (({"name": "core", "any_of": [PREMIUM]}, {"name": "core"}), r"names must be unique, got \['core', 'core'\]"),
    ],
    ids=["catch-all-first", "two-catch-alls", "no-catch-all", "duplicate"],
)
def test_the_rules_need_one_catch_all_last_and_unique_names(tmp_path, rules, pattern):
    _refused(tmp_path, _rules(*rules), pattern)


@pytest.mark.parametrize("op", ["in", "not_in"])
def test_membership_op_needs_a_list(tmp_path, op):
    condition = {"field": "category", "op": op, "value": "furniture"}
    _refused(tmp_path, _special(condition), rf"op '{op}' needs a list value, got 'furniture'")
    listed = load_spec(_spec_with(tmp_path, _special({**condition, "value": ["furniture"]})))
    assert listed.cohorts.rules[0].any_of[0].value == ["furniture"]


@pytest.mark.parametrize(("value", "shown"), [("1000", "'1000'"), (True, "True"), (False, "False")])
def test_ordering_op_needs_a_number_not_a_string_or_bool(tmp_path, value, shown):
    _refused(
        tmp_path, _special({"field": "declared_value", "op": "gt", "value": value}), f"needs a number, got {shown}"
    )


@pytest.mark.parametrize("value", [1000, 999.5])
def test_ordering_op_with_a_number_is_accepted(tmp_path, value):
    spec = load_spec(_spec_with(tmp_path, _special({"field": "declared_value", "op": "gt", "value": value})))
    assert spec.cohorts.rules[0].any_of[0].value == value


def test_unknown_op_is_refused(tmp_path):
    _refused(tmp_path, _special({"field": "declared_value", "op": "between", "value": 1}), r"cohorts\.rules\.0\.any_of")
