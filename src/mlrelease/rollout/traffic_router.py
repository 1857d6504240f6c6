"""`TrafficRouter`: how the rollout moves traffic. One Protocol; one implementation per file; a factory.

The built-in implementation writes the gateway's routing document (`gateway_router.py`). A cluster that
already runs a Gateway API controller can route with an HTTPRoute instead (`httproute_router.py`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
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

    def serving_versions(self) -> list[int]:
        """Versions this routing sends traffic to: stable, and the candidate when any cohort has a share."""
        receives = self.candidate_version is not None and any(p > 0 for p in self.candidate_percent.values())
        return [self.stable_version, *([self.candidate_version] if receives else [])]  # type: ignore[list-item]


class TrafficRouter(Protocol):
    """Applies routing atomically: readers see the old routing or the new one, never a mix."""

    location: str
    # The metrics sources (MLRELEASE_METRICS_SOURCE names) that see the traffic this router sends:
    # guardrails judged from any other source would see nothing, so no stage opens without one.
    observed_by: frozenset[str]

    def current(self) -> Routing | None:
        """The routing in force, or None before the first write."""

    def apply(self, routing: Routing, *, reason: str, clear_trips: bool = False) -> Routing:
        """Replace the routing in one atomic write (after checking every routed version is served)."""


ROUTERS = ("gateway", "httproute")


def open_traffic_router(settings: Settings, model: str) -> TrafficRouter:
    """The router named by MLRELEASE_TRAFFIC_ROUTER: `gateway` (default, the built-in routing state) or `httproute`."""
    kind = os.environ.get("MLRELEASE_TRAFFIC_ROUTER", "gateway")
    if kind == "gateway":
        from mlrelease.rollout.gateway_router import GatewayTrafficRouter

        mounted = os.environ.get("MLRELEASE_HTTPROUTE_CONFIG")
        if mounted and Path(mounted).is_file():
            # deploy/ mounts the router config only in httproute mode: routing the gateway's state there
            # would move no real traffic while the rollout believes it did.
            raise StepError(
                f"the cluster routes with an HTTPRoute ({mounted} is mounted), but MLRELEASE_TRAFFIC_ROUTER is "
                "'gateway': set MLRELEASE_TRAFFIC_ROUTER=httproute in Airflow's environment"
            )

        return GatewayTrafficRouter.from_settings(settings, model)
    if kind == "httproute":
        from mlrelease.gateway.config import load_config
        from mlrelease.rollout.httproute_router import HTTPRouteTrafficRouter

        router = HTTPRouteTrafficRouter.from_config()
        if router.config.model != model:
            raise StepError(f"HTTPRoute config serves model {router.config.model!r}, the rollout is of {model!r}")
        # A cohort without its own rule would silently follow the "*" share.
        cohorts = load_config().cohorts.names
        if set(router.config.cohorts) != set(cohorts):
            raise StepError(
                f"HTTPRoute config cohorts {sorted(router.config.cohorts)} differ from the gateway's {sorted(cohorts)}"
            )
        return router
    raise StepError(f"MLRELEASE_TRAFFIC_ROUTER must be one of {', '.join(ROUTERS)}; got {kind!r}")
