"""The built-in TrafficRouter: the gateway's routing document (file or Redis), read by every replica."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from mlrelease.errors import StepError
from mlrelease.gateway.config import step_gateway_config
from mlrelease.gateway.routing_state import RoutingState
from mlrelease.gateway.routing_store import RoutingStore
from mlrelease.gateway.routing_store_factory import open_routing_store
from mlrelease.rollout.traffic_router import Routing
from mlrelease.serving.local_layout import triton_url
from mlrelease.serving.triton_client import require_ready
from mlrelease.settings import Settings


class GatewayTrafficRouter:
    """Writes the gateway's routing state; refuses to route to a version Triton does not have ready.

    :param store: the routing store the gateway replicas read.
    :param model: the model name.
    :param triton: the Triton the gateway calls (checked inside the write, so the stored routing was checked).
    """

    def __init__(self, store: RoutingStore, model: str, triton: str, settings: Settings | None = None) -> None:
        self.store, self.model, self.triton, self.settings = store, model, triton, settings
        self.location = store.location
        # every call it routes lands in the decision log and in the replicas' arm series Prometheus scrapes
        self.observed_by = frozenset({"decision_log", "prometheus"})

    @classmethod
    def from_settings(cls, settings: Settings, model: str) -> GatewayTrafficRouter:
        """The store and Triton named by the gateway config the settings name (or config/gateway.yaml)."""
        config = step_gateway_config(settings)
        store = open_routing_store(config.state_url(settings, model), model)
        return cls(store, model, config.triton_url or triton_url(), settings)

    def current(self) -> Routing | None:
        """The routing document in force, as a Routing."""
        state = self.store.read()
        return None if state is None else _routing(state)

    def apply(self, routing: Routing, *, reason: str, clear_trips: bool = False) -> Routing:
        """One atomic write of the routing document; trips of versions still routed are kept unless cleared.

        A version the routing needs but Triton lost (a restart) is reloaded first, from the repository's
        policy, with a bounded wait: a rollback reaches stable without a person unless stable cannot load.
        """

        def build(trips: tuple[Any, ...]) -> RoutingState:
            try:
                return RoutingState(
                    model=self.model,
                    stable_version=routing.stable_version,
                    candidate_version=routing.candidate_version,
                    candidate_percent=dict(routing.candidate_percent),
                    guard_trips=tuple(t for t in trips if t.version == routing.candidate_version),
                )
            except ValidationError as exc:
                raise StepError(f"refused routing change: {exc.errors()[0]['msg']}") from None

        if self.settings is not None:  # outside the store's lock: a reload takes seconds
            from mlrelease.serving.reconcile import ensure_ready

            ensure_ready(self.settings, self.triton, routing.serving_versions())

        def mutate(current: RoutingState | None) -> RoutingState:
            state = build(() if clear_trips or current is None else current.guard_trips)
            require_ready(self.triton, self.model, state.serving_versions())
            return state

        state = self.store.update(mutate, by="rollout")
        self.store.append_event({"type": "rollout_routing", "revision": state.revision, "reason": reason})
        return _routing(state)


def _routing(state: RoutingState) -> Routing:
    return Routing(
        stable_version=state.stable_version,
        candidate_version=state.candidate_version,
        candidate_percent=dict(state.candidate_percent),
        tripped={t.version: t.reason for t in state.guard_trips},
        revision=state.revision,
    )
