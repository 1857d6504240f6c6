"""Request and response bodies of the gateway API (pydantic; FastAPI serves them as OpenAPI)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

if TYPE_CHECKING:
    from mlrelease.release_spec import ReleaseSpec

# Ids stay within 2**53 so every JSON client (JavaScript included) round-trips them exactly.
Id = Field(ge=1, le=2**53 - 1)


class SuppliedFeatures(BaseModel):
    """All model features, supplied by the caller instead of looked up (replays, shadow traffic, load tests).

    Supplied features skip the Feast lookup and its freshness check: the caller vouches for them.
    """

    model_config = ConfigDict(extra="forbid")

    tier: str = Field(max_length=32)
    account_age_days: int = Field(ge=0, le=100_000)
    orders_30d: int = Field(ge=0, le=1_000_000)
    avg_declared_value_30d: float = Field(ge=0, le=1e7)
    weight_kg: float = Field(ge=0, le=100_000)
    volume_l: float = Field(ge=0, le=1e6)
    declared_value: float = Field(ge=0, le=1e7)
    category: str = Field(max_length=32)
    is_bulky: bool
    region: str = Field(max_length=32)
    distance_km: float = Field(ge=0, le=50_000)
    is_remote: bool
    congestion_index: float = Field(ge=0, le=1)
    avg_transit_hours_7d: float = Field(ge=0, le=10_000)


class PredictRequest(BaseModel):
    """One order to estimate."""

    model_config = ConfigDict(extra="forbid")

    order_id: int = Id
    user_id: int = Id
    package_id: int = Id
    route_id: int = Id
    features: SuppliedFeatures | None = None


def response_model(spec: ReleaseSpec) -> type[BaseModel]:
    """The predict response of one model: its outputs under the names its release spec gives, and their source."""
    by_name = {o.name: o for o in spec.outputs}

    def output(name: str, what: str) -> tuple[type, Any]:
        low, high = by_name[name].valid
        bounds: dict[str, Any] = {k: v for k, v in (("ge", low), ("le", high)) if math.isfinite(v)}
        return float, Field(description=f"{what} (release spec output {name!r})", **bounds)

    prediction, score = spec.prediction_and_score()
    fields: dict[str, Any] = {
        "order_id": (int, ...),
        prediction: output(prediction, "the prediction"),
        score: output(score, "the score"),
        "model_version": (
            int | None,
            Field(description="the Triton version that answered; null for the fallback rule"),
        ),
        "cohort": (str, ...),
        "source": (Literal["model", "fallback_rule"], ...),
        "routing_revision": (int, ...),
    }
    name = "".join(part.title() for part in spec.name.split("_")) + "Response"
    model: type[BaseModel] = create_model(name, __doc__=f"The answer of {spec.name} and where it came from.", **fields)
    return model


class ErrorResponse(BaseModel):
    """Every error: a stable machine-readable code and a human-readable detail."""

    error: str
    detail: str
    feature_stale_reason: str | None = None


ERROR_RESPONSES: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorResponse, "description": "feature_stale: a feature is older than its freshness budget"},
    401: {"model": ErrorResponse, "description": "unauthorized: missing or unknown API key"},
    404: {"model": ErrorResponse, "description": "unknown_entity: an id has no features in the online store"},
    413: {"model": ErrorResponse, "description": "body_too_large: the request body exceeds the limit"},
    429: {"model": ErrorResponse, "description": "rate_limited: the client's rate limit is exhausted (Retry-After)"},
    503: {"model": ErrorResponse, "description": "feature_store_unavailable or routing_state_missing"},
}
