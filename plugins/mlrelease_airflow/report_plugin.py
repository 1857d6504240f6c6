"""Release reports in the Airflow UI: served by the API server, linked from every task of the release DAG.

Airflow loads every module in `plugins_folder` and registers the `AirflowPlugin` subclasses it finds,
so this file needs no other registration. It adds:

- a FastAPI app mounted at `/mlrelease` (`fastapi_apps`): `GET /mlrelease/reports/{key}/{file}` serves a
  file of run `key`'s report folder (`mlrelease.report.links.report_dir`). Plugin apps are not behind
  Airflow's auth by themselves, so every request must carry the same credential as the REST API (the
  UI's session cookie or a bearer token) and be allowed to read the release DAG's runs.
- a global extra link "Release report" (`global_operator_extra_links`). Airflow 3 evaluates global links
  in the API server when the UI asks for a task's links (operator-level links, in contrast, are
  computed on the worker and stored as XCom), so the link can look up the run's data interval there.
"""

from __future__ import annotations

import re
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.plugins_manager import AirflowPlugin
from airflow.sdk import BaseOperatorLink

from mlrelease.report.links import REPORT_PAGE, report_dir
from mlrelease.timewindow import parse_run_key, run_key

if TYPE_CHECKING:
    from airflow.models.taskinstancekey import TaskInstanceKey
    from fastapi import FastAPI

URL_PREFIX = "/mlrelease"
REPORT_DAG_ID = "nightly_release"  # the DAG whose runs have reports (a report per data interval)
MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".png": "image/png"}
# A plain file name: no separators, no leading dot (so never "..", never a hidden staging folder).
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def report_path(key: str) -> str:
    """The report page's path under the API server, e.g. `/mlrelease/reports/20261130T020000Z/index.html`."""
    return f"{URL_PREFIX}/reports/{key}/{REPORT_PAGE}"


def report_link(base_url: str | None, data_interval_end: datetime) -> str:
    """The report URL of the run with this data interval end (relative to the UI when no base URL is set)."""
    return f"{(base_url or '').rstrip('/')}{report_path(run_key(data_interval_end))}"


def canonical_key(key: str) -> str | None:
    """`key` if it is a run key exactly as `run_key` writes it, else None (no other string reaches the disk)."""
    try:
        return key if run_key(parse_run_key(key)) == key else None
    except ValueError:
        return None


def authorize_report_read() -> Any:
    """The dependency that admits a caller allowed to read the release DAG's runs (Airflow's own check)."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import requires_access_dag

    return requires_access_dag("GET", DagAccessEntity.RUN, param_dag_id=REPORT_DAG_ID)


def create_app(*, authorize: Any | None = None) -> FastAPI:
    """The report-serving app; `authorize` is a FastAPI dependency (default: Airflow's DAG-run read access)."""
    from fastapi import Depends, FastAPI, HTTPException
    from fastapi.responses import FileResponse, RedirectResponse

    from mlrelease.settings import Settings

    app = FastAPI(title="mlrelease release reports", dependencies=[Depends(authorize or authorize_report_read())])

    @app.get("/reports/{key}")
    def report_index(key: str) -> RedirectResponse:
        """The report page of run `key`."""
        if canonical_key(key) is None:
            raise HTTPException(404, f"{key!r} is not a run key like 20261130T020000Z")
        return RedirectResponse(f"{key}/{REPORT_PAGE}")

    @app.get("/reports/{key}/{file}")
    def report_file(key: str, file: str) -> FileResponse:
        """One file of run `key`'s report folder (the page or one of its PNGs)."""
        if canonical_key(key) is None:
            raise HTTPException(404, f"{key!r} is not a run key like 20261130T020000Z")
        suffix = file[file.rfind(".") :] if "." in file else ""
        if not FILE_NAME.fullmatch(file) or suffix not in MEDIA_TYPES:
            raise HTTPException(404, f"{file!r} is not a report file (a plain .html or .png name)")
        path = report_dir(Settings.from_env(), key) / file
        if not path.is_file():
            what = "has no report yet (its report task has not run)" if file == REPORT_PAGE else f"has no {file}"
            raise HTTPException(404, f"run {key} {what}")
        # no-cache: a rerun replaces the report under the same URL
        return FileResponse(path, media_type=MEDIA_TYPES[suffix], headers={"Cache-Control": "no-cache"})

    return app


def data_interval_end(dag_id: str, run_id: str) -> datetime | None:
    """The data interval end of a DAG run, from the metadata database (the API server has access)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return session.scalar(select(DagRun.data_interval_end).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))


class ReleaseReportLink(BaseOperatorLink):
    """The "Release report" link on every task of the release DAG: the report of the task's data interval."""

    name = "Release report"

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        """The report URL under `[api] base_url`; empty (no link) for other DAGs or an unknown run."""
        if ti_key.dag_id != REPORT_DAG_ID:
            return ""
        end = data_interval_end(ti_key.dag_id, ti_key.run_id)
        if end is None:
            return ""
        from airflow.configuration import conf

        return report_link(conf.get("api", "base_url", fallback=None), end)


class MlreleaseReportPlugin(AirflowPlugin):
    """Registers the report app and the "Release report" link."""

    name = "mlrelease_reports"
    global_operator_extra_links = [ReleaseReportLink()]

    @cached_property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """Built on first use: only the API server asks, so other processes never import its auth code."""
        return [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "mlrelease release reports"}]
