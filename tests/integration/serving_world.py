"""A real serving world for gateway tests: Feast online store filled, a real Triton with good and faulty versions.

Versions staged: 1 good (stable), 2 good (a healthy candidate), 3 NaN on every row, 4 NaN on remote
routes only (the long tail), 5 refused at inference (an error on every request).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from mlrelease.devkit import quick_model, stage_repository
from mlrelease.gateway.auth import add_client
from mlrelease.gateway.config import DEFAULT_CONFIG
from mlrelease.model.onnx_export import to_onnx
from mlrelease.registry import MODEL_NAME
from mlrelease.serving import local_triton
from mlrelease.serving.faults import faulty_model
from mlrelease.serving.triton_client import TritonClient
from mlrelease.settings import Settings
from mlrelease.steps.apply_features import apply_features
from mlrelease.steps.materialize import materialize
from mlrelease.timewindow import Window
from tests.conftest import REPO, WINDOW_END, WINDOW_START, free_port

WINDOW = Window.parse(WINDOW_START, WINDOW_END)
GOOD, HEALTHY_CANDIDATE, NAN_ALL, NAN_LONG_TAIL, ERRORS = 1, 2, 3, 4, 5
MLRELEASE = str(Path(sys.executable).with_name("mlrelease"))


@dataclass
class World:
    """Handles on a running serving world."""

    settings: Settings
    home: Path
    triton_url: str
    api_key: str

    def client(self) -> TritonClient:
        """A Triton client for direct checks."""
        return TritonClient(self.triton_url)

    def config_file(self, name: str, **overrides: Any) -> Path:
        """A gateway config: the repo default, replaying at the window end, with nested overrides merged in."""
        config = yaml.safe_load(DEFAULT_CONFIG.read_text())
        config.update(replay_as_of=WINDOW_END, triton_url=self.triton_url)
        config["routing"]["state_url"] = f"file://{self.home / name / 'routing.json'}"
        config["auth"]["keys_file"] = str(self.home / "api_keys.yaml")
        for key, value in overrides.items():
            if isinstance(value, dict):
                config[key] = {**config.get(key, {}), **value}
            else:
                config[key] = value
        path = self.home / name / "gateway.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config))
        return path

    def routing(self, config: Path, *args: str) -> dict[str, Any]:
        """Run `mlrelease routing …` against a config; returns its JSON output."""
        import json

        proc = subprocess.run(
            [MLRELEASE, "routing", *args, "--config", str(config)], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise AssertionError(f"routing {args} failed: {proc.stderr}")
        return dict(json.loads(proc.stdout))


@contextmanager
def serving_world(root: Path, offline: Path, mp: pytest.MonkeyPatch) -> Iterator[World]:
    """Build the world under `root` (env set through `mp`), tear Triton down afterwards."""
    home = root / "home"
    shutil.copytree(offline, home / "data" / "offline")
    mp.setenv("MLRELEASE_HOME", str(home))
    mp.setenv("MLRELEASE_XCOM_PATH", str(home / "xcom.json"))
    mp.delenv("MLRELEASE_TRITON_URL", raising=False)
    for name in ("HTTP", "GRPC", "METRICS"):
        mp.setenv(f"MLRELEASE_TRITON_{name}_PORT", str(free_port()))
    mp.chdir(home)
    settings = Settings.from_env()
    apply_features(settings)
    materialize(settings, WINDOW, timedelta(hours=2))
    model, _ = quick_model(home / "data" / "offline", max_iter=40)
    good = to_onnx(model)
    versions = {
        GOOD: good,
        HEALTHY_CANDIDATE: good,
        NAN_ALL: faulty_model(good, "nan"),
        NAN_LONG_TAIL: faulty_model(good, "nan", only_where="is_remote"),
        ERRORS: faulty_model(good, "error"),
    }
    paths = local_triton.TritonPaths.from_settings(settings)
    stage_repository(home / "model_repository", paths.cpu_repository, versions)
    local_triton.up(settings)
    try:
        url = local_triton.Ports.from_env().http_url
        client = TritonClient(url)
        client.load(MODEL_NAME)
        for version in versions:
            client.wait_ready(MODEL_NAME, version)
        client.close()
        key = add_client(home / "api_keys.yaml", "tests")
        yield World(settings=settings, home=home, triton_url=url, api_key=key)
    finally:
        local_triton.down(settings)


@contextmanager
def gateway_process(config: Path, *, port: int | None = None, env: dict[str, str] | None = None) -> Iterator[str]:
    """`mlrelease gateway` as a real process (uvicorn); yields its base URL once it answers /healthz."""
    port = port or free_port()
    log = config.with_name(f"gateway-{port}.log")
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [MLRELEASE, "gateway", "--config", str(config), "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, **(env or {})},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"gateway exited with {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                if requests.get(f"{url}/healthz", timeout=0.5).ok:
                    break
            except requests.ConnectionError:
                time.sleep(0.1)
        else:
            raise AssertionError(f"gateway did not answer within 60 s: {log.read_text()[-2000:]}")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=15)


@contextmanager
def own_redis(workdir: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A redis-server this test may kill (the session one must stay up); yields host:port and the process."""
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
    try:
        yield f"127.0.0.1:{port}", proc
    finally:
        proc.kill()
        proc.wait(timeout=10)
