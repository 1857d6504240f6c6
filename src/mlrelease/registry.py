"""MLflow tracking and the model registry: one experiment, one registered model, aliases as the commit points."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from mlrelease.errors import StepError
from mlrelease.release_spec import process_spec
from mlrelease.settings import Settings

MODEL_NAME = process_spec().name  # the registered model; its runs go to the experiment of the same name
EXPERIMENT = MODEL_NAME
CHAMPION, CHALLENGER = "champion", "challenger"


@dataclass(frozen=True)
class Registry:
    """The MLflow backend (SQLite under MLRELEASE_HOME by default; MLFLOW_TRACKING_URI for a server)."""

    tracking_uri: str
    artifact_root: str

    @classmethod
    def from_settings(cls, settings: Settings) -> Registry:
        """The registry for this process; creates the local store's directory when needed."""
        local = settings.home / "mlflow"
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            local.mkdir(parents=True, exist_ok=True)
            uri = f"sqlite:///{local / 'mlflow.db'}"
        artifact_root = os.environ.get("MLRELEASE_MLFLOW_ARTIFACTS", (local / "artifacts").as_uri())
        return cls(uri, artifact_root)

    def client(self) -> Any:
        """An MlflowClient bound to this registry (also sets the process-wide tracking URI for fluent calls)."""
        import mlflow
        from mlflow import MlflowClient

        mlflow.set_tracking_uri(self.tracking_uri)
        mlflow.set_registry_uri(self.tracking_uri)
        return MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri)

    def experiment_id(self) -> str:
        """The experiment's id, creating it (with our artifact root) on first use."""
        client = self.client()
        found = client.get_experiment_by_name(EXPERIMENT)
        if found is not None:
            return str(found.experiment_id)
        return str(client.create_experiment(EXPERIMENT, artifact_location=self.artifact_root))

    def alias_version(self, alias: str) -> int | None:
        """The version an alias points to; None only when the model or the alias really does not exist.

        Any other registry error (database locked, tracking server down) is raised: reading it as "no
        champion" would bootstrap a new champion and unload the real one.
        """
        from mlflow.exceptions import MlflowException

        try:
            model = self.client().get_registered_model(MODEL_NAME)
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise StepError(f"model registry {self.tracking_uri} failed: {exc.message}") from None
        version = model.aliases.get(alias)
        return int(version) if version is not None else None

    def version_tags(self, version: int) -> dict[str, str]:
        """Tags of a model version; an unknown version is a StepError naming it."""
        from mlflow.exceptions import MlflowException

        try:
            return dict(self.client().get_model_version(MODEL_NAME, str(version)).tags)
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                raise StepError(f"model {MODEL_NAME} has no version {version} in {self.tracking_uri}") from None
            raise StepError(f"model registry {self.tracking_uri} failed: {exc.message}") from None

    def run_id(self, version: int) -> str:
        """The MLflow run that produced a version."""
        return str(self.client().get_model_version(MODEL_NAME, str(version)).run_id)

    def set_alias(self, alias: str, version: int) -> None:
        """Point `alias` at `version` (the commit point of train, bootstrap, promotion and rollback)."""
        self.client().set_registered_model_alias(MODEL_NAME, alias, str(version))

    def clear_alias(self, alias: str, *, if_version: int | None = None) -> bool:
        """Delete `alias` (only while it points at `if_version`, when given); whether it was deleted."""
        current = self.alias_version(alias)
        if current is None or (if_version is not None and current != if_version):
            return False
        self.client().delete_registered_model_alias(MODEL_NAME, alias)
        return True

    def versions_tagged(self, key: str, value: str) -> list[int]:
        """Every version whose tag `key` is `value`, oldest first (e.g. the ones a data interval registered)."""
        found = self.client().search_model_versions(f"name = '{MODEL_NAME}' and tags.{key} = '{value}'")
        return sorted(int(v.version) for v in found)

    def untag_version(self, version: int, key: str) -> None:
        """Remove one tag from a model version."""
        self.client().delete_model_version_tag(MODEL_NAME, str(version), key)

    def tag_version(self, version: int, **tags: str) -> None:
        """Set tags on a model version (validation status, reasons, …)."""
        client = self.client()
        for key, value in tags.items():
            client.set_model_version_tag(MODEL_NAME, str(version), key, value)

    def load_native(self, version: int) -> Any:
        """The trained estimator of a version, as logged by the train step."""
        import mlflow.sklearn

        self.client()
        return mlflow.sklearn.load_model(f"models:/{MODEL_NAME}/{version}")
