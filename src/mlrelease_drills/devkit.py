"""Building blocks for tests, benchmarks and drills that run the real components without the whole DAG.

A quick model trained straight from the generated parquet (no Feast, no MLflow), and a model repository
staged with chosen versions (good or faulty), ready for the local Triton server.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mlrelease.model.estimator import EtaModel
from mlrelease.model.features import FEATURES, TARGET, encode
from mlrelease.model.onnx_export import OUTPUTS
from mlrelease.registry import MODEL_NAME
from mlrelease.serving.cpu_repo import sync_cpu_repository
from mlrelease.serving.local_triton import TritonPaths
from mlrelease.serving.triton_repo import ServingConfig, build_config, write_config, write_version
from mlrelease.settings import Settings
from mlrelease.timewindow import Window
from mlrelease.yamlconfig import safe_load
from mlrelease_drills.faults import NOT_HIGH_VALUE


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def training_frame(offline_dir: Path) -> pd.DataFrame:
    """Every generated order joined to its package and to the latest user and route snapshot."""

    def read(table: str) -> pd.DataFrame:
        return pd.read_parquet(offline_dir / table).drop(columns=["date"], errors="ignore")

    def latest(table: str, key: str) -> pd.DataFrame:
        frame = read(table).sort_values("event_timestamp").drop_duplicates(key, keep="last")
        return frame.drop(columns="event_timestamp")

    frame = read("orders").merge(read("packages").drop(columns="event_timestamp"), on="package_id")
    return frame.merge(latest("routes", "route_id"), on="route_id").merge(latest("users", "user_id"), on="user_id")


def quick_model(
    offline_dir: Path, max_iter: int = 200, *, sample: float = 1.0, seed: int = 0
) -> tuple[EtaModel, np.ndarray]:
    """An EtaModel fitted on the generated orders (a `sample` share of them, drawn with `seed`), and its features."""
    frame = training_frame(offline_dir)
    if sample < 1.0:
        frame = frame.sample(frac=sample, random_state=seed)
    X = encode(frame[list(FEATURES)])
    return EtaModel(max_iter=max_iter, random_state=seed).fit(X, frame[TARGET].to_numpy()), X


def stage_repository(production_root: Path, cpu_root: Path, versions: dict[int, bytes]) -> None:
    """Publish the given versions and a config serving all of them, then mirror it for the CPU server."""
    for version, model_bytes in versions.items():
        write_version(production_root, MODEL_NAME, version, model_bytes, {"source": "devkit"})
    config = build_config(MODEL_NAME, len(FEATURES), OUTPUTS, sorted(versions), ServingConfig())
    write_config(production_root, config)
    sync_cpu_repository(production_root, cpu_root, MODEL_NAME)


# Versions staged by `start_serving_world`: a good stable, a healthy candidate, and one per fault.
GOOD, HEALTHY_CANDIDATE, NAN_ALL, NAN_LONG_TAIL, ERRORS = 1, 2, 3, 4, 5
SLOW, NAN_FEW_LONG_TAIL, LOW_CONFIDENCE_LONG_TAIL, SHIFTED_HIGH_VALUE = 6, 7, 8, 9


def standard_versions(good: bytes, retrained: bytes | None = None) -> dict[int, bytes]:
    """The good model as version 1, a retrained one of the same quality as version 2 (the good one itself when
    `retrained` is None), and faulty copies of the good one (one per drill of the gateway and rollout)."""
    from mlrelease_drills.faults import faulty_model

    return {
        GOOD: good,
        HEALTHY_CANDIDATE: good if retrained is None else retrained,
        NAN_ALL: faulty_model(good, "nan"),
        NAN_LONG_TAIL: faulty_model(good, "nan", only_where="is_remote"),
        ERRORS: faulty_model(good, "error"),
        # ~400x the model's own time per call: ~10 ms more per request through Triton, several times the call
        # latency even on a busy machine (at 100x it was sometimes only ~1.3x under the full test suite's load).
        SLOW: faulty_model(good, "slow", factor=400),
        # Remote, heavier than 10 kg, and not high-value (tier below premium, declared value under 1000):
        # NaN on a few % of long-tail requests and nowhere else.
        NAN_FEW_LONG_TAIL: faulty_model(
            good, "nan", only_where="is_remote", and_above=("weight_kg", 10.0), and_below=NOT_HIGH_VALUE
        ),
        LOW_CONFIDENCE_LONG_TAIL: faulty_model(
            good, "scale", output="confidence_score", factor=0.5, only_where="is_remote", and_below=NOT_HIGH_VALUE
        ),
        # tier is encoded 0/1/2: premium shippers (nearly all of high_value) get 1.5x the ETA.
        SHIFTED_HIGH_VALUE: faulty_model(good, "scale", output="eta_prediction", factor=1.5, and_above=("tier", 1.5)),
    }


def start_serving_world(settings: Settings, window: Window) -> str:
    """Features applied and materialized for `window`, the standard versions served by a local Triton; its URL.

    The caller owns the environment (MLRELEASE_HOME, Triton ports) and stops Triton with `local_triton.down`.
    """
    from mlrelease.model.onnx_export import to_onnx
    from mlrelease.serving import local_triton
    from mlrelease.serving.triton_client import TritonClient
    from mlrelease.steps.apply_features import apply_features
    from mlrelease.steps.materialize import materialize
    from mlrelease.steps.validate_data import validate_data

    apply_features(settings)
    # Materialize loads only validated partitions; a serving world holds a few days, too few for history rules.
    validate_data(settings, window, overlap=timedelta(hours=2), reference_days=0)
    materialize(settings, window, timedelta(hours=2))
    model, _ = quick_model(settings.offline_dir, max_iter=40)
    # the healthy candidate is retrained, not a copy: another 90 % of the same orders, another seed, as a new night's
    # model of the same quality would be (its answers differ row by row; the gates must still pass it)
    retrained, _ = quick_model(settings.offline_dir, max_iter=40, sample=0.9, seed=1)
    versions = standard_versions(to_onnx(model), to_onnx(retrained))
    stage_repository(settings.home / "model_repository", TritonPaths.from_settings(settings).cpu_repository, versions)
    local_triton.up(settings)
    url = local_triton.Ports.from_env().http_url
    client = TritonClient(url)
    client.load(MODEL_NAME)
    for version in versions:
        client.wait_ready(MODEL_NAME, version)
    client.close()  # an idle keep-alive connection would hold the server's shutdown
    return url


def write_gateway_config(path: Path, **overrides: Any) -> Path:
    """The repo's gateway config with top-level overrides (a dict value is merged into its section)."""
    import yaml

    from mlrelease.gateway.config import DEFAULT_CONFIG

    config = safe_load(DEFAULT_CONFIG.read_text(encoding="utf-8"))
    for key, value in overrides.items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


@contextmanager
def gateway_process(
    config: Path, port: int, env: dict[str, str] | None = None, workers: int = 1, *, unset: tuple[str, ...] = ()
) -> Iterator[str]:
    """`mlrelease gateway` as a real process (`workers` uvicorn workers; `env` over this process's environment, less
    the `unset` variables); yields its base URL once /healthz answers, stops it afterwards."""
    import requests

    log = config.with_name(f"gateway-{port}.log")
    binary = Path(sys.executable).with_name("mlrelease")
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(
            [str(binary), "gateway", "--config", str(config), "--port", str(port), "--workers", str(workers)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                if requests.get(f"{url}/healthz", timeout=0.5).ok:
                    break
            except requests.ConnectionError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"gateway did not answer within 60 s: {log.read_text()[-2000:]}") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=15)


@contextmanager
def redis_server(workdir: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A throwaway redis-server on a free loopback port (no persistence); yields host:port and the process.

    The process is handed out so a test can kill it to simulate an outage; it is stopped on exit either way.
    """
    import shutil

    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start within 10 s") from None
                time.sleep(0.05)
        yield f"127.0.0.1:{port}", proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


@contextmanager
def background_traffic(
    url: str,
    bodies: list[dict[str, Any]],
    api_key: str,
    rate: float,
    path: str = "/v1/predict",
    headers_per_body: list[dict[str, str]] | None = None,
) -> Iterator[Any]:
    """`mlrelease traffic` in a thread at `rate` req/s to `path` until the block ends; yields the report (filled on
    exit). `headers_per_body`: each body's own headers (an upstream's route headers)."""
    import asyncio
    import threading

    from mlrelease.gateway.traffic import TrafficReport, send

    stop = threading.Event()
    report = TrafficReport()

    def run() -> None:
        done = asyncio.run(
            send(
                url,
                bodies,
                api_key=api_key,
                rate=rate,
                duration_s=3600,
                concurrency=64,
                stop=stop,
                path=path,
                headers_per_body=headers_per_body,
            )
        )
        report.__dict__.update(done.__dict__)

    thread = threading.Thread(target=run, name="background-traffic", daemon=True)
    thread.start()
    try:
        yield report
    finally:
        stop.set()
        thread.join(timeout=30)


@contextmanager
def unreadable(path: Path) -> Iterator[None]:
    """`path` replaced by a directory for the block: every read and write of it fails (an OSError), then restored."""
    saved = path.with_name(path.name + ".drill-saved")
    os.replace(path, saved)
    path.mkdir()
    try:
        yield
    finally:
        path.rmdir()
        os.replace(saved, path)


def established_connections(pid: int, port: int) -> int:
    """Client connections process `pid` holds established on its listening `port` (0 once it is gone)."""
    import psutil

    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.NoSuchProcess:
        return 0
    return sum(c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port for c in conns)


def uvicorn_workers(master: Any) -> set[int]:
    """The uvicorn master's (a psutil.Process) live worker processes (spawn children; not its resource tracker)."""
    import psutil

    alive = set()
    for child in master.children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "spawn_main" in " ".join(child.cmdline()):
                alive.add(child.pid)
        except psutil.NoSuchProcess:
            continue
    return alive


def decision_log_writers(decisions: Path) -> set[int]:
    """Pids of the gateway workers that wrote a decision-log file (`<hour>-<host>-<pid>.jsonl`)."""
    return {int(p.stem.rsplit("-", 1)[1]) for p in decisions.glob("*.jsonl")}
