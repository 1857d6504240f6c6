"""`mlrelease triton up|down|status`: a real CPU tritonserver on 127.0.0.1 for the embedded default.

The server comes from the `nvidia-pytriton` wheel in a second environment (`.venv-triton`, built by
`make`), because it needs numpy < 2 and tritonclient 2.5x, which the application stack cannot share.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from mlrelease.errors import StepError
from mlrelease.settings import REPO_ROOT, Settings
from mlrelease.storage import write_text_atomic

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


def perf_analyzer_command(settings: Settings) -> tuple[Path, dict[str, str]]:
    """perf_analyzer and its environment: MLRELEASE_PERF_ANALYZER, else the one on PATH when talking to a
    cluster's Triton (the Triton SDK image), else the embedded toolchain's."""
    explicit = os.environ.get("MLRELEASE_PERF_ANALYZER")
    if explicit:
        return Path(explicit), dict(os.environ)
    if os.environ.get("MLRELEASE_TRITON_URL"):
        found = shutil.which("perf_analyzer")
        if found is None:
            raise StepError("perf_analyzer is not on PATH: use the perf image or set MLRELEASE_PERF_ANALYZER")
        return Path(found), dict(os.environ)
    paths = TritonPaths.from_settings(settings)
    return paths.perf_analyzer, toolchain_env(paths)


def _running_pid(paths: TritonPaths) -> int | None:
    """The recorded server's pid if that process is alive and really is a tritonserver (not a zombie, not reused)."""
    if not paths.pid_file.is_file():
        return None
    pid = int(paths.pid_file.read_text().strip())
    proc = Path(f"/proc/{pid}")
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = (proc / "cmdline").read_bytes()
    except (OSError, IndexError):
        return None
    return pid if state != "Z" and b"tritonserver" in cmdline else None


def is_ready(ports: Ports) -> bool:
    """Whether the server answers ready on its HTTP endpoint."""
    try:
        return requests.get(f"{ports.http_url}/v2/health/ready", timeout=1).status_code == 200
    except requests.RequestException:
        return False


def up(settings: Settings, timeout_s: float = 60.0) -> dict[str, Any]:
    """Start tritonserver in explicit model-control mode unless it already runs; wait until ready."""
    paths, ports = TritonPaths.from_settings(settings), Ports.from_env()
    pid = _running_pid(paths)
    if pid is not None:  # ours is running (maybe still starting): never start a second one
        deadline = time.monotonic() + timeout_s
        while not is_ready(ports):
            if time.monotonic() > deadline or _running_pid(paths) is None:
                raise StepError(
                    f"tritonserver pid {pid} runs but is not ready on {ports.http_url} "
                    f"(log {paths.log_file}); stop it with `mlrelease triton down`"
                )
            time.sleep(0.2)
        return {"status": "already running", "pid": pid, "url": ports.http_url, "serving": _reconciled(settings, ports)}
    if is_ready(ports):
        raise StepError(f"another Triton (not started by `mlrelease triton up` here) is serving on {ports.http_url}")
    if not paths.server_binary.is_file():
        raise StepError(f"tritonserver not found at {paths.server_binary}: build the toolchain with `make setup`")
    env = toolchain_env(paths)
    prepare_backends(paths)
    paths.cpu_repository.mkdir(parents=True, exist_ok=True)
    argv = [
        str(paths.server_binary),
        f"--model-repository={paths.cpu_repository}",
        f"--backend-directory={paths.backends}",
        "--model-control-mode=explicit",
        "--exit-on-error=false",  # one bad candidate must not take the stable model down with it
        "--exit-timeout-secs=5",  # on stop, idle keep-alive clients would otherwise hold it for 30 s
        "--http-address=127.0.0.1",
        f"--http-port={ports.http}",
        "--grpc-address=127.0.0.1",
        f"--grpc-port={ports.grpc}",
        "--metrics-address=127.0.0.1",
        f"--metrics-port={ports.metrics}",
    ]
    with open(paths.log_file, "ab") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    # Recorded at once, so `down` can stop it even if this call is interrupted while waiting.
    write_text_atomic(paths.pid_file, str(proc.pid))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            paths.pid_file.unlink(missing_ok=True)
            tail = paths.log_file.read_text(errors="replace").splitlines()[-5:]
            raise StepError(f"tritonserver exited with {proc.returncode}: {' | '.join(tail)}")
        if is_ready(ports):
            serving = _reconciled(settings, ports)
            return {
                "status": "started",
                "pid": proc.pid,
                "url": ports.http_url,
                "log": str(paths.log_file),
                "serving": serving,
            }
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    paths.pid_file.unlink(missing_ok=True)
    raise StepError(f"tritonserver did not become ready within {timeout_s:.0f} s (log {paths.log_file})")


def _reconciled(settings: Settings, ports: Ports) -> dict[str, Any]:
    """Load what the repository's policy declares (a restarted server serves the same versions again)."""
    from mlrelease.serving.reconcile import reconcile

    return reconcile(settings, ports.http_url)


def down(settings: Settings, timeout_s: float = 20.0) -> dict[str, Any]:
    """Stop the server started by `up` (SIGTERM, then SIGKILL after `timeout_s`)."""
    paths = TritonPaths.from_settings(settings)
    pid = _running_pid(paths)
    if pid is None:
        paths.pid_file.unlink(missing_ok=True)
        return {"status": "not running"}
    os.killpg(pid, signal.SIGTERM)  # its own session: the python-backend stubs go with it
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _running_pid(paths) is not None:
        _reap(pid)  # a server that is our own child stays a zombie (and looks alive) until reaped
        time.sleep(0.1)
    if _running_pid(paths) is not None:
        os.killpg(pid, signal.SIGKILL)
    _reap(pid)
    paths.pid_file.unlink(missing_ok=True)
    return {"status": "stopped", "pid": pid}


def _reap(pid: int) -> None:
    """Collect the exit status when the server was our own child, so no zombie is left behind."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def status(settings: Settings) -> dict[str, Any]:
    """Whether the server runs and is ready, and which models/versions it has loaded."""
    paths, ports = TritonPaths.from_settings(settings), Ports.from_env()
    pid = _running_pid(paths)
    ready = is_ready(ports)
    models: list[Any] = []
    if ready:
        models = requests.post(f"{ports.http_url}/v2/repository/index", json={}, timeout=5).json()
    return {"running": pid is not None, "pid": pid, "ready": ready, "url": ports.http_url, "models": models}
