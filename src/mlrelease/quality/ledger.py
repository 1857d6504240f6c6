"""The ledger of source partitions that passed validate-data, keyed by table and day, pinned by SHA-256.

Materialize and train read only partitions whose bytes are the bytes that passed: a partition rewritten
upstream after its check (or never checked) is refused until validate-data has looked at it again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from mlrelease.errors import StepError
from mlrelease.storage import file_lock, sha256, write_json_atomic


@dataclass(frozen=True)
class PartitionFile:
    """One date partition of one source table on disk."""

    table: str
    day: date
    path: Path

    @property
    def name(self) -> str:
        """How messages and the ledger name it: `orders/date=2026-11-28`."""
        return f"{self.table}/date={self.day.isoformat()}"


class PartitionLedger:
    """A JSON document `{"orders/date=…": {"sha256", "bytes", "run"}}` under the state directory."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, dict[str, object]]:
        """Every approved partition; an absent file means none passed yet."""
        if not self.path.is_file():
            return {}
        return json.loads(self.path.read_text(encoding="utf-8"))

    def is_approved(self, partition: PartitionFile, entries: dict[str, dict[str, object]] | None = None) -> bool:
        """True when the partition's current bytes are the ones that passed."""
        entry = (self.read() if entries is None else entries).get(partition.name)
        return entry is not None and partition.path.is_file() and entry.get("sha256") == sha256(partition.path)

    def approve(self, partitions: list[PartitionFile], digests: dict[str, str], run: str) -> None:
        """Record that these partitions passed, with the digests they had when they were read for the check."""
        with file_lock(self.path.with_suffix(".lock")):
            entries = self.read()
            for p in partitions:
                entries[p.name] = {"sha256": digests[p.name], "bytes": p.path.stat().st_size, "run": run}
            write_json_atomic(self.path, dict(sorted(entries.items())))

    def revoke(self, partitions: list[PartitionFile]) -> None:
        """Withdraw approval (a partition that failed now must not pass on an older approval of the same bytes)."""
        with file_lock(self.path.with_suffix(".lock")):
            entries = self.read()
            if any(p.name in entries for p in partitions):
                write_json_atomic(
                    self.path, {k: v for k, v in entries.items() if k not in {p.name for p in partitions}}
                )

    def require(self, partitions: list[PartitionFile], step: str) -> None:
        """Refuse (exit 2, naming every one) partitions that did not pass or changed since they passed."""
        entries = self.read()
        unchecked, changed = [], []
        for p in partitions:
            entry = entries.get(p.name)
            if entry is None:
                unchecked.append(p.name)
                continue
            now = sha256(p.path)
            if entry.get("sha256") != now:
                changed.append(f"{p.name} (sha256 {str(entry['sha256'])[:12]}… then, {now[:12]}… now)")
        problems = ([f"not passed validate-data: {', '.join(unchecked)}"] if unchecked else []) + (
            [f"changed since validate-data passed them: {', '.join(changed)}"] if changed else []
        )
        if problems:
            raise StepError(
                f"{step} reads only validated source partitions; {'; '.join(problems)}; run validate-data for this "
                "window first"
            )


def ledger(home: Path) -> PartitionLedger:
    """The ledger of one MLRELEASE_HOME."""
    return PartitionLedger(home / "state" / "validated_partitions.json")
