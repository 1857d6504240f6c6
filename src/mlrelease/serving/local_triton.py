"""`mlrelease triton up|down|status`: a real CPU tritonserver on 127.0.0.1 for the embedded default.

The server comes from the `nvidia-pytriton` wheel in a second environment (`.venv-triton`, built by
`make`), because it needs numpy < 2 and tritonclient 2.5x, which the application stack cannot share.
`up` starts it under a supervisor (`triton_supervisor`) that restarts it when it dies and reloads the
declared versions after every start, as the Triton Deployment does on Kubernetes.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests

from mlrelease.errors import StepError
from mlrelease.serving.local_layout import (
    FAILED,
    PY_VERSION,
    RECONCILING,
    SERVING,
    SUPERVISOR_MODULE,
    Ports,
    TritonPaths,
    is_ready,
    prepare_backends,
    running_pid,
    server_argv,
    supervisor_pid,
    supervisor_state,
    toolchain_env,
)
from mlrelease.serving.reconcile import RELOAD_TIMEOUT_S, reconcile_all, refusal_lines
from mlrelease.settings import Settings
from mlrelease.storage import file_lock, write_text_atomic

# The layout's names stay importable from here, where `mlrelease triton` users and tests have always found them.
__all__ = [
    "PY_VERSION",
    "Ports",
    "TritonPaths",
    "down",
    "is_ready",
    "perf_analyzer_command",
    "prepare_backends",
    "running_pid",
    "server_argv",
    "status",
    "supervisor_pid",
    "supervisor_state",
    "toolchain_env",
    "up",
]

log = logging.getLogger(__name__)


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


def up(settings: Settings, timeout_s: float = 60.0) -> dict[str, Any]:
    """Start tritonserver under its supervisor unless they already run; wait until the declared versions are loaded.

    The supervisor restarts the server whenever it dies and reloads the repository's declared versions after
    every start; `serving` is what that reconcile did, by model. Idempotent: with a supervisor already running this
    waits for it to be serving and reconciles once more (a version unloaded by hand is loaded again).
    """
    paths, ports = TritonPaths.from_settings(settings), Ports.from_env()
    paths.state.mkdir(parents=True, exist_ok=True)
    with file_lock(paths.control_lock):
        supervisor = supervisor_pid(paths)
        if supervisor is not None:  # ours is running (maybe restarting the server): never start a second one
            state = _wait_serving(paths, ports, supervisor, timeout_s, started_here=False)
            return {
                "status": "already running",
                "pid": state["server_pid"],
                "url": ports.http_url,
                "serving": _reconciled(settings, ports),
                "supervisor": _supervisor_view(paths, supervisor, state),
            }
        if running_pid(paths) is None and is_ready(ports):
            raise StepError(
                f"another Triton (not started by `mlrelease triton up` here) is serving on {ports.http_url}"
            )
        if not paths.server_binary.is_file():
            raise StepError(f"tritonserver not found at {paths.server_binary}: build the toolchain with `make setup`")
        toolchain_env(paths)  # a missing toolchain environment is reported here, not in the supervisor's log
        supervisor = _start_supervisor(settings, paths, timeout_s)
        try:
            state = _wait_serving(paths, ports, supervisor, timeout_s, started_here=True)
        except BaseException:
            _stop(paths)  # a half-started supervisor and server must not outlive a failed (or interrupted) `up`
            raise
        failure = _nothing_served(state)
        if failure is not None:  # a failed `up` leaves no supervisor and no server behind
            _stop(paths)
            raise StepError(failure)
        for line in refusal_lines(state["serving"]):  # the rest is served; the supervisor keeps trying this one
            log.error("%s", line)
        return {
            "status": "already running" if state.get("adopted") else "started",
            "pid": state["server_pid"],
            "url": ports.http_url,
            "log": str(paths.log_file),
            "serving": state["serving"],
            "supervisor": _supervisor_view(paths, supervisor, state),
        }


def _nothing_served(state: dict[str, Any]) -> str | None:
    """Why a freshly started server is of no use (None when it serves what it can): no reconcile, or all refused."""
    if state.get("reconcile_error"):
        return f"tritonserver started but its declared versions could not be loaded: {state['reconcile_error']}"
    serving = state.get("serving") or {}
    declared = any(result.get("declared") for result in serving.values())
    if declared and not any(result.get("serving") for result in serving.values()):
        return "tritonserver started but serves none of its declared versions: " + "; ".join(refusal_lines(serving))
    return None


def _start_supervisor(settings: Settings, paths: TritonPaths, timeout_s: float) -> int:
    """`python -m mlrelease.serving.triton_supervisor` detached: its own session, its own log, our environment."""
    paths.supervisor_state.unlink(missing_ok=True)  # `up` waits for this supervisor's own first record
    # The caller's environment (ports, MLRELEASE_*), with the paths this call resolved made explicit.
    env = {**os.environ, "MLRELEASE_HOME": str(settings.home), "MLRELEASE_TRITON_VENV": str(paths.venv)}
    with open(paths.supervisor_log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", SUPERVISOR_MODULE, "--start-timeout", str(timeout_s)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,  # never the caller's stdout: `mlrelease triton up | grep` must not wait for the supervisor
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    # Recorded at once, so `down` can stop it even if this call is interrupted while waiting.
    write_text_atomic(paths.supervisor_pid_file, str(proc.pid))
    return proc.pid


def _wait_serving(
    paths: TritonPaths, ports: Ports, supervisor: int, timeout_s: float, *, started_here: bool
) -> dict[str, Any]:
    """Wait until the supervisor reports the server ready and reconciled; its state. A StepError says why not."""

    began = time.monotonic()
    while True:
        state = supervisor_state(paths)
        mine = state.get("supervisor_pid") == supervisor
        phase = state.get("phase") if mine else None
        if phase == SERVING and is_ready(ports):
            return state
        if phase == FAILED or supervisor_pid(paths) != supervisor:
            _reap(supervisor)
            reason = state.get("error") if mine else None
            raise StepError(reason or f"the Triton supervisor exited: {_tail(paths.supervisor_log)}")
        # Loading the declared versions may take longer than the start itself: give it its own budget.
        budget = timeout_s + (RELOAD_TIMEOUT_S if phase in (RECONCILING, SERVING) else 0.0)
        if time.monotonic() - began > budget:
            what = f"is not ready on {ports.http_url}" if phase != RECONCILING else "is still loading its versions"
            hint = "" if started_here else "; stop it with `mlrelease triton down`"
            raise StepError(
                f"tritonserver (supervisor pid {supervisor}, phase {phase}) {what} after {budget:.0f} s "
                f"(logs {paths.supervisor_log}, {paths.log_file}){hint}"
            )
        time.sleep(0.1)


def _supervisor_view(paths: TritonPaths, pid: int | None, state: dict[str, Any]) -> dict[str, Any]:
    return {
        "pid": pid,
        "running": pid is not None,
        "phase": state.get("phase"),
        "server_starts": state.get("starts", 0),
        "restarts": state.get("restarts", 0),
        "last_restart_reason": state.get("last_restart_reason"),
        "last_restart_at": state.get("last_restart_at"),
        "reconcile_error": state.get("reconcile_error"),
        "refused": refusal_lines(state.get("serving") or {}),
        "log": str(paths.supervisor_log),
    }


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:]) + f" (log {path})"
    except OSError:
        return f"(no log at {path})"


def _reconciled(settings: Settings, ports: Ports) -> dict[str, dict[str, Any]]:
    """Load what the repository's policy declares, every model's (a restarted server serves the same versions again)."""
    return reconcile_all(settings, ports.http_url)


def down(settings: Settings, timeout_s: float = 20.0) -> dict[str, Any]:
    """Stop the supervisor (so nothing restarts the server), then the server (SIGTERM, SIGKILL after `timeout_s`)."""
    paths = TritonPaths.from_settings(settings)
    paths.state.mkdir(parents=True, exist_ok=True)
    with file_lock(paths.control_lock):
        return _stop(paths, timeout_s)


def _stop(paths: TritonPaths, timeout_s: float = 20.0) -> dict[str, Any]:
    supervisor = _stop_supervisor(paths)
    pid = running_pid(paths)
    if pid is None:
        paths.pid_file.unlink(missing_ok=True)
        return {"status": "not running", "supervisor": supervisor}
    os.killpg(pid, signal.SIGTERM)  # its own session: the python-backend stubs go with it
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and running_pid(paths) is not None:
        _reap(pid)  # a server that is our own child stays a zombie (and looks alive) until reaped
        time.sleep(0.1)
    if running_pid(paths) is not None:
        os.killpg(pid, signal.SIGKILL)
    _reap(pid)
    paths.pid_file.unlink(missing_ok=True)
    return {"status": "stopped", "pid": pid, "supervisor": supervisor}


def _stop_supervisor(paths: TritonPaths, timeout_s: float = 10.0) -> int | None:
    """SIGTERM the supervisor and wait until it is gone (SIGKILL after `timeout_s`); its pid, or None."""
    pid = supervisor_pid(paths)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)  # it exits without touching the server (see triton_supervisor)
        deadline = time.monotonic() + timeout_s
        while supervisor_pid(paths) is not None and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.05)
        if supervisor_pid(paths) is not None:  # stuck: it cannot start anything once killed
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while supervisor_pid(paths) is not None and time.monotonic() < deadline:
                _reap(pid)
                time.sleep(0.05)
        _reap(pid)
    paths.supervisor_pid_file.unlink(missing_ok=True)
    return pid


def _reap(pid: int) -> None:
    """Collect the exit status when the process was our own child, so no zombie is left behind."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def status(settings: Settings) -> dict[str, Any]:
    """Whether the server runs and is ready, which models/versions it has loaded, and its supervisor's record."""
    paths, ports = TritonPaths.from_settings(settings), Ports.from_env()
    pid = running_pid(paths)
    ready = is_ready(ports)
    models: list[Any] = []
    if ready:
        models = requests.post(f"{ports.http_url}/v2/repository/index", json={}, timeout=5).json()
    supervisor = supervisor_pid(paths)
    return {
        "running": pid is not None,
        "pid": pid,
        "ready": ready,
        "url": ports.http_url,
        "models": models,
        "supervisor": _supervisor_view(paths, supervisor, supervisor_state(paths)),
    }
