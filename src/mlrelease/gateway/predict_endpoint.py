"""POST /v1/models/<name>/predict (and /v1/predict, the default model's) answered straight from ASGI, ahead of
FastAPI's routing, dependencies and response handling.

The documented FastAPI route (OpenAPI, /docs) stays; this middleware answers the same contract first,
because the framework's per-request machinery (middleware closures, dependency solving, body parsing
into a dict and validating it again, response wrapping) cost more CPU than the prediction itself.
Order and answers are FastAPI's: a body over the limit is a 413, a body that is not JSON a 422
`json_invalid`, then the API key (401, 429), then one validation pass (422 with the field's `loc`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from mlrelease.gateway.api_errors import ApiError, answer_predict
from mlrelease.gateway.api_models import PredictRequest
from mlrelease.gateway.metrics import GatewayMetrics

DEFAULT_PATH = "/v1/predict"
_MODEL_PREFIX, _PREDICT_SUFFIX = "/v1/models/", "/predict"
_JSON = (b"content-type", b"application/json")


class PredictEndpoint:
    """ASGI middleware: answers every served model's predict requests itself, passes everything else on.

    A predict path naming a model this gateway does not serve is a 404 `unknown_model` naming the ones it does.

    :param app: the rest of the app (FastAPI).
    :param check_client: API key value -> client name (raises ApiError 401/429).
    :param key_header: the API key header's name.
    :param max_body_bytes: larger bodies are refused with 413.
    :param metrics: rejections are counted here.
    :param models: the served models, the default one (POST /v1/predict) first.
    """

    def __init__(
        self,
        app: ASGIApp,
        check_client: Callable[[str | None], str],
        key_header: str,
        max_body_bytes: int,
        metrics: GatewayMetrics,
        models: tuple[str, ...],
    ) -> None:
        self.app, self.check_client, self.max_body_bytes, self.metrics = app, check_client, max_body_bytes, metrics
        self._key_header = key_header.lower().encode("latin-1")
        self._models = models
        self._paths = {DEFAULT_PATH: models[0], **{f"{_MODEL_PREFIX}{m}{_PREDICT_SUFFIX}": m for m in models}}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer a predict request; anything else goes to the app."""
        asked = self._asked(scope) if scope["type"] == "http" and scope["method"] == "POST" else None
        if asked is None:
            await self.app(scope, receive, send)
            return
        model, served = asked
        key = content_length = content_type = None
        for name, value in scope["headers"]:
            if name == self._key_header:
                key = value.decode("latin-1")
            elif name == b"content-length":
                content_length = value
            elif name == b"content-type":
                content_type = value
        try:
            raw = await self._body(receive, content_length)
            if raw is None:  # the client went away
                return
            status, body = 200, await self._predict(scope, model, served, raw, content_type, key)
            headers = [_JSON]
        except ApiError as exc:
            self.metrics.rejections.labels(exc.error).inc()
            status, body = exc.status, exc.body()
            headers = [_JSON, *((k.lower().encode(), v.encode()) for k, v in (exc.headers or {}).items())]
        except _Invalid as exc:
            self.metrics.rejections.labels("validation").inc()
            status, body, headers = 422, orjson.dumps({"detail": exc.errors}, default=str), [_JSON]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _asked(self, scope: Scope) -> tuple[str, bool] | None:
        """The model a predict path names and whether it is served here (a model not served gets a 404 naming the
        served ones); None for any other path."""
        model = self._paths.get(scope["path"])
        if model is not None:
            return model, True
        unknown = _asked_model(scope["path"])
        return None if unknown is None else (unknown, False)

    async def _body(self, receive: Receive, content_length: bytes | None) -> bytes | None:
        """The request body, refused (413) by its Content-Length or once it streams past the limit."""
        if content_length is not None and content_length.isdigit() and int(content_length) > self.max_body_bytes:
            raise self._too_large()
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.max_body_bytes:
                raise self._too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _too_large(self) -> ApiError:
        return ApiError(413, "body_too_large", f"body over {self.max_body_bytes} bytes")

    async def _predict(
        self, scope: Scope, model: str, served: bool, raw: bytes, content_type: bytes | None, key: str | None
    ) -> bytes:
        if not served:  # the API key first, as for a served model's path (the names are public: /readyz, OpenAPI)
            self.check_client(key)
            raise ApiError(
                404, "unknown_model", f"this gateway serves no model {model!r}; it serves {list(self._models)}"
            )
        payload: Any = None
        if raw and _is_json(content_type):
            try:
                payload = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise _Invalid(
                    [
                        {
                            "type": "json_invalid",
                            "loc": ["body", exc.pos],
                            "msg": "JSON decode error",
                            "input": {},
                            "ctx": {"error": exc.msg},
                        }
                    ]
                ) from None
        elif raw:
            payload = raw.decode("utf-8", "replace")  # not JSON by its content type: validation refuses it, as FastAPI
        self.check_client(key)  # after the JSON check and before validation, as FastAPI's dependency runs
        if payload is None:
            raise _Invalid([{"type": "missing", "loc": ["body"], "msg": "Field required", "input": None}])
        try:
            request = PredictRequest.model_validate(payload)
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
            raise _Invalid([{**e, "loc": ["body", *e["loc"]]} for e in errors]) from None
        return await answer_predict(scope["app"].state.services[model].predict, request)


class _Invalid(Exception):
    """A 422: FastAPI's RequestValidationError body (`detail`: a list of errors with their `loc`)."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__("invalid request")
        self.errors = errors


def _asked_model(path: str) -> str | None:
    """The model a /v1/models/<one segment>/predict path names (None for any other path)."""
    if not (path.startswith(_MODEL_PREFIX) and path.endswith(_PREDICT_SUFFIX)):
        return None
    name = path[len(_MODEL_PREFIX) : -len(_PREDICT_SUFFIX)]
    return name if name and "/" not in name else None


def _is_json(content_type: bytes | None) -> bool:
    """FastAPI's rule: no content type, or application/json, or application/*+json."""
    if content_type is None:
        return True
    kind = content_type.split(b";", 1)[0].strip().lower()
    return kind == b"application/json" or (kind.startswith(b"application/") and kind.endswith(b"+json"))
