"""Opening the Feast repository with the settings of this process."""

from __future__ import annotations

import logging
import os
import warnings
from typing import TYPE_CHECKING

from mlrelease.errors import StepError
from mlrelease.settings import Settings

if TYPE_CHECKING:
    from feast import FeatureStore


def quiet_feast_logs() -> None:
    """Silence dask/pandas deprecation chatter so a step's output stays readable."""
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    logging.getLogger("feast").setLevel(logging.WARNING)


def export_feast_env(settings: Settings) -> None:
    """Put the variables the Feast YAML and repo files expand into this process's environment."""
    os.environ.update(settings.feast_env())


def open_store(settings: Settings) -> FeatureStore:
    """A FeatureStore for the repo and online store chosen in `settings`."""
    quiet_feast_logs()
    export_feast_env(settings)
    from feast import FeatureStore

    if not settings.feature_store_yaml.is_file():
        raise StepError(f"feature repo config {settings.feature_store_yaml} does not exist")
    try:
        return FeatureStore(repo_path=str(settings.feature_repo), fs_yaml_file=settings.feature_store_yaml)
    except Exception as exc:  # Feast raises many types for a bad config; name the file either way.
        raise StepError(f"feature repo config {settings.feature_store_yaml} is invalid: {exc}") from None
