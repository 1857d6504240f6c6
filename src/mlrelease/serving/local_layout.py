"""Where the local tritonserver lives and how it runs: paths, ports, its command line, and its recorded processes.

A leaf of `serving/`: `local_triton` (up/down/status), `triton_supervisor` (the restarts) and `endpoint` (what
the local server serves) all read the layout from here, so none of them imports another to find a path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from mlrelease.errors import StepError
from mlrelease.settings import REPO_ROOT, Settings

SUPERVISOR_MODULE = "mlrelease.serving.triton_supervisor"  # also how `up`/`down` recognise the process in /proc

# Phases the supervisor records in supervisor.json.
STARTING, RECONCILING, SERVING, BACKOFF, FAILED, STOPPED = (
    "starting",
    "reconciling",
    "serving",
    "backoff",
    "failed",
    "stopped",
)

PY_VERSION = "3.11"


@dataclass(frozen=True)
class TritonPaths:
    """Where the toolchain environment and the server's state live."""

    venv: Path
    state: Path

    @classmethod
    def from_settings(cls, settings: Settings) -> TritonPaths:
        """Paths from MLRELEASE_TRITON_VENV (default .venv-triton in the repo) and MLRELEASE_HOME."""
        venv = Path(os.environ.get("MLRELEASE_TRITON_VENV", REPO_ROOT / ".venv-triton")).resolve()
        return cls(venv=venv, state=settings.home / "triton")

    @property
    def site_packages(self) -> Path:
        """The toolchain environment's site-packages."""
        return self.venv / "lib" / f"python{PY_VERSION}" / "site-packages"

    @property
    def server_binary(self) -> Path:
        """The tritonserver executable shipped in the nvidia-pytriton wheel."""
        return self.site_packages / "pytriton" / "tritonserver" / "bin" / "tritonserver"

    @property
    def perf_analyzer(self) -> Path:
        """The perf_analyzer executable shipped in the tritonclient 2.51 wheel."""
        return self.venv / "bin" / "perf_analyzer"

    @property
    def pid_file(self) -> Path:
        """PID of the running server."""
        return self.state / "tritonserver.pid"

    @property
    def log_file(self) -> Path:
        """The server's log."""
        return self.state / "tritonserver.log"

    @property
    def supervisor_pid_file(self) -> Path:
        """PID of the supervisor that restarts the server (`triton_supervisor`)."""
        return self.state / "supervisor.pid"

    @property
    def supervisor_state(self) -> Path:
        """The supervisor's state: phase, server pid, restarts and the last restart's reason (JSON)."""
        return self.state / "supervisor.json"

    @property
    def supervisor_log(self) -> Path:
        """The supervisor's log: every start, restart (with its reason) and reconcile."""
        return self.state / "supervisor.log"

    @property
    def control_lock(self) -> Path:
        """Held by `up` and `down`, so two of them never start two supervisors or race a stop."""
        return self.state / "control.lock"

    @property
    def cpu_repository(self) -> Path:
        """The derived CPU model repository the local server serves."""
        return self.state / "cpu_repository"

    @property
    def backends(self) -> Path:
        """Backend directory assembled for this environment's Python."""
        return self.state / "backends"


def toolchain_env(paths: TritonPaths) -> dict[str, str]:
    """Environment for tritonserver and perf_analyzer: their bundled libs, the venv's libpython and CUDA runtime."""
    if not (paths.venv / "bin" / "python").is_file():
        raise StepError(f"the Triton toolchain environment {paths.venv} is missing: build it with `make setup`")
    libdir = subprocess.run(
        [str(paths.venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    libs = [paths.site_packages / "nvidia_pytriton.libs", Path(libdir), paths.site_packages / "nvidia/cuda_runtime/lib"]
    return {
        **os.environ,
        "LD_LIBRARY_PATH": ":".join(str(p) for p in libs),
        # The python backend's stub finds numpy and onnxruntime through `python3` on PATH.
        "PATH": f"{paths.venv / 'bin'}:{os.environ.get('PATH', '')}",
    }


def prepare_backends(paths: TritonPaths) -> None:
    """Assemble backends/python: the backend library plus the stub built for this Python version."""
    source = paths.site_packages / "pytriton" / "tritonserver"
    target = paths.backends / "python"
    target.mkdir(parents=True, exist_ok=True)
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        if not (target / name).exists():
            shutil.copy2(source / "backends" / "python" / name, target / name)
    stub = target / "triton_python_backend_stub"
    if not stub.exists():
        shutil.copy2(source / "python_backend_stubs" / PY_VERSION / "triton_python_backend_stub", stub)


@dataclass(frozen=True)
class Ports:
    """The server's loopback ports (MLRELEASE_TRITON_HTTP_PORT / _GRPC_PORT / _METRICS_PORT)."""

    http: int
    grpc: int
    metrics: int

    @classmethod
    def from_env(cls) -> Ports:
        """Ports from the environment, Triton's defaults otherwise."""
        get = os.environ.get
        return cls(
            int(get("MLRELEASE_TRITON_HTTP_PORT", 8000)),
            int(get("MLRELEASE_TRITON_GRPC_PORT", 8001)),
            int(get("MLRELEASE_TRITON_METRICS_PORT", 8002)),
        )

    @property
    def http_url(self) -> str:
        """Base URL of the HTTP/REST endpoint."""
        return f"http://127.0.0.1:{self.http}"


def server_argv(paths: TritonPaths, ports: Ports) -> list[str]:
    """The tritonserver command line: explicit model control over the CPU mirror, loopback only."""
    return [
        str(paths.server_binary),
        f"--model-repository={paths.cpu_repository}",
        f"--backend-directory={paths.backends}",
        "--model-control-mode=explicit",
        "--exit-on-error=false",  # one bad candidate must not take the stable model down with it
        # As on Kubernetes: ready means the server answers; a version that failed to load (refused by its integrity
        # check) must not make the whole server unready while the other versions serve.
        "--strict-readiness=false",
        "--exit-timeout-secs=5",  # on stop, idle keep-alive clients would otherwise hold it for 30 s
        "--http-address=127.0.0.1",
        f"--http-port={ports.http}",
        "--grpc-address=127.0.0.1",
        f"--grpc-port={ports.grpc}",
        "--metrics-address=127.0.0.1",
        f"--metrics-port={ports.metrics}",
    ]


def _live_pid(pid_file: Path, marker: bytes) -> int | None:
    """The pid recorded in `pid_file` if that process is alive, not a zombie, and its command line has `marker`."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    proc = Path(f"/proc/{pid}")
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = (proc / "cmdline").read_bytes()
    except (OSError, IndexError):
        return None
    return pid if state != "Z" and marker in cmdline else None


def running_pid(paths: TritonPaths) -> int | None:
    """The recorded server's pid if that process is alive and really is a tritonserver (not a zombie, not reused)."""
    return _live_pid(paths.pid_file, b"tritonserver")


def supervisor_pid(paths: TritonPaths) -> int | None:
    """The recorded supervisor's pid if it is alive (not a zombie, not a reused pid)."""
    return _live_pid(paths.supervisor_pid_file, SUPERVISOR_MODULE.encode())


def supervisor_state(paths: TritonPaths) -> dict[str, Any]:
    """What the supervisor last recorded (empty when it never ran here)."""
    try:
        return dict(json.loads(paths.supervisor_state.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return {}


def is_ready(ports: Ports) -> bool:
    """Whether the server answers ready on its HTTP endpoint."""
    try:
        return requests.get(f"{ports.http_url}/v2/health/ready", timeout=1).status_code == 200
    except requests.RequestException:
        return False


def triton_url() -> str:
    """MLRELEASE_TRITON_URL (a cluster's Triton service), else the local server's HTTP endpoint."""
    return os.environ.get("MLRELEASE_TRITON_URL") or Ports.from_env().http_url
