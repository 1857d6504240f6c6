"""A real Prometheus server for tests: the Debian `prometheus` binary on a loopback port, scraping given targets."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml

from tests.conftest import free_port


@dataclass
class PrometheusServer:
    """A running Prometheus: its URL and process (a test may pause it to make a scrape gap)."""

    url: str
    process: subprocess.Popen[bytes]

    def targets_up(self) -> dict[str, float]:
        """`up` per scraped instance right now."""
        body = requests.get(f"{self.url}/api/v1/query", params={"query": "up"}, timeout=5).json()
        return {s["metric"]["instance"]: float(s["value"][1]) for s in body["data"]["result"]}

    @contextmanager
    def paused(self) -> Iterator[None]:
        """SIGSTOP for the block: no scrape happens, as when Prometheus is overloaded or its pod is rescheduled."""
        self.process.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.process.send_signal(signal.SIGCONT)


@contextmanager
def prometheus_server(workdir: Path, targets: list[str], *, interval_s: float = 1.0) -> Iterator[PrometheusServer]:
    """Prometheus scraping `targets` (host:port, path /metrics) every `interval_s`; ready once every target was
    scraped up; stopped and its storage removed afterwards."""
    binary = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not Path(binary).is_file():
        pytest.fail("prometheus is not installed: `apt-get install prometheus` (make test installs it)")
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    interval = f"{int(interval_s * 1000)}ms"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": interval, "scrape_timeout": interval},
                "scrape_configs": [{"job_name": "gateway", "static_configs": [{"targets": targets}]}],
            }
        )
    )
    port = free_port()
    log = workdir / "prometheus.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = PrometheusServer(f"http://127.0.0.1:{port}", process)
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"prometheus exited with {process.returncode}: {log.read_text()[-2000:]}")
            try:
                up = server.targets_up()
                if len(up) == len(targets) and all(v == 1 for v in up.values()):
                    break
            except (requests.ConnectionError, KeyError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"prometheus did not scrape {targets} within 60 s: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield server
    finally:
        process.send_signal(signal.SIGCONT)  # a test that failed inside `paused` must not leave it stopped
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(workdir / "data", ignore_errors=True)
