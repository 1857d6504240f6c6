"""Helpers shared by the benchmarks: timing a command, a throwaway redis-server, a comparison table."""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

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

    from mlrelease.devkit import redis_server as throwaway_redis

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
    from mlrelease.devkit import free_port

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
    from mlrelease import devkit
    from mlrelease.gateway.auth import add_client

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
