"""Alias moves and version lookups are Registry methods, on a real MLflow registry (SQLite)."""

from __future__ import annotations

import pytest

from mlrelease.registry import CHALLENGER, CHAMPION, MODEL_NAME, Registry

pytestmark = pytest.mark.integration  # a real MLflow store: its schema migrations take a few seconds


@pytest.fixture
def registry(tmp_path) -> Registry:
    """Three registered versions of the model; 1 and 2 from the interval 2026-11-28, 3 from the next one."""
    registry = Registry(f"sqlite:///{tmp_path / 'mlflow.db'}", (tmp_path / "artifacts").as_uri())
    client = registry.client()
    client.create_registered_model(MODEL_NAME)
    for night in ("2026-11-28", "2026-11-28", "2026-11-29"):
        source = (tmp_path / "model").as_uri()
        client.create_model_version(MODEL_NAME, source, tags={"data_interval_end": night})
    return registry


def test_aliases_move_and_clear_only_from_the_version_named(registry):
    registry.set_alias(CHAMPION, 1)
    registry.set_alias(CHALLENGER, 2)
    registry.set_alias(CHAMPION, 2)  # a promotion moves the alias
    assert registry.alias_version(CHAMPION) == 2
    assert registry.clear_alias(CHALLENGER, if_version=3) is False  # not pointing there: left alone
    assert registry.alias_version(CHALLENGER) == 2
    assert registry.clear_alias(CHALLENGER, if_version=2) is True
    assert registry.alias_version(CHALLENGER) is None
    assert registry.clear_alias(CHALLENGER) is False  # already gone: a retried step does nothing
    assert registry.alias_version(CHAMPION) == 2


def test_versions_are_found_by_tag_and_a_tag_removed(registry):
    assert registry.versions_tagged("data_interval_end", "2026-11-28") == [1, 2]
    assert registry.versions_tagged("data_interval_end", "2026-11-30") == []
    registry.tag_version(3, onnx_sha256="abc")
    registry.untag_version(3, "onnx_sha256")
    assert "onnx_sha256" not in registry.version_tags(3)
    assert registry.version_tags(3)["data_interval_end"] == "2026-11-29"
