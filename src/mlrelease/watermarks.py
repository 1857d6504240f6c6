"""Durable per-feature-view watermarks: the newest event time materialized into the online store."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from mlrelease.storage import write_json_atomic
from mlrelease.timewindow import parse_timestamp


class WatermarkStore:
    """A JSON document of `{view: newest event time}` under the state directory, replaced atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, datetime]:
        """All watermarks; an absent file means nothing was materialized yet."""
        if not self.path.is_file():
            return {}
        raw = json.loads(self.path.read_text(encoding="utf-8"))
        return {view: parse_timestamp(ts) for view, ts in raw.items()}

    def advance(self, updates: dict[str, datetime]) -> dict[str, datetime]:
        """Move watermarks forward only (a backfill of an older window never makes a view look staler)."""
        current = self.read()
        for view, ts in updates.items():
            if view not in current or ts > current[view]:
                current[view] = ts
        write_json_atomic(self.path, {v: t.isoformat() for v, t in sorted(current.items())})
        return current
