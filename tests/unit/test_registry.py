"""Registry reads: only a missing model or alias means "none"; any other MLflow error must stop the step."""

from __future__ import annotations

import pytest
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST, TEMPORARILY_UNAVAILABLE

from mlrelease.errors import StepError
from mlrelease.registry import Registry


class _Client:
    def __init__(self, error: MlflowException | None = None, aliases: dict | None = None):
        self.error, self.aliases = error, aliases or {}

    def get_registered_model(self, name):
        if self.error:
            raise self.error
        return type("RegisteredModel", (), {"aliases": self.aliases})()

    def get_model_version(self, name, version):
        raise self.error


def _registry(monkeypatch, client: _Client) -> Registry:
    registry = Registry("sqlite:////nonexistent/mlflow.db", "file:///nonexistent")
    monkeypatch.setattr(Registry, "client", lambda self: client)
    return registry


def test_alias_lookup(monkeypatch):
    assert _registry(monkeypatch, _Client(aliases={"champion": 3})).alias_version("champion") == 3
    assert _registry(monkeypatch, _Client(aliases={"champion": 3})).alias_version("challenger") is None
    missing = MlflowException("no model", error_code=RESOURCE_DOES_NOT_EXIST)
    assert _registry(monkeypatch, _Client(missing)).alias_version("champion") is None


def test_an_unavailable_registry_is_not_read_as_no_champion(monkeypatch):
    locked = MlflowException("database is locked", error_code=TEMPORARILY_UNAVAILABLE)
    with pytest.raises(StepError, match="model registry .* failed: database is locked"):
        _registry(monkeypatch, _Client(locked)).alias_version("champion")
    with pytest.raises(StepError, match="failed: database is locked"):
        _registry(monkeypatch, _Client(locked)).version_tags(1)
    missing = MlflowException("no version", error_code=RESOURCE_DOES_NOT_EXIST)
    with pytest.raises(StepError, match="has no version 1"):
        _registry(monkeypatch, _Client(missing)).version_tags(1)
