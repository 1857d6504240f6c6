"""The factory of `RoutingStore` (gateway/routing_store.py): the store a routing state URL names."""

from __future__ import annotations

from urllib.parse import urlsplit

from mlrelease.errors import StepError
from mlrelease.gateway.routing_store import RoutingStore


def open_routing_store(url: str, model: str) -> RoutingStore:
    """The store for a URL: file:///abs/path.json or redis://host:port/db."""
    parts = urlsplit(url)
    if parts.scheme == "file" and parts.path and parts.netloc not in ("", "localhost"):
        raise StepError(f"routing state URL {url!r} has a host; a file URL needs three slashes: file:///abs/path.json")
    if parts.scheme == "file" and parts.path:
        from mlrelease.gateway.file_routing_store import FileRoutingStore

        return FileRoutingStore(parts.path)
    if parts.scheme in ("redis", "rediss"):
        from mlrelease.gateway.redis_routing_store import RedisRoutingStore

        return RedisRoutingStore(url, model)
    raise StepError(f"routing state URL {url!r} is neither file:///path nor redis://host:port/db")
