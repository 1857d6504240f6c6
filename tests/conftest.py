"""Shared fixtures: isolated MLRELEASE_HOME, generated data, a real redis-server, a real HTTP receiver."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import pytest

# The model the tests' processes release unless a test names another (set before any mlrelease model module loads).
os.environ.setdefault("MLRELEASE_MODEL", "parcel_eta")

from mlrelease_drills.devkit import free_port, redis_server  # noqa: F401 - free_port is re-exported for the test modules

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "plugins"))  # as Airflow does for plugins_folder
# Airflow reads its config at import: point it at the repo's airflow.cfg and a throwaway home.
os.environ.setdefault("MLRELEASE_REPO", str(REPO))
os.environ.setdefault("AIRFLOW_CONFIG", str(REPO / "airflow.cfg"))
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="mlrelease-airflow-"))

# The demo window used throughout: the nightly run whose data interval is [11-28 02:00, 11-29 02:00).
WINDOW_START = "2026-11-28T02:00:00+00:00"
WINDOW_END = "2026-11-29T02:00:00+00:00"
RUN_KEY = "20261129T020000Z"  # its artifacts folder
HISTORY = (date(2026, 11, 20), date(2026, 11, 29))
ROWS_PER_DAY = 600


@pytest.fixture(scope="session")
def clean_offline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Clean synthetic history (generated once per session); copy it before changing it."""
    from mlrelease.data.generate import generate

    out = tmp_path_factory.mktemp("clean") / "offline"
    generate(out, *HISTORY, rows_per_day=ROWS_PER_DAY, seed=11)
    return out


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty MLRELEASE_HOME for one test, with the XCom path inside it."""
    monkeypatch.setenv("MLRELEASE_HOME", str(tmp_path))
    monkeypatch.setenv("MLRELEASE_XCOM_PATH", str(tmp_path / "xcom" / "return.json"))
    monkeypatch.delenv("MLRELEASE_ONLINE_STORE", raising=False)
    monkeypatch.delenv("FEAST_FS_YAML_FILE_PATH", raising=False)  # Feast's own choice of YAML (production's)
    return tmp_path


@pytest.fixture
def home_with_data(home: Path, clean_offline: Path) -> Path:
    """MLRELEASE_HOME holding a copy of the clean history."""
    shutil.copytree(clean_offline, home / "data" / "offline")
    return home


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server on a free loopback port, stopped at the end of the session."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed (apt-get install redis-server); the Redis tests need it")
    with redis_server(tmp_path_factory.mktemp("redis")) as (address, _):
        yield address


AIRFLOW = str(Path(sys.executable).parent / "airflow")
NIGHTLY_DAG = "nightly_release_parcel_eta"


@pytest.fixture(scope="session")
def migrated_airflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An Airflow metadata DB migrated once per session; each test runs on its own copy."""
    airflow_home = tmp_path_factory.mktemp("airflow-template")
    env = {**os.environ, "AIRFLOW_HOME": str(airflow_home), "AIRFLOW_CONFIG": str(REPO / "airflow.cfg")}
    subprocess.run(
        [AIRFLOW, "db", "migrate"], env={**env, "MLRELEASE_REPO": str(REPO)}, check=True, capture_output=True
    )
    return airflow_home / "airflow.db"


def run_nightly_dag(
    home: Path, db: Path, webhook: str, *, mark_success: str | None = None, conf: dict | None = None
) -> tuple[subprocess.CompletedProcess, dict]:
    """`airflow dags test nightly_release_parcel_eta` for the demo interval, on a copy of `db`, with this process's
    environment (its Feast YAML and engine included); returns the process and the step outcomes.

    :param mark_success: a regex of task ids Airflow marks successful instead of running (`--mark-success-pattern`).
    :param conf: the run's params, as the trigger form would pass them (`--conf`).
    """
    airflow_home = home / "airflow"
    airflow_home.mkdir()
    shutil.copy(db, airflow_home / "airflow.db")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW_CONFIG": str(REPO / "airflow.cfg"),
        "MLRELEASE_REPO": str(REPO),
        "MLRELEASE_HOME": str(home),
        "MLRELEASE_TASK_RETRIES": "0",
        "AIRFLOW_CONN_MLRELEASE_ALERTS": json.dumps({"conn_type": "http", "extra": {"url": webhook}}),
    }
    env.pop("MLRELEASE_XCOM_PATH", None)
    extra = ["--mark-success-pattern", mark_success] if mark_success else []
    extra += ["--conf", json.dumps(conf)] if conf else []
    proc = subprocess.run(
        [AIRFLOW, "dags", "test", NIGHTLY_DAG, WINDOW_END, *extra], env=env, capture_output=True, text=True, timeout=900
    )
    steps_dir = home / "artifacts" / "parcel_eta" / RUN_KEY / "steps"
    outcomes = {p.stem: json.loads(p.read_text()) for p in steps_dir.glob("*.json")} if steps_dir.is_dir() else {}
    return proc, outcomes


def redis_digest(address: str) -> str:
    """A digest of a Redis: every key with its serialized value, in key order."""
    import hashlib

    import redis

    client = redis.Redis.from_url(f"redis://{address}")
    digest = hashlib.sha256()
    for key in sorted(client.keys("*")):
        digest.update(key + (client.dump(key) or b""))
    return digest.hexdigest()


class Receiver:
    """A real HTTP server on loopback that records every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        received = self.bodies

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length", 0))
                received.append({"path": self.path, "body": json.loads(self.rfile.read(length))})
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/alerts"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A webhook receiver for alert tests."""
    rec = Receiver()
    yield rec
    rec.close()


# The longest modules first (measured on the 2-core box). `make test` runs the files on parallel workers
# (pytest-xdist, --dist loadfile, no reordering): a worker takes the next file when it finishes one, so a long
# file must not be the last one started. Unlisted files keep their place after these.
LONGEST_FIRST = (
    "tests/e2e/test_airflow_live.py",  # two whole nights on a real scheduler, the second with a staged rollout
    "tests/integration/test_rollout.py",
    "tests/integration/test_spark_engine.py",  # a local Spark cluster: the data half twice, a corrupted night twice
    "tests/integration/test_model_path.py",
    "tests/integration/test_second_model.py",
    "tests/e2e/test_new_model.py",
    "tests/e2e/test_nightly_release_dag.py",
    "tests/integration/test_gateway.py",
    "tests/integration/test_model_integrity.py",
    "tests/integration/test_data_gates.py",
    "tests/integration/test_triton_supervisor.py",
    "tests/integration/test_served_quality.py",
    "tests/integration/test_feast_steps.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the longest modules first (a stable sort: the order inside a module is kept)."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}

    def key(item: pytest.Item) -> int:
        return rank.get(item.nodeid.split("::", 1)[0], len(rank))

    items.sort(key=key)
