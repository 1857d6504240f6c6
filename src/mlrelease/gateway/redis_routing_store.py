"""Routing state in Redis, shared by every gateway replica: a JSON string updated with WATCH/MULTI, a stream of events.

Keys: `mlrelease:routing:<model>` (the document) and `mlrelease:routing:<model>:events` (a capped stream).
Timeouts are short so a Redis outage is reported in well under a second instead of hanging a request.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from mlrelease.gateway.routing_state import RoutingState
from mlrelease.gateway.routing_store import (
    Mutation,
    RevisionConflict,
    RoutingStoreUnavailable,
    parse_state,
    stamp,
)

MAX_EVENTS = 10_000


def redacted(url: str) -> str:
    """The URL without its userinfo (a Redis password must not reach logs or API answers)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", "")).rstrip("/")


WRITE_ATTEMPTS = 20


class RedisRoutingStore:
    """See module docstring.

    :param url: redis://host:port/db.
    :param model: the model whose routing document this is.
    """

    def __init__(self, url: str, model: str, timeout_s: float = 0.5) -> None:
        self.location = f"{redacted(url)}#mlrelease:routing:{model}"  # shown in errors and /v1/routing
        self._key = f"mlrelease:routing:{model}"
        self._events = f"{self._key}:events"
        # One quick retry, not redis-py's default of three with up to 10 s backoff: an outage must show in < 1 s.
        self._redis = redis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(ExponentialBackoff(cap=0.1, base=0.02), 1),
        )

    def _unavailable(self, exc: Exception) -> RoutingStoreUnavailable:
        return RoutingStoreUnavailable(f"routing state {self.location} is unreachable: {exc}")

    def read(self) -> RoutingState | None:
        """The current document, or None when the key does not exist yet."""
        try:
            raw = self._redis.get(self._key)
        except redis.RedisError as exc:
            raise self._unavailable(exc) from None
        return None if raw is None else parse_state(raw, self.location)  # type: ignore[arg-type]

    def update(self, mutate: Mutation, *, by: str) -> RoutingState:
        """Optimistic read-modify-write: WATCH the key, write in MULTI, retry when another writer got in first."""
        try:
            with self._redis.pipeline() as pipe:
                for _ in range(WRITE_ATTEMPTS):
                    try:
                        pipe.watch(self._key)
                        raw = pipe.get(self._key)
                        current = None if raw is None else parse_state(raw, self.location)  # type: ignore[arg-type]
                        new = stamp(current, mutate(current), by)
                        pipe.multi()
                        pipe.set(self._key, new.model_dump_json())
                        pipe.execute()
                        return new
                    except redis.WatchError:
                        continue
        except redis.RedisError as exc:
            raise self._unavailable(exc) from None
        raise RevisionConflict(f"routing state {self.location} changed under us {WRITE_ATTEMPTS} times; try again")

    def append_event(self, event: dict[str, Any]) -> None:
        """XADD one event to the capped stream."""
        try:
            self._redis.xadd(self._events, {"event": json.dumps(event, default=str)}, maxlen=MAX_EVENTS)
        except redis.RedisError as exc:
            raise self._unavailable(exc) from None

    def read_events(self, limit: int = 100) -> list[dict[str, Any]]:
        """The newest `limit` events, oldest first."""
        if limit <= 0:
            return []
        try:
            entries = self._redis.xrevrange(self._events, count=limit)
        except redis.RedisError as exc:
            raise self._unavailable(exc) from None
        return [json.loads(fields[b"event"]) for _, fields in reversed(list(entries))]  # type: ignore[arg-type]
