"""The local tritonserver's supervisor: restart it when it dies, reload the declared versions after every start.

The embedded default's equivalent of the Triton Deployment: the kubelet restarts a pod whose server
exited (restartPolicy: Always, with a back-off) or stopped answering its liveness probe, and the restarted
server loads the versions the repository's policy declares (`--load-model`). Here `mlrelease triton up`
starts this process detached, in its own session, and it does both: start tritonserver, wait until ready,
`reconcile` (load every declared version Triton lacks), then watch it. An unexpected exit, or a server
that stops answering `/v2/health/live`, is restarted after a back-off, at most `max_restarts` within any
`window_s` (more wait for the window; every restart is logged with its reason). A server that never
became ready since the supervisor started is not retried: that needs a person, and `up` reports it.

`mlrelease triton down` stops the supervisor first (SIGTERM: it exits and leaves the server alone), then
the server. A supervisor that finds a server of ours already running (its supervisor was killed) adopts it.

State for `up` and `status` is one JSON file beside the server's pid file (`supervisor.json`); the
supervisor's log is `supervisor.log`, the server's `tritonserver.log`.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import requests

from mlrelease.errors import StepError
from mlrelease.serving.local_layout import (
    BACKOFF,
    FAILED,
    RECONCILING,
    SERVING,
    STARTING,
    STOPPED,
    SUPERVISOR_MODULE,
    Ports,
    TritonPaths,
    is_ready,
    prepare_backends,
    running_pid,
    server_argv,
    toolchain_env,
)
from mlrelease.serving.reconcile import reconcile_all, refusal_lines
from mlrelease.serving.triton_client import TritonUnreachable
from mlrelease.settings import Settings
from mlrelease.storage import write_json_atomic, write_text_atomic

log = logging.getLogger("mlrelease.triton_supervisor")

# A python-backend stub's shared memory; a server killed with SIGKILL leaves its stubs' regions behind (1 MB each).
SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "triton_python_backend_shm_region_"


@dataclass(frozen=True)
class RestartPolicy:
    """When and how often the server is restarted, and when it counts as hung.

    :param first_delay_s: wait before the first restart in a window (lets the ports and stubs go).
    :param max_delay_s: longest back-off between two restarts.
    :param max_restarts: restarts allowed within `window_s`; more wait until the window allows one.
    :param window_s: the sliding window of that cap.
    :param start_timeout_s: a started server not ready by then is killed (and counts as a failed start).
    :param liveness_period_s: how often `/v2/health/live` is asked while serving.
    :param liveness_timeout_s: one liveness request's timeout.
    :param liveness_failures: consecutive failed liveness checks that make the supervisor kill and restart it.
    :param reconcile_retry_s: while a declared version failed to load, how often loading it is tried again.
    """

    first_delay_s: float = 0.5
    max_delay_s: float = 30.0
    max_restarts: int = 5
    window_s: float = 60.0
    start_timeout_s: float = 60.0
    liveness_period_s: float = 5.0
    liveness_timeout_s: float = 5.0
    liveness_failures: int = 3
    reconcile_retry_s: float = 30.0


def restart_delay(restarts: Sequence[float], now: float, policy: RestartPolicy) -> float:
    """Seconds to wait before the next restart, given the (monotonic) times of the earlier ones.

    Exponential back-off over the restarts in the last `window_s` (first_delay_s, then 2x each, up to
    max_delay_s), and never more than `max_restarts` within any window: past the cap, wait until the oldest
    counted restart leaves it.
    """
    recent = sorted(t for t in restarts if now - t < policy.window_s)
    delay = min(policy.first_delay_s * 2 ** len(recent), policy.max_delay_s)
    if len(recent) >= policy.max_restarts:
        delay = max(delay, recent[-policy.max_restarts] + policy.window_s - now)
    return max(delay, 0.0)


def describe_exit(code: int | None) -> str:
    """A returncode in words: `killed by SIGKILL`, `exited with code 1`, or `exited` when unknown."""
    if code is None:
        return "exited"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def stub_regions(pgid: int) -> set[str]:
    """The shared-memory regions of the python-backend stubs in process group `pgid` (named on their command line)."""
    found: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        found.update(a.decode() for a in args if a.startswith(SHM_PREFIX.encode()) and b"/" not in a)
    return found


class _Stop(Exception):
    """SIGTERM/SIGINT: leave now, and leave the server to `down`."""


class Supervisor:
    """Runs one tritonserver at a time for the local paths and ports; see the module docstring.

    :param settings: whose MLRELEASE_HOME holds the server's state and the declared repository.
    :param policy: restart and liveness settings.
    """

    def __init__(self, settings: Settings, policy: RestartPolicy | None = None) -> None:
        self.settings = settings
        self.policy = policy or RestartPolicy()
        self.paths, self.ports = TritonPaths.from_settings(settings), Ports.from_env()
        self._env: dict[str, str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid: int | None = None
        self._restarts: list[float] = []
        self._stop_requested = False
        self._interruptible = True
        self._reconcile_due: float | None = None  # when a failed reconcile is tried again (None: nothing pending)
        self._regions: set[str] = set()  # the running server's stubs' shared memory, last seen
        self.state: dict[str, Any] = {
            "supervisor_pid": os.getpid(),
            "server_pid": None,
            "phase": STARTING,
            "adopted": False,
            "starts": 0,
            "restarts": 0,
            "last_restart_reason": None,
            "last_restart_at": None,
            "serving": None,
            "reconcile_error": None,
            "error": None,
            "url": self.ports.http_url,
        }

    # --- the loop --------------------------------------------------------------------------------------

    def run(self) -> int:
        """Supervise until SIGTERM/SIGINT (0) or until the server cannot be started at all (1)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        try:
            self._supervise()
        except _Stop:
            self._save(phase=STOPPED)
            log.info("stopped; tritonserver pid %s is left for `mlrelease triton down`", self._pid)
            return 0
        except Exception as exc:
            self._save(phase=FAILED, error=str(exc))
            log.error("giving up: %s", exc)
            return 1
        return 0  # pragma: no cover - _supervise only returns by raising

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop_requested = True
        log.info("received %s", signal.Signals(signum).name)
        if self._interruptible:
            raise _Stop

    def _supervise(self) -> None:
        adopted = running_pid(self.paths)
        if adopted is not None:  # an earlier supervisor died and left its server: watch that one
            self._pid = adopted
            self._save(server_pid=adopted, adopted=True)
            log.info("adopting the running tritonserver pid %s", adopted)
        else:
            self._start()
        served_once = False
        while True:
            reason = self._bring_up()
            if reason is None:
                served_once = True
                reason = self._watch()
            elif not served_once:  # never came up: a bad flag, a taken port, a broken toolchain
                self._kill_group()
                self.paths.pid_file.unlink(missing_ok=True)
                raise StepError(f"tritonserver {reason}: {self._log_tail()}")
            self._restart(reason)

    def _restart(self, reason: str) -> None:
        """Clean up after the server that went away, wait out the back-off, start a new one."""
        pid = self._pid
        self._kill_group()
        delay = restart_delay(self._restarts, time.monotonic(), self.policy)
        self._restarts.append(time.monotonic() + delay)
        at = datetime.now(UTC).isoformat(timespec="seconds")
        self._save(
            phase=BACKOFF,
            restarts=self.state["restarts"] + 1,
            last_restart_reason=f"tritonserver pid {pid} {reason}",
            last_restart_at=at,
        )
        log.warning("tritonserver pid %s %s: restart %d in %.1f s", pid, reason, self.state["restarts"], delay)
        time.sleep(delay)
        self._start()

    def _start(self) -> None:
        """Start tritonserver in its own session (its python-backend stubs stay in its group) and record its pid."""
        if self._env is None:
            self._env = toolchain_env(self.paths)
        prepare_backends(self.paths)
        self.paths.cpu_repository.mkdir(parents=True, exist_ok=True)
        # Not interrupted between the fork and the pid file: `down` must always find what was started.
        self._interruptible = False
        try:
            with open(self.paths.log_file, "ab") as out:
                self._proc = subprocess.Popen(
                    server_argv(self.paths, self.ports),
                    env=self._env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self._pid = self._proc.pid
            write_text_atomic(self.paths.pid_file, str(self._pid))
        finally:
            self._interruptible = True
        self._save(phase=STARTING, server_pid=self._pid, starts=self.state["starts"] + 1, adopted=False)
        log.info("started tritonserver pid %s on %s", self._pid, self.ports.http_url)
        if self._stop_requested:
            raise _Stop

    def _bring_up(self) -> str | None:
        """Wait until the server is ready, then load the declared versions; why it did not come up, or None."""
        began = time.monotonic()
        while not is_ready(self.ports):
            gone, code = self._exited()
            if gone:
                return f"{describe_exit(code)} while starting"
            if time.monotonic() - began > self.policy.start_timeout_s:
                return f"was not ready within {self.policy.start_timeout_s:.0f} s"
            time.sleep(0.2)
        log.info("tritonserver pid %s ready after %.1f s", self._pid, time.monotonic() - began)
        self._reconcile()
        return None

    def _reconcile(self) -> None:
        """Load what the repository's policy declares; a refusal is recorded and retried, never fatal."""

        self._save(phase=RECONCILING)
        try:
            serving = reconcile_all(self.settings, self.ports.http_url)
        except TritonUnreachable as exc:  # it went away again: the watch sees the exit (restart) or tries again
            self._reconcile_due = time.monotonic() + 1.0
            self._save(phase=RECONCILING, reconcile_error=str(exc))
            log.warning("reconcile: %s", exc)
            return
        except StepError as exc:  # a declared version cannot be loaded: serve the rest, try again later
            self._reconcile_due = time.monotonic() + self.policy.reconcile_retry_s
            self._save(phase=SERVING, reconcile_error=str(exc))
            log.error("reconcile: %s (trying again in %.0f s)", exc, self.policy.reconcile_retry_s)
            return
        refused = refusal_lines(serving)
        # A refused version is tried again later (a person may have put the right file back); the rest is served.
        self._reconcile_due = time.monotonic() + self.policy.reconcile_retry_s if refused else None
        self._save(phase=SERVING, serving=serving, reconcile_error=None)
        for model, done in serving.items():
            log.info("%s: serving %s of declared %s: %s", model, done["serving"], done["declared"], done["status"])
        for line in refused:
            log.error("reconcile: %s (trying again in %.0f s)", line, self.policy.reconcile_retry_s)

    def _watch(self) -> str:
        """Block until the server exits or stops answering liveness; the reason."""
        failures, next_check = 0, time.monotonic() + self.policy.liveness_period_s
        if self._pid is not None:
            self._regions = stub_regions(self._pid)
        while True:
            gone, code = self._exited(wait_s=0.5)
            if gone:
                return describe_exit(code)
            now = time.monotonic()
            if self._reconcile_due is not None and now >= self._reconcile_due:
                self._reconcile()
            if now < next_check:
                continue
            next_check = now + self.policy.liveness_period_s
            if self._pid is not None:
                self._regions = stub_regions(self._pid)  # stubs may be gone by the time the server is
            failures = 0 if self._live() else failures + 1
            if failures >= self.policy.liveness_failures:
                return f"did not answer /v2/health/live {failures} times in a row (killed)"

    # --- helpers ---------------------------------------------------------------------------------------

    def _exited(self, wait_s: float = 0.0) -> tuple[bool, int | None]:
        """Whether the server has gone, and its returncode (None when it was not our child), waiting up to `wait_s`."""
        if self._proc is not None and self._proc.pid == self._pid:
            try:
                return True, self._proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                return False, None
        if self._pid is not None and running_pid(self.paths) == self._pid:  # adopted: poll /proc
            time.sleep(wait_s)
            return False, None
        return True, None

    def _live(self) -> bool:
        try:
            url = f"{self.ports.http_url}/v2/health/live"
            return requests.get(url, timeout=self.policy.liveness_timeout_s).status_code == 200
        except requests.RequestException:
            return False

    def _kill_group(self) -> None:
        """SIGKILL whatever is left of the server's session (stubs, or a hung server), reap it, free its stubs'
        shared memory (a server that exits normally frees it itself; one killed leaves it in /dev/shm)."""
        if self._pid is None:
            return
        regions = self._regions | stub_regions(self._pid)
        try:
            os.killpg(self._pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self._proc is not None and self._proc.pid == self._pid:
            self._proc.wait()
        for name in regions:
            (SHM_DIR / name).unlink(missing_ok=True)
        self._regions = set()

    def _log_tail(self, lines: int = 5) -> str:
        try:
            tail = self.paths.log_file.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return f"(no log at {self.paths.log_file})"
        return " | ".join(tail) + f" (log {self.paths.log_file})"

    def _save(self, **changes: Any) -> None:
        self.state.update(changes, updated_at=datetime.now(UTC).isoformat(timespec="milliseconds"))
        write_json_atomic(self.paths.supervisor_state, self.state)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m mlrelease.serving.triton_supervisor` (started by `mlrelease triton up`)."""
    parser = argparse.ArgumentParser(prog=SUPERVISOR_MODULE, description=__doc__.splitlines()[0])
    parser.add_argument("--start-timeout", type=float, default=RestartPolicy.start_timeout_s)
    parser.add_argument("--max-restarts", type=int, default=RestartPolicy.max_restarts)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s triton-supervisor: %(message)s"
    )
    policy = RestartPolicy(start_timeout_s=args.start_timeout, max_restarts=args.max_restarts)
    return Supervisor(Settings.from_env(), policy).run()


if __name__ == "__main__":
    sys.exit(main())
