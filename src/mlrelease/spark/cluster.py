"""A real standalone Spark cluster on this machine: one master and N workers, started from the pyspark package.

pyspark ships Spark's jars and `bin/spark-class` but not `sbin/start-master.sh`, so the daemons are started
directly (`spark-class org.apache.spark.deploy.master.Master`, `... worker.Worker`), each its own process
group, stopped by PID, and terminated by the kernel if the process that started them dies first. The master's
`/json/` page says when the workers have registered. Used by the tests and the benchmark; production points
`spark.master` at its own cluster instead.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlrelease.errors import StepError

PR_SET_PDEATHSIG = 1  # linux/prctl.h
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
JAVA_17 = "/usr/lib/jvm/java-17-openjdk-*"  # Debian's openjdk-17-jre-headless, any architecture (Spark 4: 17+)


def terminate_with_parent(parent_pid: int) -> Callable[[], None]:
    """A `preexec_fn` for a daemon: the kernel SIGTERMs it when the process `parent_pid` that starts it dies.

    A daemon runs in its own session (stopped by process group), so a SIGKILLed test run or benchmark would
    otherwise leave the JVMs running; Linux's parent-death signal survives spark-class's final `exec java`, and
    the JVM's shutdown hooks stop a worker's executors. The signal follows the *thread* that forked: start the
    cluster from a thread that outlives it (the tests and the benchmark use their main thread).
    """

    def in_the_child() -> None:
        if _PRCTL is None:
            return
        # After fork only async-signal-safe work: prctl was resolved at import, no allocation here.
        if _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent_pid:  # the parent died before the signal was armed
            os.kill(os.getpid(), signal.SIGTERM)

    return in_the_child


def java_home() -> str:
    """JAVA_HOME for Spark: the environment's, else Debian's Java 17; a clear error when there is none."""
    debian = sorted(p.parent.parent for p in Path("/").glob(JAVA_17.lstrip("/") + "/bin/java"))
    home = os.environ.get("JAVA_HOME") or (str(debian[0]) if debian else "")
    if not home:
        java = shutil.which("java")
        if java is None:
            raise StepError("Spark needs Java 17 or newer: apt-get install openjdk-17-jre-headless (or set JAVA_HOME)")
        home = str(Path(java).resolve().parent.parent)
    return home


def spark_home() -> Path:
    """Where the pyspark package keeps Spark (its jars and bin/spark-class)."""
    import pyspark

    return Path(pyspark.__file__).parent


def free_port() -> int:
    """A TCP port free on loopback now (the daemons bind it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LocalSparkCluster:
    """A standalone master and `workers` workers on loopback, each worker with `cores` and `memory`."""

    workdir: Path
    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    host: str = "127.0.0.1"
    port: int = field(default_factory=free_port)
    webui_port: int = field(default_factory=free_port)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    worker_ui_ports: list[int] = field(default_factory=list)

    @property
    def master_url(self) -> str:
        """The URL drivers connect to: spark://host:port."""
        return f"spark://{self.host}:{self.port}"

    @property
    def webui_url(self) -> str:
        """The master's web UI (its `/json/` page lists the alive workers)."""
        return f"http://{self.host}:{self.webui_port}"

    def _env(self) -> dict[str, str]:
        home = spark_home()
        return {
            **os.environ,
            "JAVA_HOME": java_home(),
            "SPARK_HOME": str(home),
            "SPARK_LOG_DIR": str(self.workdir / "logs"),
            "SPARK_WORKER_DIR": str(self.workdir / "work"),
            # Daemons stay small: the master and each worker's own JVM need little heap.
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_LOCAL_IP": self.host,
        }

    def _daemon(self, name: str, args: list[str]) -> None:
        log = (self.workdir / f"{name}.log").open("wb")
        spark_class = str(spark_home() / "bin" / "spark-class")
        proc = subprocess.Popen(
            [spark_class, *args],
            env=self._env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=terminate_with_parent(os.getpid()),
        )
        self.processes.append(proc)

    def start(self, timeout_s: float = 90.0) -> LocalSparkCluster:
        """Start the master and the workers; return once every worker is ALIVE on the master."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        master = "org.apache.spark.deploy.master.Master"
        self._daemon(
            "master", [master, "--host", self.host, "--port", str(self.port), "--webui-port", str(self.webui_port)]
        )
        for i in range(self.workers):
            args = ["org.apache.spark.deploy.worker.Worker", self.master_url, "--cores", str(self.cores)]
            self.worker_ui_ports.append(free_port())
            args += ["--memory", self.memory, "--webui-port", str(self.worker_ui_ports[-1]), "--host", self.host]
            self._daemon(f"worker-{i}", args)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [str(p.args) for p in self.processes if p.poll() is not None]
            if dead:
                self.stop()
                raise StepError(f"a Spark daemon exited at start ({dead[0]}); see its log in {self.workdir}")
            if len(self.alive_workers()) == self.workers:
                return self
            time.sleep(0.5)
        self.stop()
        raise StepError(f"the Spark cluster at {self.master_url} did not get {self.workers} workers in {timeout_s} s")

    def state(self) -> dict[str, Any]:
        """The master's JSON status page ({} while it is not up)."""
        try:
            with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=2) as reply:
                return dict(json.load(reply))
        except OSError:
            return {}

    def alive_workers(self) -> list[dict[str, Any]]:
        """The workers the master lists as ALIVE."""
        return [w for w in self.state().get("workers") or [] if w.get("state") == "ALIVE"]

    def applications(self) -> list[dict[str, Any]]:
        """Every application the master has run or runs (`id`, `name`, `state`, ...), oldest first."""
        state = self.state()
        return sorted([*state.get("completedapps", []), *state.get("activeapps", [])], key=lambda a: a["starttime"])

    def executors_of(self, app_id: str) -> list[str]:
        """`<worker id>/<executor id>` of every executor the workers run or ran for the application `app_id`."""
        found = []
        for port in self.worker_ui_ports:
            with urllib.request.urlopen(f"http://{self.host}:{port}/json/", timeout=5) as reply:
                worker = json.load(reply)
            executors = [*worker.get("executors", []), *worker.get("finishedexecutors", [])]
            found += [f"{worker['id']}/{e['id']}" for e in executors if e.get("appid") == app_id]
        return sorted(found)

    def stop(self) -> None:
        """Stop every daemon by its process group (the JVM and anything it started); waits for them."""
        for proc in reversed(self.processes):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        for proc in self.processes:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.processes.clear()

    def __enter__(self) -> LocalSparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
