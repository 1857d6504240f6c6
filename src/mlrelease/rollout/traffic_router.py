"""`TrafficRouter`: how the rollout moves traffic. One Protocol; one implementation per file; a factory.

The built-in implementation writes the gateway's routing document (`gateway_router.py`). A cluster that
already runs a Gateway API controller can route with an HTTPRoute instead (a later implementation).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Protocol

from mlrelease.errors import StepError
from mlrelease.settings import Settings


@dataclass(frozen=True)
class Routing:
    """What traffic goes where: the stable version, the candidate and its share per cohort ("*" = the rest)."""

    stable_version: int
    candidate_version: int | None = None
    candidate_percent: dict[str, float] = field(default_factory=dict)
    tripped: dict[int, str] = field(default_factory=dict)  # version -> the fast guard's reason
    revision: int = 0


class TrafficRouter(Protocol):
    """Applies routing atomically: readers see the old routing or the new one, never a mix."""

    location: str

    def current(self) -> Routing | None:
        """The routing in force, or None before the first write."""

    def apply(self, routing: Routing, *, reason: str, clear_trips: bool = False) -> Routing:
        """Replace the routing in one atomic write (after checking every routed version is served)."""


ROUTERS = ("gateway",)


def open_traffic_router(settings: Settings, model: str) -> TrafficRouter:
    """The router named by MLRELEASE_TRAFFIC_ROUTER (default `gateway`: the built-in routing state)."""
    kind = os.environ.get("MLRELEASE_TRAFFIC_ROUTER", "gateway")
    if kind == "gateway":
        from mlrelease.rollout.gateway_router import GatewayTrafficRouter

        return GatewayTrafficRouter.from_settings(settings, model)
    raise StepError(f"MLRELEASE_TRAFFIC_ROUTER must be one of {', '.join(ROUTERS)}; got {kind!r}")
