"""The factory of `TrafficRouter` (rollout/traffic_router.py): the router the settings name."""

from __future__ import annotations

from mlrelease.errors import StepError
from mlrelease.rollout.traffic_router import TrafficRouter
from mlrelease.settings import Settings

ROUTERS = ("gateway", "httproute")


def open_traffic_router(settings: Settings, model: str) -> TrafficRouter:
    """The router `settings.traffic_router` names: `gateway` (default, the built-in routing state) or `httproute`."""
    kind = settings.traffic_router
    if kind == "gateway":
        from mlrelease.rollout.gateway_router import GatewayTrafficRouter

        mounted = settings.httproute_config
        if mounted is not None and mounted.is_file():
            # deploy/ mounts the router config only in httproute mode: routing the gateway's state there
            # would move no real traffic while the rollout believes it did.
            raise StepError(
                f"the cluster routes with an HTTPRoute ({mounted} is mounted), but MLRELEASE_TRAFFIC_ROUTER is "
                "'gateway': set MLRELEASE_TRAFFIC_ROUTER=httproute in Airflow's environment"
            )

        return GatewayTrafficRouter.from_settings(settings, model)
    if kind == "httproute":
        from mlrelease.release_spec import spec_named
        from mlrelease.rollout.httproute import load_httproute_config
        from mlrelease.rollout.httproute_router import HTTPRouteTrafficRouter

        config = load_httproute_config(settings.httproute_config)
        arms = None
        if config.backends == "gateways":  # the route assigns users to the arm gateways; their document says which
            from mlrelease.gateway.config import step_gateway_config
            from mlrelease.rollout.gateway_router import GatewayTrafficRouter

            arms = GatewayTrafficRouter.from_settings(settings, model)
        router = HTTPRouteTrafficRouter.from_config(config, arms)
        if arms is not None:
            router.arms_refresh_s = step_gateway_config(settings).routing.refresh_interval_s
        if router.config.model != model:
            raise StepError(f"HTTPRoute config serves model {router.config.model!r}, the rollout is of {model!r}")
        # A cohort without its own rule would silently follow the "*" share.
        cohorts = spec_named(model).cohorts.names
        if set(router.config.cohorts) != set(cohorts):
            raise StepError(
                f"HTTPRoute config cohorts {sorted(router.config.cohorts)} differ from the gateway's {sorted(cohorts)}"
            )
        return router
    raise StepError(f"MLRELEASE_TRAFFIC_ROUTER must be one of {', '.join(ROUTERS)}; got {kind!r}")
