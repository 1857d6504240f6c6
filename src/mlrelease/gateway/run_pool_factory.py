"""The factory of `RunPool` (gateway/run_pool.py): a pool wherever the replicas share a Redis routing state."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from mlrelease.gateway.redis_run_pool import RedisRunPool


def open_run_pool(state_url: str, model: str, heartbeat_s: float) -> RedisRunPool | None:
    """The pool beside a Redis routing state (the replicas that share it pool their runs); None for a file state."""
    if urlsplit(state_url).scheme not in ("redis", "rediss"):
        return None
    from mlrelease.gateway.redis_run_pool import RedisRunPool

    return RedisRunPool(state_url, model, live_s=3 * heartbeat_s)
