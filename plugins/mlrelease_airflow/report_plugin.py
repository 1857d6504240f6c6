"""Release reports in the Airflow UI: served by the API server, linked from every task of the release DAG.

Airflow loads every module in `plugins_folder` and registers the `AirflowPlugin` subclasses it finds,
so this file needs no other registration. It adds:

- a FastAPI app mounted at `/mlrelease` (`fastapi_apps`): `GET /mlrelease/reports/{dag_id}/{key}/{file}`
  serves a file of the report folder of run `key` of a model's nightly DAG `dag_id`
  (`mlrelease.report.links.report_dir`). Plugin apps are not behind Airflow's auth by themselves, so every
  request must carry the same credential as the REST API (the UI's session cookie or a bearer token) and be
  allowed to read that DAG's runs (Airflow's own check, on the path's `dag_id`).
- a global extra link "Release report" (`global_operator_extra_links`) on every task of a nightly release
  DAG (one per declared model). Airflow 3 evaluates global links
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

from mlrelease.release_spec import NAME_PATTERN, model_of_nightly_dag
from mlrelease.report.links import REPORT_PAGE, report_dir
from mlrelease.timewindow import parse_run_key, run_key

if TYPE_CHECKING:
    from airflow.models.taskinstancekey import TaskInstanceKey
    from fastapi import FastAPI

URL_PREFIX = "/mlrelease"
MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".png": "image/png"}
# A plain file name: no separators, no leading dot (so never "..", never a hidden staging folder).
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def report_path(dag_id: str, key: str) -> str:
    """A report page's path under the API server, e.g. `/mlrelease/reports/nightly_release_m/20261130T020000Z/…`."""
    return f"{URL_PREFIX}/reports/{dag_id}/{key}/{REPORT_PAGE}"


def report_link(base_url: str | None, dag_id: str, data_interval_end: datetime) -> str:
    """The report URL of DAG `dag_id`'s run with this data interval end (relative to the UI without a base URL)."""
    return f"{(base_url or '').rstrip('/')}{report_path(dag_id, run_key(data_interval_end))}"


def reported_model(dag_id: str) -> str | None:
    """The model whose reports DAG `dag_id`'s runs have: a nightly release DAG's, with a valid model name."""
    model = model_of_nightly_dag(dag_id)
    return model if model is not None and re.fullmatch(NAME_PATTERN, model) else None


def canonical_key(key: str) -> str | None:
    """`key` if it is a run key exactly as `run_key` writes it, else None (no other string reaches the disk)."""
    try:
        return key if run_key(parse_run_key(key)) == key else None
    except ValueError:
        return None


def authorize_report_read() -> Any:
    """The dependency that admits a caller allowed to read the runs of the path's `dag_id` (Airflow's own check)."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import requires_access_dag

    return requires_access_dag("GET", DagAccessEntity.RUN)  # reads dag_id from the request's path


def create_app(*, authorize: Any | None = None) -> FastAPI:
    """The report-serving app; `authorize` is a FastAPI dependency (default: Airflow's DAG-run read access)."""
    from fastapi import Depends, FastAPI, HTTPException
    from fastapi.responses import FileResponse, RedirectResponse

    from mlrelease.settings import Settings

    app = FastAPI(title="mlrelease release reports", dependencies=[Depends(authorize or authorize_report_read())])

    def checked(dag_id: str, key: str) -> str:
        """The model of a valid report address (dag_id, key), else a 404 naming what is wrong."""
        model = reported_model(dag_id)
        if model is None:
            raise HTTPException(404, f"{dag_id!r} is not a nightly release DAG (nightly_release_<model>)")
        if canonical_key(key) is None:
            raise HTTPException(404, f"{key!r} is not a run key like 20261130T020000Z")
        return model

    @app.get("/reports/{dag_id}/{key}")
    def report_index(dag_id: str, key: str) -> RedirectResponse:
        """The report page of DAG `dag_id`'s run `key`."""
        checked(dag_id, key)
        return RedirectResponse(f"{key}/{REPORT_PAGE}")

    @app.get("/reports/{dag_id}/{key}/{file}")
    def report_file(dag_id: str, key: str, file: str) -> FileResponse:
        """One file of DAG `dag_id`'s run `key`'s report folder (the page or one of its PNGs)."""
        model = checked(dag_id, key)
        suffix = file[file.rfind(".") :] if "." in file else ""
        if not FILE_NAME.fullmatch(file) or suffix not in MEDIA_TYPES:
            raise HTTPException(404, f"{file!r} is not a report file (a plain .html or .png name)")
        path = report_dir(Settings.from_env().for_model(model), key) / file
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
    """The "Release report" link on every task of a nightly release DAG: the report of the task's data interval."""

    name = "Release report"

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        """The report URL under `[api] base_url`; empty (no link) for other DAGs or an unknown run."""
        if reported_model(ti_key.dag_id) is None:
            return ""
        end = data_interval_end(ti_key.dag_id, ti_key.run_id)
        if end is None:
            return ""
        from airflow.configuration import conf

        return report_link(conf.get("api", "base_url", fallback=None), ti_key.dag_id, end)


class MlreleaseReportPlugin(AirflowPlugin):
    """Registers the report app and the "Release report" link."""

    name = "mlrelease_reports"
    global_operator_extra_links = [ReleaseReportLink()]

    @cached_property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """Built on first use: only the API server asks, so other processes never import its auth code."""
        return [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "mlrelease release reports"}]
