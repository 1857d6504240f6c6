"""`mlrelease triton up|down|status` under the supervisor, with a stand-in tritonserver (seconds, not a real Triton).

The stand-in is a small HTTP server installed where the toolchain's tritonserver would be, so everything
else is real: the detached supervisor process, its pid and state files, the restarts and `down`. That a real
Triton gets its declared versions back after `kill -9` is in test_gateway.py (it reuses that module's world).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import requests

from mlrelease.errors import StepError
from mlrelease.serving import local_triton
from mlrelease.serving.local_triton import TritonPaths, running_pid, supervisor_pid
from mlrelease.serving.triton_repo import ServingConfig, build_config, model_repository, write_config, write_version
from mlrelease.settings import Settings
from tests.conftest import free_port

pytestmark = pytest.mark.integration

FAKE_SERVER = textwrap.dedent(
    """\
    #!{python}
    # A stand-in tritonserver: answers the health endpoints and an empty repository index on --http-port,
    # with one "python-backend stub" in its process group that names its shared-memory region (as the real ones do).
    import http.server, os, signal, subprocess, sys
    if os.environ.get("FAKE_TRITON_FAIL"):
        print("error: fake start-up failure", flush=True)
        sys.exit(1)
    region = f"triton_python_backend_shm_region_fake-{{os.getpid()}}"
    open(f"/dev/shm/{{region}}", "wb").close()
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", region])
    def stop(*_):  # a server stopped normally frees its stubs' memory itself
        os.unlink(f"/dev/shm/{{region}}")
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    port = int(next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--http-port=")))

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._answer(b"")

        def do_POST(self) -> None:
            self._answer(b"[]")

        def log_message(self, *args) -> None:
            pass

    print("fake tritonserver ready on", port, flush=True)
    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
    """
)


def _fake_toolchain(venv: Path) -> None:
    """A toolchain environment whose tritonserver is the stand-in (and dummy python-backend files)."""
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    paths = TritonPaths(venv=venv, state=venv / "unused")
    server = paths.server_binary
    server.parent.mkdir(parents=True)
    server.write_text(FAKE_SERVER.format(python=sys.executable), encoding="utf-8")
    server.chmod(0o755)
    root = server.parent.parent
    for name in ("backends/python/libtriton_python.so", "backends/python/triton_python_backend_utils.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"")
    stub = root / "python_backend_stubs" / local_triton.PY_VERSION / "triton_python_backend_stub"
    stub.parent.mkdir(parents=True)
    stub.write_bytes(b"")


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    """An empty MLRELEASE_HOME (nothing declared), the stand-in toolchain, free ports; `down` afterwards."""
    _fake_toolchain(tmp_path / "venv")
    monkeypatch.setenv("MLRELEASE_TRITON_VENV", str(tmp_path / "venv"))
    monkeypatch.setenv("MLRELEASE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLRELEASE_TRITON_URL", raising=False)
    for name in ("HTTP", "GRPC", "METRICS"):
        monkeypatch.setenv(f"MLRELEASE_TRITON_{name}_PORT", str(free_port()))
    built = Settings.from_env()
    try:
        yield built
    finally:
        local_triton.down(built)


def _until(check: Callable[[], object], seconds: float, what: str) -> object:
    deadline = time.monotonic() + seconds
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what} within {seconds:.0f} s"
        time.sleep(0.1)
    return value


def _stub_of(server: int) -> int | None:
    """The stand-in stub process in the server's process group."""
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid != server and os.getpgid(proc.pid) == server:
                return proc.pid
        except (ProcessLookupError, psutil.Error):
            continue
    return None


def _supervisors(home: Path) -> list[int]:
    """Live supervisor processes for this MLRELEASE_HOME (found in /proc, not through the pid file)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"mlrelease.serving.triton_supervisor" in cmdline and f"MLRELEASE_HOME={home}\0".encode() in environ:
            if state != "Z":
                found.append(int(proc.name))
    return found


def test_up_is_idempotent_and_a_killed_server_is_restarted_by_itself(settings):
    paths = TritonPaths.from_settings(settings)
    started = local_triton.up(settings)
    assert started["status"] == "started" and started["serving"] == {}
    supervisor = started["supervisor"]["pid"]
    again = local_triton.up(settings)
    assert again["status"] == "already running"
    assert (again["pid"], again["supervisor"]["pid"]) == (started["pid"], supervisor)
    assert _supervisors(settings.home) == [supervisor]

    region = Path(f"/dev/shm/triton_python_backend_shm_region_fake-{started['pid']}")
    stub = _until(lambda: _stub_of(started["pid"]), 10, "the stub")
    assert region.exists()
    os.kill(started["pid"], signal.SIGKILL)
    restarted = _until(lambda: running_pid(paths) not in (None, started["pid"]), 30, "a new server")
    assert restarted
    assert not region.exists()  # the killed server's stub and its shared memory go
    _until(lambda: not psutil.pid_exists(stub), 10, "the stub gone")
    _until(lambda: local_triton.status(settings)["supervisor"]["phase"] == "serving", 30, "serving again")
    status = local_triton.status(settings)
    assert status["ready"]
    assert status["pid"] != started["pid"] and status["supervisor"]["pid"] == supervisor
    assert status["supervisor"]["restarts"] == 1 and status["supervisor"]["phase"] == "serving"
    assert status["supervisor"]["last_restart_reason"] == f"tritonserver pid {started['pid']} killed by SIGKILL"
    assert "killed by SIGKILL: restart 1" in paths.supervisor_log.read_text()


def test_down_stops_the_supervisor_before_the_server(settings):
    paths = TritonPaths.from_settings(settings)
    started = local_triton.up(settings)
    stopped = local_triton.down(settings)
    assert stopped == {"status": "stopped", "pid": started["pid"], "supervisor": started["supervisor"]["pid"]}
    time.sleep(1.5)  # longer than the first restart's back-off: nothing may bring it back
    assert running_pid(paths) is None and supervisor_pid(paths) is None and not _supervisors(settings.home)
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{started['url']}/v2/health/live", timeout=1)
    status = local_triton.status(settings)
    assert (status["running"], status["supervisor"]["running"], status["supervisor"]["phase"]) == (
        False,
        False,
        "stopped",
    )
    assert local_triton.down(settings)["status"] == "not running"


def test_a_server_that_never_starts_is_reported_and_leaves_nothing_behind(settings, monkeypatch):
    monkeypatch.setenv("FAKE_TRITON_FAIL", "1")
    with pytest.raises(StepError, match=r"tritonserver exited with code 1 while starting: .*fake start-up failure"):
        local_triton.up(settings)
    paths = TritonPaths.from_settings(settings)
    assert supervisor_pid(paths) is None and running_pid(paths) is None and not _supervisors(settings.home)
    assert local_triton.status(settings)["supervisor"]["phase"] == "failed"


def test_up_that_can_serve_no_declared_version_fails_naming_it_and_leaves_nothing_behind(settings):
    root = model_repository(settings)
    write_version(root, "parcel_eta", 1, b"exported bytes", {})
    write_config(root, build_config("parcel_eta", 14, ("eta_prediction", "confidence_score"), [1], ServingConfig()))
    (root / "parcel_eta" / "1" / "model.onnx").write_bytes(b"swapped bytes")  # not the file export recorded
    with pytest.raises(
        StepError,
        match=r"serves none of its declared versions: parcel_eta v1 is declared but not "
        r"served: v1 model.onnx at .* has sha256",
    ):
        local_triton.up(settings)
    paths = TritonPaths.from_settings(settings)
    assert supervisor_pid(paths) is None and running_pid(paths) is None and not _supervisors(settings.home)
    # and a fixed repository starts cleanly afterwards: nothing left behind refuses the next `up`
    (root / "parcel_eta" / "1" / "model.onnx").write_bytes(b"exported bytes")
    assert local_triton.up(settings)["serving"]["parcel_eta"]["status"] == "in sync"


def test_a_server_left_by_a_killed_supervisor_is_adopted_not_restarted(settings):
    paths = TritonPaths.from_settings(settings)
    started = local_triton.up(settings)
    os.kill(started["supervisor"]["pid"], signal.SIGKILL)
    _until(lambda: supervisor_pid(paths) is None, 10, "the supervisor gone")
    again = local_triton.up(settings)
    assert again["status"] == "already running" and again["pid"] == started["pid"]
    assert again["supervisor"]["pid"] != started["supervisor"]["pid"]
    os.kill(started["pid"], signal.SIGKILL)  # the adopted server is watched too
    _until(lambda: running_pid(paths) not in (None, started["pid"]), 30, "a new server")
    assert local_triton.status(settings)["supervisor"]["restarts"] == 1


def test_the_cli_returns_at_once_with_its_output_piped(settings):
    """`mlrelease triton up | grep …` (make run) must end when `up` does, not when the supervisor does."""
    binary = Path(sys.executable).with_name("mlrelease")
    began = time.monotonic()
    piped = subprocess.run(
        f"{binary} triton up | grep -E '\"(status|url)\"'", shell=True, capture_output=True, text=True, timeout=60
    )
    assert piped.returncode == 0 and '"status": "started"' in piped.stdout
    assert time.monotonic() - began < 30
    assert supervisor_pid(TritonPaths.from_settings(settings)) is not None
