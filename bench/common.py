"""Helpers shared by the benchmarks: timing a command, a throwaway redis-server, a comparison table."""

from __future__ import annotations

import os
import shutil
import socket
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
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is required for this benchmark: apt-get install redis-server")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


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
