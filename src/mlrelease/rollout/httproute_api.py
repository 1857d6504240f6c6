"""Reading and patching one HTTPRoute through the Kubernetes API (the `kubernetes` client library)."""

from __future__ import annotations

import os
from typing import Any, Protocol

from mlrelease.errors import StepError
from mlrelease.rollout.httproute import GROUP, PLURAL, VERSION


class RouteConflict(StepError):
    """The route changed between our read and our patch (its resourceVersion moved on)."""


class RouteApi(Protocol):
    """The two calls the HTTPRoute router needs; RBAC grants the step exactly these (get, patch) on one name."""

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The route object, or None when it does not exist."""

    def patch(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386); a `metadata.resourceVersion` in the body makes it conditional."""


class KubernetesRouteApi:
    """RouteApi over `CustomObjectsApi`: in-cluster credentials in a pod, else the kubeconfig (KUBECONFIG).

    :param api_client: a configured `kubernetes.client.ApiClient` (tests point one at a local server).
    """

    def __init__(self, api_client: Any = None) -> None:
        from kubernetes import client, config

        if api_client is None:
            if os.environ.get("KUBERNETES_SERVICE_HOST"):
                config.load_incluster_config()
            else:
                # KUBECONFIG as it is now: the library reads it once, at import, for its default
                config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
            api_client = client.ApiClient()
        self.api = client.CustomObjectsApi(api_client)

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """GET the route; 404 is None, any other refusal a StepError that names it."""
        from kubernetes.client.exceptions import ApiException

        try:
            return dict(self.api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _refused("read", namespace, name, exc) from None

    def patch(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """PATCH the route with a merge patch (the client's content type for a dict body)."""
        from kubernetes.client.exceptions import ApiException

        try:
            return dict(self.api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, body))
        except ApiException as exc:
            if exc.status == 409:
                raise RouteConflict(
                    f"HTTPRoute {namespace}/{name} changed while the rollout was patching it; rerun the step"
                ) from None
            raise _refused("patch", namespace, name, exc) from None


def _refused(verb: str, namespace: str, name: str, exc: Any) -> StepError:
    hint = {
        401: "the step has no valid Kubernetes credentials",
        403: f"RBAC: the step's service account may not {verb} this HTTPRoute (see deploy/ RBAC)",
        422: "the API server rejected the object as invalid",
    }.get(exc.status, "the Kubernetes API refused the call")
    detail = str(getattr(exc, "body", "") or exc.reason)[:300]
    return StepError(f"cannot {verb} HTTPRoute {namespace}/{name}: {hint} (HTTP {exc.status}: {detail})")
