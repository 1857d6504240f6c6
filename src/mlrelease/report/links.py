"""Where a run's release report lives and the link that alerts and the Airflow UI give to it."""

from __future__ import annotations

from pathlib import Path

from mlrelease.release_spec import nightly_dag_id
from mlrelease.settings import Settings

REPORT_FOLDER = "report"
REPORT_PAGE = "index.html"


def report_dir(settings: Settings, key: str) -> Path:
    """The folder holding run `key`'s report page and its PNGs: `$MLRELEASE_HOME/artifacts/<model>/<key>/report`."""
    return settings.artifacts_dir / key / REPORT_FOLDER


def report_url(settings: Settings, key: str, base_url: str | None = None) -> str:
    """The link to run `key`'s report: under `base_url` (default: the settings' MLRELEASE_REPORT_BASE_URL) when set,
    else a file:// URL.

    Served, the path names the model's nightly DAG (`<base>/nightly_release_<model>/<key>/index.html`): the
    API server's report app grants it to whoever may read that DAG's runs.
    """
    base = base_url if base_url is not None else settings.report_base_url
    if base:
        return f"{base.rstrip('/')}/{nightly_dag_id(settings.release_model)}/{key}/{REPORT_PAGE}"
    return (report_dir(settings, key) / REPORT_PAGE).as_uri()
