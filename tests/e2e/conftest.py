"""Fixtures of the whole-DAG tests: an Airflow metadata DB migrated once per session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

AIRFLOW = str(Path(sys.executable).parent / "airflow")


@pytest.fixture(scope="session")
def migrated_airflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An Airflow metadata DB migrated once per session; each test runs on its own copy."""
    home = tmp_path_factory.mktemp("airflow-template")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW_CONFIG": str(REPO / "airflow.cfg"),
        "MLRELEASE_REPO": str(REPO),
    }
    subprocess.run([AIRFLOW, "db", "migrate"], env=env, check=True, capture_output=True)
    return home / "airflow.db"
