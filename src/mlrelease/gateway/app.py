"""The gateway's ASGI app: FastAPI routes over one PredictService per served model, API keys, body limit, metrics
and probes."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from datetime import datetime
from typing import Any

from fastapi import Depends, FastAPI, Request, Response
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse
from fastapi.security import APIKeyHeader
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mlrelease.errors import StepError
from mlrelease.gateway.api_errors import ApiError, answer_predict, client_checker
from mlrelease.gateway.api_models import ERROR_RESPONSES, PredictRequest, response_model
from mlrelease.gateway.auth import Authenticator, read_keys
from mlrelease.gateway.batcher import BatchSettings, MicroBatcher
from mlrelease.gateway.config import GatewayConfig, load_config
from mlrelease.gateway.decision_log import DecisionLog
from mlrelease.gateway.guard import OutputRanges, output_ranges
from mlrelease.gateway.metrics import GatewayMetrics, ModelMetrics
from mlrelease.gateway.model_client import TritonModelClient
from mlrelease.gateway.online_features import BatchingLookup, FeatureLookup, wall_clock
from mlrelease.gateway.online_reader import OnlineReader
from mlrelease.gateway.predict_endpoint import PredictEndpoint
from mlrelease.gateway.router import Router
from mlrelease.gateway.routing_store_factory import open_routing_store
from mlrelease.gateway.run_pool_factory import open_run_pool
from mlrelease.gateway.service import PredictService
from mlrelease.release_spec import ReleaseSpec, spec_named
from mlrelease.serving.local_layout import triton_url
from mlrelease.serving.triton_client import host_port
from mlrelease.settings import Settings

log = logging.getLogger(__name__)
__all__ = ["ApiError", "create_app", "create_app_from_env"]


class BodyTooLarge(Exception):
    """The streamed body went over the limit."""


class BodySizeLimit:
    """ASGI middleware: 413 for a body over `max_bytes`, by Content-Length or while it streams in."""

    def __init__(self, app: ASGIApp, max_bytes: int, metrics: GatewayMetrics) -> None:
        self.app, self.max_bytes, self.metrics = app, max_bytes, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse early on Content-Length; count streamed bytes otherwise."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            self.metrics.rejections.labels("body_too_large").inc()
            response = _error_response(ApiError(413, "body_too_large", f"body over {self.max_bytes} bytes"))
            await response(scope, receive, send)
            return
        seen, overflow = 0, False

        async def limited() -> Message:
            nonlocal seen, overflow
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                overflow = True
                raise BodyTooLarge(f"body over {self.max_bytes} bytes")
            return message

        async def unless_overflowed(message: Message) -> None:
            if not overflow:  # FastAPI turns a failed body read into its own 400: drop it, we answer 413 below
                await send(message)

        try:
            await self.app(scope, limited, unless_overflowed)
        except BodyTooLarge:
            pass
        if overflow:
            self.metrics.rejections.labels("body_too_large").inc()
            await _error_response(ApiError(413, "body_too_large", f"body over {self.max_bytes} bytes"))(
                scope, receive, send
            )


def _error_response(exc: ApiError) -> Response:
    return Response(exc.body(), status_code=exc.status, headers=exc.headers, media_type="application/json")


def _replay_or_wall_clock(config: GatewayConfig) -> Callable[[], datetime]:
    as_of = config.replay_as_of
    return (lambda: as_of) if as_of is not None else wall_clock


def create_app(config: GatewayConfig, settings: Settings) -> FastAPI:
    """The gateway app serving the config's models; stores, Triton and the routing refresh open in its lifespan."""
    metrics = GatewayMetrics()
    keys = read_keys(config.keys_file(settings))
    if config.auth.required and not keys.clients:
        raise StepError(
            f"no API clients in {config.keys_file(settings)}: add one with `mlrelease gateway-key add NAME` "
            "(or set auth.required: false for a closed test network)"
        )
    host_port(config.triton_url or triton_url())  # a malformed URL fails here, not inside a worker's lifespan
    specs = {name: spec_named(name) for name in config.served_models}  # an undeclared model fails here, named
    routers = {
        name: Router(
            open_routing_store(config.state_url(settings, name), name),
            metrics.for_model(name),
            config.routing.refresh_interval_s,
            name,
            config.routing.arm,
        )
        for name in config.served_models
    }
    app = FastAPI(title="mlrelease gateway", version="1", lifespan=_lifespan(config, settings, specs, routers, metrics))
    check_client = client_checker(config.auth, Authenticator(keys, config.auth.default_rate))
    app.add_middleware(BodySizeLimit, max_bytes=config.max_body_bytes, metrics=metrics)
    # Added last, so it runs first: predict requests never pay for the body-limit wrapper or the router.
    app.add_middleware(
        PredictEndpoint,
        check_client=check_client,
        key_header=config.auth.header,
        max_body_bytes=config.max_body_bytes,
        metrics=metrics,
        models=config.served_models,
    )
    authenticate = _authentication(config, check_client)
    for name, spec in specs.items():
        _add_model_routes(app, spec, routers[name], authenticate, default=name == config.model)
    _add_ops_routes(app, routers, metrics)
    _install_error_handlers(app, metrics)
    app.state.config, app.state.metrics = config, metrics
    app.state.services = {}  # model -> PredictService, filled by the lifespan
    return app


def _lifespan(
    config: GatewayConfig,
    settings: Settings,
    specs: dict[str, ReleaseSpec],
    routers: dict[str, Router],
    metrics: GatewayMetrics,
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        from mlrelease.feast_store import open_store

        store = open_store(settings)  # one Feast store; each model reads its own feature service through it
        async with AsyncExitStack() as stack:
            for name, spec in specs.items():
                app.state.services[name] = await stack.enter_async_context(
                    _served_model(config, settings, spec, store, routers[name], metrics.for_model(name))
                )
            # Everything imported and built so far lives as long as the process: keep it out of every later
            # collection, which otherwise walks Feast's and pydantic's object graphs again and again under load.
            gc.collect()
            gc.freeze()
            yield

    return lifespan


@asynccontextmanager
async def _served_model(
    config: GatewayConfig, settings: Settings, spec: ReleaseSpec, store: Any, router: Router, metrics: ModelMetrics
) -> AsyncIterator[PredictService]:
    """One served model's predict path, open for as long as the app runs: its feature reads, Triton client,
    micro-batcher, decision log, failure-run pool and routing refresh (nothing shared with another model's)."""
    # Each resource is closed by the stack as soon as it exists: a failure later in this set-up (or in the next
    # model's) closes what was opened, and a failing close does not skip the others (the decision log's flush).
    async with AsyncExitStack() as opened:
        # The service's views are resolved once here; each read then goes straight to the online store.
        reader = OnlineReader(store, spec.features)
        inline = reader.prepare_local_reads(busy_timeout_ms=config.feature_timeout_ms)
        lookup = BatchingLookup(FeatureLookup(reader, _replay_or_wall_clock(config)), inline=inline)
        opened.push_async_callback(lookup.close)
        ranges = output_ranges(spec)
        model = TritonModelClient(config.triton_url or triton_url(), spec.name, ranges, spec.prediction_and_score())
        opened.push_async_callback(model.close)
        batcher = await _batcher(config, model, metrics, ranges)
        if batcher is not None:
            opened.push_async_callback(batcher.close)
        settings_log = config.decision_log
        decisions = DecisionLog(
            config.decision_dir(settings, spec.name),
            sample_rate=settings_log.sample_rate,
            with_features=settings_log.features,
            retention_hours=settings_log.retention_hours,
        )
        guard = config.guard
        state_url = config.state_url(settings, spec.name)
        pool = open_run_pool(state_url, spec.name, guard.pool_heartbeat_s) if guard.pool_runs else None
        if pool is not None:
            opened.push_async_callback(pool.close)
        service = PredictService(config, spec, lookup, model, router, metrics, decisions, batcher, pool)
        if service.reporter is not None:
            opened.push_async_callback(service.reporter.close)
        await router.refresh()
        router.start()
        opened.push_async_callback(router.stop)
        decisions.start()
        opened.push_async_callback(decisions.stop)
        if pool is not None:
            heartbeat = asyncio.create_task(_heartbeat(service, guard.pool_heartbeat_s))
            opened.push_async_callback(_cancelled, heartbeat)
        yield service


async def _cancelled(task: asyncio.Task[None]) -> None:
    """Cancel a background task and wait until it has ended."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _heartbeat(service: PredictService, every_s: float) -> None:
    """Keep this replica in the failure-run pool (gateway/run_pool.py) for as long as it serves."""
    while True:
        service.heartbeat()
        await asyncio.sleep(every_s)


async def _batcher(
    config: GatewayConfig, model: TritonModelClient, metrics: ModelMetrics, ranges: OutputRanges
) -> MicroBatcher | None:
    """The micro-batcher (None when batching is off), its batch size capped by the model's max_batch_size."""
    batching = config.batching
    if not batching.enabled:
        return None
    max_batch = batching.max_batch
    model_max = await model.max_batch_size()  # None while Triton is down: the configured size stands
    if model_max is not None and model_max > 0 and model_max < max_batch:
        log.warning(
            "batching.max_batch %d is above %s's max_batch_size %d: using %d",
            max_batch,
            model.model,
            model_max,
            model_max,
        )
        max_batch = model_max
    settings = BatchSettings(max_batch, batching.max_delay_ms / 1000, batching.max_in_flight)
    return MicroBatcher(model.infer_rows, settings, ranges, metrics.observe_batch, outputs=model.outputs)


def _authentication(config: GatewayConfig, check_client: Callable[[str | None], str]) -> Callable[..., Awaitable[str]]:
    """The dependency that resolves the API key to a client and applies its rate limit."""
    api_key = APIKeyHeader(name=config.auth.header, auto_error=False, description="API key of the calling client")

    async def authenticate(key: str | None = Depends(api_key)) -> str:
        return check_client(key)

    return authenticate


def _add_model_routes(
    app: FastAPI, spec: ReleaseSpec, router: Router, authenticate: Callable[..., Awaitable[str]], *, default: bool
) -> None:
    """One served model's documented operations: predict and routing at /v1/models/<name>/…, and at /v1/… for the
    default model (the paths a one-model gateway always had)."""
    prefixes = [f"/v1/models/{spec.name}", *(["/v1"] if default else [])]
    for prefix in prefixes:
        _add_predict_route(app, f"{prefix}/predict", spec, authenticate)
        _add_routing_route(app, f"{prefix}/routing", router, authenticate)


def _add_predict_route(app: FastAPI, path: str, spec: ReleaseSpec, authenticate: Callable[..., Awaitable[str]]) -> None:
    @app.post(
        path,
        response_model=response_model(spec),
        responses=ERROR_RESPONSES,
        operation_id=f"predict_{spec.name}" + ("" if path.startswith("/v1/models/") else "_default"),
        summary=f"Predict with {spec.name}",
    )
    async def predict(request: Request, body: PredictRequest, client: str = Depends(authenticate)) -> Response:
        """Answer one order with the model version its cohort is routed to (the fallback rule if none can)."""
        # PredictEndpoint answers these requests before routing; this route documents the operation (OpenAPI)
        # and answers the same way wherever the app runs without that middleware.
        service: PredictService = request.app.state.services[spec.name]
        return Response(await answer_predict(service.predict, body), media_type="application/json")


def _add_routing_route(app: FastAPI, path: str, router: Router, authenticate: Callable[..., Awaitable[str]]) -> None:
    @app.get(
        path,
        responses={401: ERROR_RESPONSES[401], 429: ERROR_RESPONSES[429]},
        operation_id=f"routing_{router.model}" + ("" if path.startswith("/v1/models/") else "_default"),
        summary=f"Routing of {router.model}",
    )
    async def routing(client: str = Depends(authenticate)) -> dict[str, Any]:
        """The model's routing state on this replica, its own guard trips, and any error reading the store."""
        state = router.state
        return {
            "state": state.model_dump(mode="json") if state else None,
            "locally_tripped": sorted(router.locally_tripped),
            "store": router.store.location,
            "store_error": router.last_error,
        }


def _add_ops_routes(app: FastAPI, routers: dict[str, Router], metrics: GatewayMetrics) -> None:
    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/readyz", responses={503: {"description": "not ready; the body says why"}})
    async def readyz(request: Request, response: Response) -> dict[str, Any]:
        """Readiness: a routing state is known for a served model, so its requests get an answer (the model's, or
        the rule's); `models` tells each served model's state, the top-level fields the default model's.

        Triton without a ready stable version degrades the answers, not the gateway: `mode` says
        `rule_fallback`, and the replica stays in its Service. Were it unready, a Triton restart longer than
        the probe's window would take every replica out at once, though each could still answer by the rule.
        Likewise a model with no routing state yet (before its first release) does not take the others'
        replicas out: the replica is ready while any served model has a state.
        """
        services = request.app.state.services
        states = await asyncio.gather(*(_model_readiness(r, services.get(name)) for name, r in routers.items()))
        each = dict(zip(routers, states, strict=True))
        ready = any(model["ready"] for model in each.values())
        if not ready:
            response.status_code = 503
        default = each[request.app.state.config.model]
        return {**default, "ready": ready, "models": each}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus() -> Response:
        """Prometheus exposition of this process's metrics, rendered off the event loop: with a rollout's per-unit
        arm series it is tens of thousands of lines, and calls in flight must not wait for it (a candidate's
        shorter timeout would fail them first)."""
        return Response(await asyncio.to_thread(metrics.exposition), media_type=CONTENT_TYPE_LATEST)


async def _model_readiness(router: Router, service: PredictService | None) -> dict[str, Any]:
    """One served model's readiness: whether a routing state is known, and whether its stable version answers."""
    state = router.state
    stable_ready = state is not None and service is not None and await service.model.version_ready(state.stable_version)
    return {
        "ready": state is not None,
        "mode": "model" if stable_ready else ("rule_fallback" if state is not None else "no_routing_state"),
        "stable_ready": stable_ready,
        "routing_revision": state.revision if state else None,
        "stable_version": state.stable_version if state else None,
        "store_ok": router.last_error is None,  # details only on the authenticated /v1/…/routing
    }


def _install_error_handlers(app: FastAPI, metrics: GatewayMetrics) -> None:
    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        metrics.rejections.labels(exc.error).inc()
        return _error_response(exc)

    async def invalid(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        metrics.rejections.labels("validation").inc()
        return await request_validation_exception_handler(request, exc)

    handlers: dict[type[Exception], Callable[[Request, Exception], Awaitable[Response]]] = {
        ApiError: api_error,
        RequestValidationError: invalid,
    }
    for exc_type, handler in handlers.items():
        app.add_exception_handler(exc_type, handler)


def create_app_from_env() -> FastAPI:
    """App factory for uvicorn workers: config from MLRELEASE_GATEWAY_CONFIG, settings from the environment."""
    as_of = os.environ.get("MLRELEASE_GATEWAY_REPLAY_AS_OF")  # set by `mlrelease gateway --as-of … --workers N`
    return create_app(load_config(replay_as_of=as_of), Settings.from_env())
