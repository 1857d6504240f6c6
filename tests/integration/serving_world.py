"""A real serving world for gateway tests: Feast online store filled, a real Triton with good and faulty versions.

Versions (see mlrelease_drills.devkit): 1 good (stable), 2 good (a healthy candidate), 3 NaN on every row,
4 NaN on remote routes only (the long tail), 5 refused at inference (an error on every request).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mlrelease.gateway.auth import add_client
from mlrelease.serving import local_triton
from mlrelease.serving.triton_client import TritonClient
from mlrelease.settings import Settings
from mlrelease.timewindow import Window
from mlrelease_drills import devkit
from tests.conftest import WINDOW_END, WINDOW_START, free_port

WINDOW = Window.parse(WINDOW_START, WINDOW_END)
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
        base = {
            "replay_as_of": WINDOW_END,
            "triton_url": self.triton_url,
            "routing": {"state_url": f"file://{self.home / name / 'routing.json'}"},
            "auth": {"keys_file": str(self.home / "api_keys.yaml")},
        }
        for key, value in overrides.items():
            base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value  # type: ignore[dict-item]
        return devkit.write_gateway_config(self.home / name / "gateway.yaml", **base)

    def routing(self, config: Path, *args: str) -> dict[str, Any]:
        """Run `mlrelease routing …` against a config; returns its JSON output."""
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
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)  # mlflow.set_tracking_uri in an earlier test exports it
    for name in ("HTTP", "GRPC", "METRICS"):
        mp.setenv(f"MLRELEASE_TRITON_{name}_PORT", str(free_port()))
    mp.chdir(home)
    settings = Settings.from_env()
    try:
        url = devkit.start_serving_world(settings, WINDOW)
        key = add_client(home / "api_keys.yaml", "tests")
        yield World(settings=settings, home=home, triton_url=url, api_key=key)
    finally:
        local_triton.down(settings)


@contextmanager
def gateway_process(config: Path, *, env: dict[str, str] | None = None, workers: int = 1) -> Iterator[str]:
    """`mlrelease gateway` as a real process on a free port (`workers` uvicorn worker processes)."""
    with devkit.gateway_process(config, free_port(), env, workers) as url:
        yield url
