"""`TrafficRouter`: how the rollout moves traffic. One Protocol; one implementation per file; the factory in
`traffic_router_factory.py`.

The built-in implementation writes the gateway's routing document (`gateway_router.py`). A cluster that
already runs a Gateway API controller can route with an HTTPRoute instead (`httproute_router.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


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
