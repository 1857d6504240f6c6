"""The Gateway API TrafficRouter: the rollout drives an HTTPRoute instead of the gateway's routing state."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from mlrelease.errors import StepError
from mlrelease.rollout.httproute import (
    ANNOTATION_REASON,
    ANNOTATION_ROUTING,
    HTTPRouteConfig,
    load_httproute_config,
    parent_ref,
    route_rules,
    routing_annotation,
    routing_from_route,
)
from mlrelease.rollout.httproute_api import KubernetesRouteApi, RouteApi, RouteConflict
from mlrelease.rollout.traffic_router import Routing, TrafficRouter
from mlrelease.serving.triton_client import require_ready

ReadyCheck = Callable[[list[int]], None]


class HTTPRouteTrafficRouter:
    """Applies routing as one merge patch of one HTTPRoute, conditional on the resourceVersion it read.

    With `backends: triton` traffic on this path bypasses the mlrelease gateway: there is no fast guard
    (`tripped` is always empty, `clear_trips` has nothing to clear), and the gateway's decision log does not see
    it, so `observed_by` is empty and a rollout refuses to open a stage (rollbacks and manual routing work).
    With `backends: gateways` the route assigns users to the stable or the candidate gateways (`arms`, the
    gateways' routing document, says which version each arm serves): every call is observed there, the fast guard
    trips as in gateway mode, and a change writes the versions first, then moves the route.

    :param config: which route, which backend, which cohorts.
    :param api: the Kubernetes calls (get, patch).
    :param ready_check: refuses (StepError) unless every listed version is ready on Triton.
    :param poll_s: how often to look for the controller's verdict on a change.
    :param arms: with `backends: gateways`, the routing document the arm gateways read.
    :param arms_refresh_s: how often those gateways read it (a new candidate is known to them before traffic moves).
    """

    def __init__(
        self,
        config: HTTPRouteConfig,
        api: RouteApi,
        ready_check: ReadyCheck,
        *,
        poll_s: float = 0.5,
        arms: TrafficRouter | None = None,
        arms_refresh_s: float = 1.0,
    ) -> None:
        self.config, self.api, self.ready_check, self.poll_s = config, api, ready_check, poll_s
        self.arms, self.arms_refresh_s = arms, arms_refresh_s
        if (arms is None) != (config.backends == "triton"):
            raise StepError(f"HTTPRoute backends {config.backends!r} and the arm gateways' routing disagree")
        self.location = f"httproute://{config.namespace}/{config.name}"
        self.observed_by: frozenset[str] = arms.observed_by if arms is not None else frozenset()

    @classmethod
    def from_config(
        cls, config: HTTPRouteConfig | None = None, arms: TrafficRouter | None = None
    ) -> HTTPRouteTrafficRouter:
        """The route of `config` (default: config/httproute.yaml) over the cluster's API."""
        config = config or load_httproute_config()

        def ready(versions: list[int]) -> None:
            require_ready(config.triton_url, config.model, versions)

        return cls(config, KubernetesRouteApi(), ready, arms=arms)

    def _read(self) -> dict[str, Any]:
        route = self.api.get(self.config.namespace, self.config.name)
        if route is None:
            raise StepError(
                f"HTTPRoute {self.config.namespace}/{self.config.name} does not exist in the cluster: create it "
                "(mlrelease deploy render, then kubectl apply) before a rollout; no traffic was moved"
            )
        return route

    def current(self) -> Routing | None:
        """The routing the route carries (StepError when the route is missing, not ours, or hand-edited), with the
        arm gateways' fast-guard trips."""
        routing = routing_from_route(self.config, self._read())
        trips = self.arms.current() if self.arms is not None else None
        return replace(routing, tripped=dict(trips.tripped)) if trips is not None else routing

    def apply(self, routing: Routing, *, reason: str, clear_trips: bool = False) -> Routing:
        """Check the route exists and is ours, the versions are ready; patch; wait for the controller.

        With arm gateways, their routing document first (which version each arm serves, the trips): a new candidate
        is known to the candidate gateways before the route sends them anyone, and on a rollback they answer from
        stable within a refresh, before the route has even moved.
        """
        route = self._read()
        before = routing_from_route(self.config, route)
        serving = [routing.stable_version]
        if routing.candidate_version is not None and any(p > 0 for p in routing.candidate_percent.values()):
            serving.append(routing.candidate_version)
        self.ready_check(serving)
        if self.arms is not None:
            known = self.arms.current()
            self.arms.apply(routing, reason=reason, clear_trips=clear_trips)
            if known is None or known.candidate_version != routing.candidate_version:
                time.sleep(2 * self.arms_refresh_s)  # every arm gateway read it
        new = Routing(
            stable_version=routing.stable_version,
            candidate_version=routing.candidate_version,
            candidate_percent=dict(routing.candidate_percent),
            revision=before.revision + 1,
        )
        try:
            patched = self._patch(route, new, reason)
        except RouteConflict:
            # The controller's status writes move resourceVersion too. If the routing is still the one we
            # read, nobody else moved traffic: patch again once, conditional on the fresh version.
            route = self._read()
            if routing_from_route(self.config, route) != before:
                raise
            patched = self._patch(route, new, reason)
        self._wait_accepted(int(patched["metadata"].get("generation", 0)))
        return new

    def _patch(self, route: dict[str, Any], new: Routing, reason: str) -> dict[str, Any]:
        body = {
            "metadata": {
                # The patch applies only to the object we read: a concurrent writer makes it a 409.
                "resourceVersion": route["metadata"]["resourceVersion"],
                "annotations": {ANNOTATION_ROUTING: routing_annotation(new), ANNOTATION_REASON: reason[:500]},
            },
            "spec": {"rules": route_rules(self.config, new)},
        }
        return self.api.patch(self.config.namespace, self.config.name, body)

    def _wait_accepted(self, generation: int) -> None:
        """Until the controller has accepted `generation` for our parent: the change is live only then."""
        if self.config.accept_timeout_s <= 0:
            return
        deadline = time.monotonic() + self.config.accept_timeout_s
        while True:
            verdict = accepted(self._read(), parent_ref(self.config), generation, self.config.namespace)
            if verdict is True:
                return
            if isinstance(verdict, str):
                raise StepError(f"HTTPRoute {self.config.namespace}/{self.config.name} was not accepted: {verdict}")
            if time.monotonic() >= deadline:
                raise StepError(
                    f"HTTPRoute {self.config.namespace}/{self.config.name}: no controller accepted generation "
                    f"{generation} within {self.config.accept_timeout_s:g} s (is a Gateway API controller running "
                    f"for Gateway {self.config.parent_gateway}?)"
                )
            time.sleep(self.poll_s)


def _same_parent(ref: dict[str, Any], parent: dict[str, Any], route_namespace: str) -> bool:
    # An absent namespace means the route's own; controllers often write it out in status.
    return (
        ref.get("name") == parent["name"]
        and (ref.get("namespace") or route_namespace) == (parent.get("namespace") or route_namespace)
        and ref.get("sectionName") == parent.get("sectionName")
    )


def accepted(route: dict[str, Any], parent: dict[str, Any], generation: int, route_namespace: str) -> bool | str | None:
    """True when the parent's Accepted and ResolvedRefs conditions are True for `generation`;
    the reason text when the controller refused it; None while it has not looked at `generation` yet."""
    for status in (route.get("status") or {}).get("parents") or []:
        if not _same_parent(status.get("parentRef") or {}, parent, route_namespace):
            continue
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        wanted = [conditions.get("Accepted"), conditions.get("ResolvedRefs")]
        if any(c is None or int(c.get("observedGeneration", 0)) < generation for c in wanted):
            return None
        refused = [c for c in wanted if c is not None and c.get("status") != "True"]
        if refused:
            return "; ".join(f"{c['type']}={c.get('status')} ({c.get('reason')}: {c.get('message')})" for c in refused)
        return True
    return None
