"""A new model added as a user would, with no code change: a copy of the late-delivery spec under another name and
with fewer inputs, in its own specs folder, released by its own generated DAG (`airflow dags test`) on a real Triton.

Its first night: every gate, MLflow's registry, export, serving, the benchmark's bootstrap (it becomes champion)
and its report, all under its own name, while the Airflow process itself is bound to another model.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlrelease.release_spec import nightly_dag_id
from mlrelease.serving.triton_repo import parse_pbtxt
from mlrelease.summary import TASK_ORDER
from mlrelease.timewindow import parse_timestamp, run_key
from tests.conftest import REPO, WINDOW_END, free_port

pytestmark = pytest.mark.e2e
BIN = Path(sys.executable).parent
MODEL = "route_risk"
DROPPED = ("volume_l", "congestion_index")  # the copy reads two inputs fewer than late_delivery


def copy_as_new_model(specs: Path) -> None:
    """What a user does: the shipped specs, plus a copy of late_delivery's under a new name, reading fewer inputs."""
    for shipped in ("parcel_eta", "late_delivery"):
        shutil.copytree(REPO / "models" / shipped, specs / shipped)
    text = (REPO / "models" / "late_delivery" / "release.yaml").read_text(encoding="utf-8")
    text = text.replace("name: late_delivery", f"name: {MODEL}")
    for column in DROPPED:
        assert f"    - {column}\n" in text, column
        text = text.replace(f"    - {column}\n", "")
    (specs / MODEL).mkdir()
    (specs / MODEL / "release.yaml").write_text(text, encoding="utf-8")


@pytest.fixture(scope="module")
def first_night(
    tmp_path_factory: pytest.TempPathFactory,
    clean_offline: Path,
    migrated_airflow_db: Path,  # noqa: F811
) -> Iterator[tuple[subprocess.CompletedProcess, dict[str, str], Path]]:
    """The new model's first nightly run, on its own home, specs folder and Triton."""
    home = tmp_path_factory.mktemp("new-model")
    shutil.copytree(clean_offline, home / "data" / "offline")
    copy_as_new_model(home / "models")
    (home / "airflow").mkdir()
    shutil.copy(migrated_airflow_db, home / "airflow" / "airflow.db")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__", "MLRELEASE_"))}
    env = {
        **base,
        "AIRFLOW_HOME": str(home / "airflow"),
        "AIRFLOW_CONFIG": str(REPO / "airflow.cfg"),
        "MLRELEASE_REPO": str(REPO),
        "MLRELEASE_HOME": str(home),
        "MLRELEASE_SPECS_DIR": str(home / "models"),
        "MLRELEASE_MODEL": "parcel_eta",  # the Airflow process's own: each task's step releases its DAG's model
        "MLRELEASE_TASK_RETRIES": "0",
        **{f"MLRELEASE_TRITON_{name}_PORT": str(free_port()) for name in ("HTTP", "GRPC", "METRICS")},
    }
    subprocess.run([str(BIN / "mlrelease"), "triton", "up"], env=env, check=True, capture_output=True)
    try:
        proc = subprocess.run(
            [str(BIN / "airflow"), "dags", "test", nightly_dag_id(MODEL), WINDOW_END],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        yield proc, env, home
    finally:
        subprocess.run([str(BIN / "mlrelease"), "triton", "down"], env=env, capture_output=True)


def test_a_copied_spec_is_released_by_its_own_dag_with_no_code_change(first_night) -> None:
    proc, env, home = first_night
    logs = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "state=success" in logs, logs[-4000:]
    steps = home / "artifacts" / MODEL / run_key(parse_timestamp(WINDOW_END, name="end")) / "steps"
    outcomes = {path.stem: json.loads(path.read_text()) for path in steps.glob("*.json")}
    assert {task: outcomes[task]["status"] for task in TASK_ORDER} == dict.fromkeys(TASK_ORDER, "success")
    # Nothing of it went to the Airflow process's own model.
    assert not (home / "artifacts" / "parcel_eta").exists()
    # Trained on its own inputs, registered under its own name, and champion after the benchmark's bootstrap.
    status = subprocess.run(
        [str(BIN / "mlrelease"), "rollout", "status"],
        env={**env, "MLRELEASE_MODEL": MODEL},
        capture_output=True,
        text=True,
    )
    assert status.returncode in (0, 1), status.stderr[-2000:]  # 1: Triton is down (a disagreement), when it is
    assert json.loads(status.stdout)["aliases"]["champion"] == 1
    assert outcomes["train"]["result"]["model_version"] == 1 and "AUC" in outcomes["train"]["result"]["decision"]
    # Exported with its own input width (10 - 2 columns) and the outputs its spec names, into its own folder.
    config = parse_pbtxt((home / "model_repository" / MODEL / "config.pbtxt").read_text(encoding="utf-8"))
    assert config.name == MODEL and [(i.name, list(i.dims)) for i in config.input] == [
        ("features", [10 - len(DROPPED)])
    ]
    assert [o.name for o in config.output] == ["is_late", "late_probability"]
    assert (steps.parent / "report" / "index.html").is_file()
