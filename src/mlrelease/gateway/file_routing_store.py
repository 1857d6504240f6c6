"""Routing state in a JSON file: atomic replace under an flock, events appended to a JSON-lines log.

Good for one machine (several gateway processes included); several hosts need the Redis store.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mlrelease.gateway.routing_state import RoutingState
from mlrelease.gateway.routing_store import Mutation, RoutingStoreUnavailable, parse_state, stamp
from mlrelease.storage import file_lock, write_text_atomic


class FileRoutingStore:
    """See module docstring.

    :param path: the JSON document; `<path>.lock` and `<path>.events.jsonl` sit beside it.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.location = f"file://{self.path}"
        self._lock = self.path.with_name(self.path.name + ".lock")
        self._events = self.path.with_name(self.path.name + ".events.jsonl")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            lock = file_lock(self._lock)
            lock.__enter__()
        except OSError as exc:
            raise RoutingStoreUnavailable(f"routing state {self.location} cannot be locked: {exc}") from None
        try:
            yield
        finally:
            lock.__exit__(None, None, None)

    def read(self) -> RoutingState | None:
        """The current document, or None when the file does not exist yet."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise RoutingStoreUnavailable(f"routing state {self.location} cannot be read: {exc}") from None
        return parse_state(raw, self.location)

    def update(self, mutate: Mutation, *, by: str) -> RoutingState:
        """Read-modify-write under the lock; the file is replaced atomically, so readers never see half of it."""
        with self._locked():
            current = self.read()
            new = stamp(current, mutate(current), by)
            try:
                write_text_atomic(self.path, new.model_dump_json(indent=2) + "\n")
            except OSError as exc:  # disk full, read-only: nothing was replaced
                raise RoutingStoreUnavailable(f"routing state {self.location} cannot be written: {exc}") from None
            return new

    def append_event(self, event: dict[str, Any]) -> None:
        """Append one JSON line to the event log."""
        line = json.dumps(event, default=str, sort_keys=True) + "\n"
        with self._locked():
            try:
                with open(self._events, "a", encoding="utf-8") as fh:
                    fh.write(line)
            except OSError as exc:
                raise RoutingStoreUnavailable(f"routing events {self._events} cannot be written: {exc}") from None

    def read_events(self, limit: int = 100) -> list[dict[str, Any]]:
        """The newest `limit` events, oldest first."""
        if limit <= 0 or not self._events.is_file():
            return []
        lines = self._events.read_text(encoding="utf-8").splitlines()[-limit:]
        return [json.loads(line) for line in lines if line.strip()]
