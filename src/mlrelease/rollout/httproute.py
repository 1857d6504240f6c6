"""The Gateway API HTTPRoute that carries a rollout's routing: cohort header matches plus canary weights.

Pure functions only (no cluster access): `route_rules` turns a `Routing` into HTTPRoute rules, and
`routing_from_route` reads the routing back and refuses a route whose rules were changed by hand.

How the route routes (for clients that send the cohort in a header, e.g. an order service that knows
the customer's tier), with `backends: triton`:
- one rule per cohort: `PathPrefix /v2/models/<model>` and `<cohort_header>: <cohort>` exactly;
- one default rule, the path alone, for every other request (the "*" share);
- each rule has two backendRefs to the Triton Service, stable and candidate, weighted by the candidate's
  share; a `URLRewrite` filter per backend pins the model version
  (`/v2/models/m/infer` → `/v2/models/m/versions/<v>/infer`).
Gateway API gives header matches precedence over a path-only rule, so a cohort rule always wins.

With `backends: gateways` the route assigns *users*, not requests, and mlrelease gateways behind it observe every
call: clients also send the user's canary bucket (`<bucket_header>`: the user id's bucket in [0, 10000), four
digits, as `mlrelease.gateway.cohorts.bucket` computes it), and per cohort (and for the rest) one rule sends the
buckets below the candidate's share (a `RegularExpression` match on the bucket header) to the candidate gateways'
Service and one sends the others to the stable gateways' Service (gateway `routing.arm: candidate` / `stable`).
A user stays on one arm for the whole stage, and both arms' gateways export the per-arm series the Prometheus source
judges (and write the decision log). A rule with two header matches wins over one with one, and that over the path.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from mlrelease.errors import StepError
from mlrelease.gateway.cohorts import BUCKETS
from mlrelease.gateway.routing_state import ALL_COHORTS
from mlrelease.release_spec import process_spec
from mlrelease.rollout.traffic_router import Routing
from mlrelease.settings import REPO_ROOT
from mlrelease.yamlconfig import StrictModel, load_yaml_model

GROUP, VERSION, PLURAL, KIND = "gateway.networking.k8s.io", "v1", "httproutes", "HTTPRoute"
ANNOTATION_ROUTING = "mlrelease.io/routing"
ANNOTATION_REASON = "mlrelease.io/routing-reason"
# Weights are integers: 100 per percent keeps two decimals of a share (95.5 % → 9550 of 10000).
WEIGHT_PER_PERCENT = 100
TOTAL_WEIGHT = 100 * WEIGHT_PER_PERCENT
DEFAULT_CONFIG = REPO_ROOT / "config" / "httproute.yaml"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# RFC 7230 token: what Gateway API accepts as a header name.
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$")


class HTTPRouteConfig(StrictModel):
    """Which HTTPRoute the rollout drives, what it fronts and how cohorts are told apart.

    :param name: the HTTPRoute's name (the step's service account may patch only this object).
    :param namespace: its namespace.
    :param model: the Triton model the route serves.
    :param parent_gateway: the Gateway the route attaches to; `parent_namespace` / `section_name` narrow it.
    :param hostnames: hostnames the route answers for (empty: the Gateway's).
    :param backend_service: the Triton Service; `backend_port` its HTTP port.
    :param cohort_header: the request header carrying the cohort; `cohorts` the values given their own rule.
    :param triton_url: where the step checks that every routed version is ready before routing to it.
    :param accept_timeout_s: how long to wait for the controller to accept a change (0: do not wait).
    """

    name: str = "parcel-eta"
    namespace: str = "mlrelease"
    model: str = Field(default_factory=lambda: process_spec().name)
    parent_gateway: str = "inference"
    parent_namespace: str | None = None
    section_name: str | None = None
    hostnames: tuple[str, ...] = ()
    backend_service: str = "triton"
    backend_port: int = Field(8000, ge=1, le=65535)
    cohort_header: str = "x-mlrelease-cohort"
    cohorts: tuple[str, ...] = ("high_value", "long_tail")
    triton_url: str = "http://triton.mlrelease.svc:8000"
    accept_timeout_s: float = Field(60.0, ge=0)
    backends: Literal["triton", "gateways"] = "triton"
    stable_service: str = "mlrelease-gateway-stable"
    candidate_service: str = "mlrelease-gateway-candidate"
    gateway_port: int = Field(8080, ge=1, le=65535)
    bucket_header: str = "x-mlrelease-bucket"

    @field_validator("name", "backend_service", "parent_gateway", "stable_service", "candidate_service")
    @classmethod
    def _subdomain(cls, value: str) -> str:
        if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
            raise ValueError(f"{value!r} is not a DNS-1123 subdomain (lowercase letters, digits, '-', '.')")
        return value

    @field_validator("namespace", "parent_namespace")
    @classmethod
    def _label(cls, value: str | None) -> str | None:
        if value is not None and (len(value) > 63 or not _DNS_LABEL.match(value)):
            raise ValueError(f"{value!r} is not a DNS-1123 label (a namespace name)")
        return value

    @field_validator("cohort_header", "bucket_header")
    @classmethod
    def _header(cls, value: str) -> str:
        if not _HEADER_NAME.match(value):
            raise ValueError(f"{value!r} is not a valid HTTP header name")
        return value

    @field_validator("cohorts")
    @classmethod
    def _cohorts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if ALL_COHORTS in value or len(set(value)) != len(value) or not all(value):
            raise ValueError(f"cohorts must be distinct, non-empty names other than '*': {list(value)}")
        # Gateway API allows at most 16 rules; one is the default rule.
        if len(value) > 15:
            raise ValueError(f"at most 15 cohorts fit in one HTTPRoute, got {len(value)}")
        return value

    @model_validator(mode="after")
    def _rules_fit(self) -> HTTPRouteConfig:
        # Gateway API allows at most 16 rules: with gateways, two per cohort and two for the rest.
        if self.backends == "gateways" and 2 * (len(self.cohorts) + 1) > 16:
            raise ValueError(f"with backends: gateways at most 7 cohorts fit in one HTTPRoute, got {len(self.cohorts)}")
        if self.backends == "gateways" and self.stable_service == self.candidate_service:
            raise ValueError("stable_service and candidate_service must differ (one Service per arm)")
        return self

    @property
    def path_prefix(self) -> str:
        """The model's path prefix: `/v2/models/<model>` on Triton, `/v1/models/<model>` on the mlrelease gateways."""
        return f"/v1/models/{self.model}" if self.backends == "gateways" else f"/v2/models/{self.model}"


def load_httproute_config(path: Path | None = None) -> HTTPRouteConfig:
    """Read and validate the HTTPRoute config (default: config/httproute.yaml; a step passes its settings' path)."""
    path = Path(path or DEFAULT_CONFIG)
    return load_yaml_model(path, HTTPRouteConfig, "HTTPRoute config")


def weight(percent: float) -> int:
    """The candidate's integer weight (of TOTAL_WEIGHT) for a share in percent."""
    return round(percent * WEIGHT_PER_PERCENT)


def _backend(config: HTTPRouteConfig, version: int, weight_: int) -> dict[str, Any]:
    # group and kind spelled out: the API server fills in these CRD defaults, and the stored rules must
    # compare equal to the generated ones (routing_from_route refuses a route whose rules differ).
    return {
        "group": "",
        "kind": "Service",
        "name": config.backend_service,
        "port": config.backend_port,
        "weight": weight_,
        "filters": [
            {
                "type": "URLRewrite",
                "urlRewrite": {
                    "path": {
                        "type": "ReplacePrefixMatch",
                        "replacePrefixMatch": f"{config.path_prefix}/versions/{version}",
                    }
                },
            }
        ],
    }


def _backends(config: HTTPRouteConfig, routing: Routing, percent: float) -> list[dict[str, Any]]:
    if routing.candidate_version is None:
        return [_backend(config, routing.stable_version, TOTAL_WEIGHT)]
    share = weight(percent)
    return [
        _backend(config, routing.stable_version, TOTAL_WEIGHT - share),
        _backend(config, routing.candidate_version, share),
    ]


def _percent_for(routing: Routing, cohort: str) -> float:
    # The gateway's rule: a listed cohort has its own share, any other follows "*".
    shares = routing.candidate_percent
    return shares.get(cohort, shares.get(ALL_COHORTS, 0.0))


def buckets_below(limit: int) -> str:
    """An RE2 pattern matching the four-digit buckets (`0000`…`9999`) below `limit`, e.g. 700 → `^0[0-6][0-9]{2}$`."""
    if not 0 < limit <= BUCKETS:
        raise ValueError(f"a bucket limit is in (0, {BUCKETS}], got {limit}")
    if limit == BUCKETS:
        return "^[0-9]{4}$"
    digits = f"{limit:04d}"
    # Below `digits`: the same first i digits, then a smaller digit, then anything.
    branches = [
        f"{digits[:i]}{_below(int(digits[i]))}" + (f"[0-9]{{{3 - i}}}" if i < 3 else "")
        for i in range(4)
        if digits[i] != "0"
    ]
    return "^(" + "|".join(branches) + ")$" if len(branches) > 1 else f"^{branches[0]}$"


def _below(digit: int) -> str:
    return "0" if digit == 1 else f"[0-{digit - 1}]"


def _service(name: str, port: int) -> dict[str, Any]:
    return {"group": "", "kind": "Service", "name": name, "port": port, "weight": 1}


def _gateway_rules(config: HTTPRouteConfig, routing: Routing, path: Any) -> list[dict[str, Any]]:
    """Per cohort (then the rest): its candidate buckets to the candidate gateways, the others to the stable ones."""
    stable = [_service(config.stable_service, config.gateway_port)]
    candidate = [_service(config.candidate_service, config.gateway_port)]
    rules = []
    for cohort in (*config.cohorts, ALL_COHORTS):
        cohort_match = (
            [] if cohort == ALL_COHORTS else [{"type": "Exact", "name": config.cohort_header, "value": cohort}]
        )
        limit = round(_percent_for(routing, cohort) * BUCKETS / 100)  # as the gateway's own split: 7 % is 700
        if routing.candidate_version is not None and limit > 0:
            bucket = {"type": "RegularExpression", "name": config.bucket_header, "value": buckets_below(limit)}
            rules.append({"matches": [{"path": path(), "headers": [*cohort_match, bucket]}], "backendRefs": candidate})
        rules.append(
            {
                "matches": [{"path": path(), **({"headers": cohort_match} if cohort_match else {})}],
                "backendRefs": stable,
            }
        )
    return rules


def route_rules(config: HTTPRouteConfig, routing: Routing) -> list[dict[str, Any]]:
    """The HTTPRoute rules that send each cohort's requests to stable and candidate in the routing's shares."""

    def path() -> dict[str, str]:  # a fresh dict per rule: shared ones would dump as YAML anchors
        return {"type": "PathPrefix", "value": config.path_prefix}

    if config.backends == "gateways":
        return _gateway_rules(config, routing, path)

    rules = [
        {
            "matches": [{"path": path(), "headers": [{"type": "Exact", "name": config.cohort_header, "value": c}]}],
            "backendRefs": _backends(config, routing, _percent_for(routing, c)),
        }
        for c in config.cohorts
    ]
    rules.append({"matches": [{"path": path()}], "backendRefs": _backends(config, routing, _percent_for(routing, "*"))})
    return rules


def routing_annotation(routing: Routing) -> str:
    """The routing as the JSON annotation stored on the route (what `current()` reads back)."""
    return json.dumps(
        {
            "stable_version": routing.stable_version,
            "candidate_version": routing.candidate_version,
            "candidate_percent": dict(sorted(routing.candidate_percent.items())),
            "revision": routing.revision,
        },
        separators=(",", ":"),
    )


def parent_ref(config: HTTPRouteConfig) -> dict[str, Any]:
    """The route's parentRef: the Gateway (and listener) it attaches to."""
    ref: dict[str, Any] = {"group": GROUP, "kind": "Gateway", "name": config.parent_gateway}
    if config.parent_namespace:
        ref["namespace"] = config.parent_namespace
    if config.section_name:
        ref["sectionName"] = config.section_name
    return ref


def route_manifest(config: HTTPRouteConfig, routing: Routing, reason: str = "initial routing") -> dict[str, Any]:
    """The whole HTTPRoute object for `routing` (what `mlrelease deploy render` creates before any rollout)."""
    spec: dict[str, Any] = {"parentRefs": [parent_ref(config)], "rules": route_rules(config, routing)}
    if config.hostnames:
        spec["hostnames"] = list(config.hostnames)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": config.name,
            "namespace": config.namespace,
            "labels": {"app.kubernetes.io/part-of": "mlrelease", "mlrelease.io/model": config.model.replace("_", "-")},
            "annotations": {ANNOTATION_ROUTING: routing_annotation(routing), ANNOTATION_REASON: reason[:500]},
        },
        "spec": spec,
    }


def routing_from_route(config: HTTPRouteConfig, route: dict[str, Any]) -> Routing:
    """The routing a route carries; StepError when mlrelease did not create it or its rules were hand-edited."""
    where = f"HTTPRoute {config.namespace}/{config.name}"
    raw = ((route.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_ROUTING)
    if raw is None:
        # Not created by `mlrelease deploy render`: its rules may carry other paths that a patch would replace.
        raise StepError(
            f"{where} is not managed by mlrelease (no {ANNOTATION_ROUTING} annotation): create it from "
            "`mlrelease deploy render`'s create-once/ output; nothing was changed"
        )
    try:
        doc = json.loads(raw)
        routing = Routing(
            stable_version=int(doc["stable_version"]),
            candidate_version=None if doc.get("candidate_version") is None else int(doc["candidate_version"]),
            candidate_percent={str(k): float(v) for k, v in (doc.get("candidate_percent") or {}).items()},
            revision=int(doc.get("revision", 0)),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StepError(f"{where}: annotation {ANNOTATION_ROUTING} is not a routing document ({exc})") from None
    if (route.get("spec") or {}).get("rules") != route_rules(config, routing):
        # Someone (or something) changed the rules after mlrelease wrote them: moving traffic from an
        # unknown starting point could undo a human's emergency change, so refuse and say so.
        raise StepError(
            f"{where} was changed outside mlrelease: its rules no longer match the routing it records "
            f"(revision {routing.revision}); restore them (mlrelease deploy render) or re-apply the routing by hand"
        )
    return routing
