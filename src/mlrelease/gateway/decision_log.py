"""The decision log: one JSON line per model call the gateway makes, for the rollout's statistical guardrails.

Prometheus counters and histograms say how often and how slow; the rollout also needs the answers
themselves (a KS test on predictions) and the inputs (which features shifted on a cohort). So every
replica appends what it decided to its own hourly file under one directory, buffered in memory and
flushed by a background task, so the predict path never waits for the disk. Readers merge the files.

A record: `t` (unix seconds), `cohort`, `version` (the version that answered), `role` (its role: stable |
candidate), `assigned` (the version the request's user is assigned to: the arm every contract judges it in),
`unit` (a hash of the user: the unit of analysis), `retry` (true on stable's call that answers a candidate-assigned
request whose candidate call failed), `w` (the record's weight: 1 / sample rate for a sampled success, 1 for a
failure, which is always recorded), `outcome` (ok or the failure kind: error, timeout, nan, out_of_range; or
unavailable: no call was made, stable's breaker was open and the rule answered),
`latency_s` of the Triton call, `key` (a CRC-32 of the encoded row: requests with the same inputs share it),
`eta`, `confidence` (ok only) and, when enabled, `features` (the encoded row).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import socket
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
FILE_HOURS_FORMAT = "%Y%m%dT%H"


class DecisionLog:
    """Buffered, per-replica, hourly-rotated JSON-lines writer.

    :param directory: where every replica writes (shared by the replicas of one deployment).
    :param sample_rate: share of calls recorded (failures are always recorded).
    :param with_features: also record the encoded feature row (needed by `diagnose`).
    :param retention_hours: files older than this are deleted when a new hour starts.
    """

    def __init__(
        self,
        directory: Path,
        *,
        sample_rate: float = 1.0,
        with_features: bool = True,
        retention_hours: float = 48.0,
        flush_interval_s: float = 0.2,
    ) -> None:
        self.directory = directory
        self.sample_rate = sample_rate
        self.with_features = with_features
        self.retention = timedelta(hours=retention_hours)
        self.flush_interval_s = flush_interval_s
        self._replica = f"{socket.gethostname()}-{os.getpid()}"
        self._buffer: list[str] = []
        self._task: asyncio.Task[None] | None = None
        self._hour: str | None = None

    def record(
        self,
        *,
        cohort: str,
        version: int,
        role: str,
        outcome: str,
        latency_s: float,
        assigned: int | None = None,
        unit: int | None = None,
        retry: bool = False,
        eta: float | None = None,
        confidence: float | None = None,
        features: list[float] | None = None,
        key: int | None = None,
    ) -> None:
        """Buffer one model call (sampled unless it failed; a sampled success carries the weight 1 / sample rate)."""
        weight = 1.0
        if outcome == "ok" and self.sample_rate < 1.0:
            if random.random() >= self.sample_rate:
                return
            weight = 1.0 / self.sample_rate
        entry: dict[str, Any] = {
            # Truncated, not rounded: a time rounded up lies in the future, and a reader's window "until now"
            # taken right after the flush would leave the record out.
            "t": math.floor(time.time() * 10_000) / 10_000,
            "cohort": cohort,
            "version": version,
            "role": role,
            "assigned": version if assigned is None else assigned,
            "outcome": outcome,
            "latency_s": round(latency_s, 6),
            "w": weight,
        }
        if unit is not None:
            entry["unit"] = unit
        if retry:
            entry["retry"] = True
        if key is not None:
            entry["key"] = key
        if outcome == "ok":
            entry["eta"], entry["confidence"] = eta, confidence
        if self.with_features and features is not None:
            entry["features"] = features
        self._buffer.append(json.dumps(entry, separators=(",", ":")))

    def flush(self) -> None:
        """Append the buffered records to this replica's file for the current hour."""
        if not self._buffer:
            return
        lines, self._buffer = self._buffer, []
        now = datetime.now(UTC)
        hour = now.strftime(FILE_HOURS_FORMAT)
        self.directory.mkdir(parents=True, exist_ok=True)
        if hour != self._hour:
            self._hour = hour
            self._delete_older_than(now - self.retention)
        with open(self.directory / f"{hour}-{self._replica}.jsonl", "a", encoding="utf-8") as out:
            out.write("\n".join(lines) + "\n")

    def _delete_older_than(self, cutoff: datetime) -> None:
        for path in self.directory.glob("*.jsonl"):
            started = _file_hour(path)
            if started is not None and started + timedelta(hours=1) < cutoff:
                path.unlink(missing_ok=True)

    def start(self) -> None:
        """Start the background flusher."""
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval_s)
            try:
                self.flush()
            except OSError as exc:  # a full disk must not take predictions down: drop the batch, say so
                log.error("decision log: could not write to %s: %s", self.directory, exc)

    async def stop(self) -> None:
        """Stop the flusher and write what is left."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        try:
            self.flush()
        except OSError as exc:
            log.error("decision log: could not write to %s: %s", self.directory, exc)


def _file_hour(path: Path) -> datetime | None:
    try:
        return datetime.strptime(path.name.split("-", 1)[0], FILE_HOURS_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return None


class DecisionReader:
    """Reads every replica's decision files; remembers what it parsed, so a re-read only parses appended lines.

    A line still being written (no newline yet) is left for the next read; a garbled line is skipped.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._parsed: dict[Path, tuple[int, list[dict[str, Any]]]] = {}

    def read(self, since: datetime, until: datetime | None = None) -> list[dict[str, Any]]:
        """Every record with `since <= t < until` (until: now)."""
        start, end = since.timestamp(), (until or datetime.now(UTC)).timestamp()
        if not self.directory.is_dir():
            return []
        found: list[dict[str, Any]] = []
        for path in sorted(self.directory.glob("*.jsonl")):
            hour = _file_hour(path)
            if hour is None or hour.timestamp() + 3600 <= start or hour.timestamp() >= end:
                continue
            found.extend(r for r in self._refresh(path) if start <= r.get("t", 0) < end)
        return found

    def _refresh(self, path: Path) -> list[dict[str, Any]]:
        offset, records = self._parsed.get(path, (0, []))
        try:
            with open(path, "rb") as raw:
                raw.seek(offset)
                chunk = raw.read()
        except FileNotFoundError:  # deleted by retention since the directory was listed
            self._parsed.pop(path, None)
            return []
        complete = chunk[: chunk.rfind(b"\n") + 1]
        for line in complete.splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
        self._parsed[path] = (offset + len(complete), records)
        return records
