"""Helpers shared by the benchmarks: timing a command, redis-servers, a comparison table, a rollout world."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BIN = REPO / ".venv" / "bin"


def timed(argv: Sequence[str], env: dict[str, str], cwd: Path | None = None) -> float:
    """Wall seconds of one run of `argv`; a failing command aborts the benchmark with its stderr."""
    began = time.perf_counter()
    proc = subprocess.run(list(argv), env=env, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"benchmark command failed: {' '.join(argv)}\n{proc.stderr[-2000:]}")
    return elapsed


def median(values: Sequence[float]) -> float:
    """The median of the samples."""
    return statistics.median(values)


@contextmanager
def redis_server() -> Iterator[str]:
    """A redis-server on a free loopback port for the duration of the block; yields host:port."""
    import tempfile

    from mlrelease_drills.devkit import redis_server as throwaway_redis

    with tempfile.TemporaryDirectory(prefix="mlrelease-bench-redis-") as workdir:
        try:
            with throwaway_redis(Path(workdir)) as (address, _):
                yield address
        except RuntimeError as exc:
            raise SystemExit(f"this benchmark needs redis: {exc}") from None


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print a Markdown table (pastes straight into the README)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"  # noqa: E731
    print(line(cells[0]))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells[1:]:
        print(line(row))


def base_env(**extra: str) -> dict[str, str]:
    """The environment benchmarks run commands in: this one plus the venv first on PATH."""
    return {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", **extra}


@contextmanager
def serving_home(prefix: str) -> Iterator[Path]:
    """A throwaway MLRELEASE_HOME with 4 days of generated data and free Triton ports, as this process's env."""
    import tempfile
    from datetime import date

    from mlrelease.data.generate import generate
    from mlrelease_drills.devkit import free_port

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        home = Path(tmp)
        os.environ["MLRELEASE_HOME"] = str(home)
        os.environ.pop("MLRELEASE_TRITON_URL", None)
        for name in ("HTTP", "GRPC", "METRICS"):
            os.environ[f"MLRELEASE_TRITON_{name}_PORT"] = str(free_port())
        os.chdir(home)
        generate(home / "data" / "offline", date(2026, 11, 26), date(2026, 11, 29), rows_per_day=2000)
        yield home


def bench_gateway_config(home: Path, triton_url: str, window_end: str, **auth: object) -> tuple[Path, str, str]:
    """A gateway config for a benchmark world: replaying at `window_end`, file routing state, one API client.

    Returns the config path, the client's API key and the routing-state URL; `auth` adds to the auth section.
    """
    from mlrelease.gateway.auth import add_client
    from mlrelease_drills import devkit

    key = add_client(home / "keys.yaml", "bench")
    state_url = f"file://{home / 'routing.json'}"
    config = devkit.write_gateway_config(
        home / "gateway.yaml",
        replay_as_of=window_end,
        triton_url=triton_url,
        routing={"state_url": state_url},
        auth={"keys_file": str(home / "keys.yaml"), **auth},
    )
    return config, key, state_url


# --- a rollout world: Triton with the devkit's versions, MLflow, a gateway config, request bodies ------------

WINDOW = ("2026-11-28T02:00:00+00:00", "2026-11-29T02:00:00+00:00")  # the replayed night
STABLE = 1  # devkit.GOOD: the champion every scenario starts from


@dataclass
class RolloutWorld:
    """A running serving world for the rollout benchmarks and drills (see `rollout_world`).

    :param settings: the process's Settings (MLRELEASE_HOME is the world's home).
    :param config: the gateway config every step and gateway reads (MLRELEASE_GATEWAY_CONFIG).
    :param api_key: a client key of that config's keys file.
    :param bodies: request bodies drawn from the replayed night's orders (features looked up by the gateway).
    """

    settings: Any
    home: Path
    triton_url: str
    config: Path
    api_key: str
    bodies: list[dict[str, Any]]

    def registry(self) -> Any:
        """The world's MLflow registry."""
        from mlrelease.registry import Registry

        return Registry.from_settings(self.settings)

    def decisions(self) -> Path:
        """Where the gateway's replicas write their decision logs (the current gateway config's)."""
        from mlrelease.gateway.config import load_config

        return load_config().decision_dir(self.settings)

    def routing_store(self) -> Any:
        """The routing store of the current gateway config (MLRELEASE_GATEWAY_CONFIG)."""
        from mlrelease.gateway.config import load_config
        from mlrelease.gateway.routing_store_factory import open_routing_store
        from mlrelease.registry import MODEL_NAME

        return open_routing_store(load_config().state_url(self.settings), MODEL_NAME)

    def set_stable(self, version: int = STABLE) -> None:
        """Routing: everything on `version`, no candidate, no guard trips (a fresh document revision)."""
        from mlrelease.gateway.routing_state import RoutingState
        from mlrelease.registry import MODEL_NAME

        self.routing_store().update(lambda _: RoutingState(model=MODEL_NAME, stable_version=version), by="bench")

    def serve(self, versions: list[int]) -> None:
        """Triton serves exactly `versions` (the policy written first), each warmed up with a few calls.

        A version's first calls after a load are several times slower; validate-serving and shadow warm a real
        candidate before any rollout, so the benchmarks do too.
        """
        import numpy as np

        from mlrelease.errors import StepError
        from mlrelease.model.features import FEATURES
        from mlrelease.model.onnx_export import OUTPUTS
        from mlrelease.registry import MODEL_NAME
        from mlrelease.rollout.context import RolloutContext
        from mlrelease.serving.triton_client import TritonClient

        RolloutContext.open(self.settings).serve_only(versions)
        client = TritonClient(self.triton_url)
        try:
            for version in versions:
                for _ in range(30):
                    try:
                        client.infer(MODEL_NAME, version, np.zeros((1, len(FEATURES)), dtype=np.float32), OUTPUTS)
                    except StepError:  # a version that refuses every inference: nothing to warm
                        break
        finally:
            client.close()

    def reset(self, candidate: int | None = None) -> None:
        """Champion and stable v1, no rollout record, Triton serving v1 (and `candidate`, then the challenger)."""
        import shutil

        from mlrelease.registry import CHALLENGER, CHAMPION, MODEL_NAME

        client = self.registry().client()
        client.set_registered_model_alias(MODEL_NAME, CHAMPION, str(STABLE))
        if candidate is not None:
            client.set_registered_model_alias(MODEL_NAME, CHALLENGER, str(candidate))
        shutil.rmtree(self.settings.home / "rollout", ignore_errors=True)
        self.set_stable()
        self.serve([STABLE] if candidate is None else [STABLE, candidate])


@contextmanager
def rollout_world(prefix: str, *, n_bodies: int = 5_000, gates_passed: bool = True) -> Iterator[RolloutWorld]:
    """Feast (SQLite) materialized for WINDOW, every devkit version on a local CPU Triton, MLflow versions 1…n
    (with their release gates passed when `gates_passed`, as a real candidate has before any rollout), a
    gateway config with a file routing store on stable v1, as this process's environment. Triton is stopped
    on exit; starting gateways and traffic is the caller's business."""
    from mlrelease.gateway.config import load_config
    from mlrelease.gateway.traffic import build_requests, order_pool
    from mlrelease.registry import MODEL_NAME, Registry
    from mlrelease.rollout.gates import REQUIRED_GATES
    from mlrelease.serving import local_triton
    from mlrelease.serving.triton_repo import versions_present
    from mlrelease.settings import Settings
    from mlrelease.timewindow import Window, parse_timestamp
    from mlrelease_drills import devkit

    with serving_home(prefix) as home:
        os.environ["MLRELEASE_XCOM_PATH"] = str(home / "xcom" / "return.json")  # steps run as processes too
        os.environ.pop("MLFLOW_TRACKING_URI", None)  # the world's own registry under its home
        settings = Settings.from_env()
        try:
            with redirect_stdout(sys.stderr):  # Feast's progress: stdout is for the benchmark's table
                triton_url = devkit.start_serving_world(settings, Window.parse(*WINDOW))
            config, key, _ = bench_gateway_config(home, triton_url, WINDOW[1])
            os.environ["MLRELEASE_GATEWAY_CONFIG"] = str(config)  # the gateway's and the step processes'
            settings = dataclasses.replace(settings, gateway_config=config)  # the in-process steps'
            client = Registry.from_settings(settings).client()
            client.create_registered_model(MODEL_NAME)
            for version in versions_present(home / "model_repository", MODEL_NAME):  # MLflow numbers them 1, 2, …
                client.create_model_version(MODEL_NAME, source=str(home), run_id=None)
                for tag, passed in REQUIRED_GATES.items() if gates_passed else ():
                    client.set_model_version_tag(MODEL_NAME, str(version), tag, passed)
            as_of = parse_timestamp(WINDOW[1], name="end")
            pool = order_pool(settings.offline_dir, as_of, load_config().cohorts)
            world = RolloutWorld(
                settings, home, triton_url, config, key, build_requests(pool, n_bodies, None, supply_features=False)
            )
            world.set_stable()
            yield world
        finally:
            local_triton.down(settings)


class RestartableRedis:
    """A redis-server on a fixed free loopback port that keeps its data in an append-only file (fsync always),
    so a drill can `kill -9` it and start it again with its data; stopped on exit."""

    def __init__(self, workdir: Path) -> None:
        import shutil

        from mlrelease_drills.devkit import free_port

        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("this benchmark needs redis-server (apt-get install redis-server)")
        self.binary, self.workdir, self.port = binary, workdir, free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 10.0) -> None:
        """Start it (again) on its port and wait until it accepts connections."""
        import socket

        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [self.binary, "--save", "", *f"--port {self.port} --bind 127.0.0.1 --dir {self.workdir}".split()]
            + "--appendonly yes --appendfsync always".split(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"redis-server did not start on {self.address}") from None
                time.sleep(0.05)

    def kill(self) -> None:
        """`kill -9` it (no shutdown, no save: what a crash or a lost node does)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(timeout=10)

    def __enter__(self) -> RestartableRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


@dataclass
class TrafficRun:
    """A running `mlrelease traffic` process; `summary` is its JSON report, filled when the block ends."""

    proc: subprocess.Popen[str]
    summary: dict[str, Any]

    def wait_sending(self, port: int, connections: int = 1, timeout_s: float = 60.0) -> None:
        """Until the generator holds `connections` established connections to `port` (it is sending)."""
        import psutil

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                held = psutil.Process(self.proc.pid).net_connections(kind="tcp")
            except psutil.NoSuchProcess:
                held = []
            if (
                sum(c.status == psutil.CONN_ESTABLISHED and c.raddr and c.raddr.port == port for c in held)
                >= connections
            ):
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"`mlrelease traffic` is not sending to port {port} (exit code {self.proc.poll()})")
            time.sleep(0.05)


@contextmanager
def traffic_process(
    url: str, api_key: str, *, rate: float, config: Path, duration_s: float = 3600.0, concurrency: int = 64
) -> Iterator[TrafficRun]:
    """`mlrelease traffic` against a loopback gateway as a process of its own, so that a busy benchmark process
    (steps run in it) never stalls the generator; stopped with SIGTERM at the end of the block (it still
    reports). The key goes through the environment, not the command line."""
    argv = [str(BIN / "mlrelease"), "traffic", "--url", url, "--rate", str(rate), "--duration", str(duration_s)]
    argv += ["--concurrency", str(concurrency), "--config", str(config)]
    env = {**os.environ, "MLRELEASE_API_KEY": api_key}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    run = TrafficRun(proc, {})
    try:
        yield run
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        try:
            run.summary = json.loads(out) if proc.returncode == 0 else {}
        except ValueError:
            run.summary = {}
        if not run.summary:
            print(f"warning: `mlrelease traffic` exited {proc.returncode}: {err[-500:]}", file=sys.stderr)
