"""The API's error answers: ApiError (status, code, detail) and the predict path's mapping of service exceptions."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from mlrelease.gateway.api_models import PredictRequest
from mlrelease.gateway.auth import Authenticator
from mlrelease.gateway.config import AuthConfig
from mlrelease.gateway.online_features import FeatureStoreUnavailable, StaleFeatures, UnknownEntity
from mlrelease.gateway.service import RoutingStateMissing


class ApiError(Exception):
    """An error answered as ErrorResponse JSON with `status`."""

    def __init__(self, status: int, error: str, detail: str, headers: dict[str, str] | None = None, **extra: Any):
        super().__init__(detail)
        self.status, self.error, self.detail, self.headers, self.extra = status, error, detail, headers, extra

    def body(self) -> bytes:
        """The ErrorResponse JSON (`error`, `detail`, and any extra field that is set)."""
        fields = {"error": self.error, "detail": self.detail}
        fields.update({k: v for k, v in self.extra.items() if v is not None})
        return orjson.dumps(fields)


def client_checker(auth: AuthConfig, authenticator: Authenticator) -> Callable[[str | None], str]:
    """A function from the API key header's value to the client name; raises ApiError 401 or 429."""

    def check(key: str | None) -> str:
        if not auth.required:
            return "anonymous"
        client = authenticator.client_for(key)
        if client is None:
            raise ApiError(401, "unauthorized", f"missing or unknown API key in header {auth.header}")
        wait = authenticator.retry_after(client)
        if wait > 0:
            raise ApiError(
                429, "rate_limited", f"client {client} is over its rate limit", {"Retry-After": str(math.ceil(wait))}
            )
        return client

    return check


async def answer_predict(predict: Callable[[PredictRequest], Awaitable[dict[str, Any]]], body: PredictRequest) -> bytes:
    """The predict answer as JSON bytes; the service's refusals become ApiErrors."""
    try:
        return orjson.dumps(await predict(body))
    except StaleFeatures as exc:
        raise ApiError(400, "feature_stale", "features too old to serve", feature_stale_reason=str(exc)) from None
    except UnknownEntity as exc:
        raise ApiError(404, "unknown_entity", str(exc)) from None
    except FeatureStoreUnavailable as exc:
        raise ApiError(503, "feature_store_unavailable", str(exc)) from None
    except RoutingStateMissing as exc:
        raise ApiError(503, "routing_state_missing", str(exc)) from None
