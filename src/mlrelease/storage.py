"""Atomic file writes: a reader sees the old file or the new one, never half of either."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd


def _atomic_replace(path: Path, write: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """Write a text file atomically (temporary file in the same directory, then rename)."""

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())

    _atomic_replace(path, write)


def write_json_atomic(path: Path, payload: Any) -> None:
    """Write JSON atomically, pretty-printed with sorted keys so reruns produce identical bytes."""
    write_text_atomic(path, json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")


def write_npz_atomic(path: Path, **arrays: Any) -> None:
    """Write numpy arrays to an .npz file atomically."""
    import numpy as np

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:  # a file object: np.savez would append ".npz" to a path
            np.savez(fh, **arrays)

    _atomic_replace(path, write)


def write_parquet_atomic(frame: pd.DataFrame, path: Path, timestamp_unit: str | None = None) -> None:
    """Write a DataFrame to parquet atomically; timestamps in `timestamp_unit` (e.g. "us") when given."""
    options: dict[str, Any] = (
        {"coerce_timestamps": timestamp_unit, "allow_truncated_timestamps": False} if timestamp_unit else {}
    )
    _atomic_replace(path, lambda tmp: frame.to_parquet(tmp, index=False, **options))


def sha256(path: Path) -> str:
    """Hex SHA-256 of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextmanager
def file_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `lock_path` (created if missing) for the block; OSError if it cannot be opened."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock
