"""The gateway's commands: `gateway`, `gateway-key add`, `routing show|set`, `traffic`."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import threading
from pathlib import Path
from typing import Any

from mlrelease.errors import StepError
from mlrelease.settings import Settings
from mlrelease.timewindow import parse_timestamp

DEFAULT_PORT = 8080


def _config(args: argparse.Namespace) -> Any:
    from mlrelease.gateway.config import load_config
    from mlrelease.release_spec import bind_process_model

    config = load_config(args.config, replay_as_of=getattr(args, "as_of", None))
    if len(config.served_models) == 1:
        # Steps' modules this command may import read the process model's contracts: it is the config's model.
        # A gateway serving several models binds none: each model's path holds its own spec (gateway/app.py).
        bind_process_model(config.model, named_by="the gateway config's model")
    return config


def default_workers(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """One gateway worker per CPU core this process may use: its affinity, capped by a cgroup CPU quota.

    A pod with `limits.cpu: 2` on a 64-core node sees 64 cores in its affinity; 64 workers would share
    two cores' worth of time and thrash, so the quota (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us`) wins.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # platforms without sched_getaffinity
        cores = os.cpu_count() or 1
    quota = _cgroup_cpu_quota(cgroup)
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def _cgroup_cpu_quota(cgroup: Path) -> float | None:
    """CPUs' worth of time the cgroup allows (None: no quota, or no cgroup files to read)."""
    try:
        if (cgroup / "cpu.max").is_file():  # v2: "max 100000" or "200000 100000"
            quota, period = (cgroup / "cpu.max").read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        v1 = cgroup / "cpu"
        if (v1 / "cpu.cfs_quota_us").is_file():
            quota_us = int((v1 / "cpu.cfs_quota_us").read_text())
            return None if quota_us <= 0 else quota_us / int((v1 / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None


def _cmd_gateway(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    import uvicorn

    from mlrelease.gateway.app import create_app

    config = _config(args)
    app = create_app(config, settings)  # validates config, keys and store URL before any worker starts
    if args.workers is None:
        args.workers = default_workers()
    if args.workers > 1:  # each worker builds its own app from the same config (a replica per process)
        if args.config:
            os.environ["MLRELEASE_GATEWAY_CONFIG"] = str(Path(args.config).resolve())
        if config.replay_as_of:
            os.environ["MLRELEASE_GATEWAY_REPLAY_AS_OF"] = config.replay_as_of.isoformat()
        target: Any = "mlrelease.gateway.app:create_app_from_env"
    else:
        target = app
    uvicorn.run(
        target,
        factory=args.workers > 1,
        host=args.host,
        port=args.port,
        workers=args.workers,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
        proxy_headers=False,  # nothing reads the client address; the middleware cost a header scan per request
    )
    return {}


def _cmd_key_add(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.gateway.auth import add_client
    from mlrelease.gateway.config import RateLimit

    config = _config(args)
    rate = RateLimit(per_second=args.rate_per_second, burst=args.burst) if args.rate_per_second else None
    path = config.keys_file(settings)
    return {"client": args.name, "api_key": add_client(path, args.name, rate), "keys_file": str(path)}


def _acting_config(args: argparse.Namespace) -> Any:
    """The gateway config as seen by a routing or traffic command: `model` is the model it acts on — the config's
    own, or, for a gateway serving several, the model this process releases (MLRELEASE_MODEL), one of them."""
    config = _config(args)
    if len(config.served_models) == 1:
        return config
    from mlrelease.release_spec import process_spec

    model = process_spec().name
    if model not in config.served_models:
        raise StepError(f"the gateway config serves {list(config.served_models)}, not {model!r} (MLRELEASE_MODEL)")
    return config.model_copy(update={"model": model})


def _store(args: argparse.Namespace, settings: Settings) -> Any:
    from mlrelease.gateway.routing_store_factory import open_routing_store

    config = _acting_config(args)
    return config, open_routing_store(config.state_url(settings), config.model)


def _cmd_routing_show(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    _, store = _store(args, settings)
    state = store.read()
    return {
        "store": store.location,
        "state": state.model_dump(mode="json") if state else None,
        "events": store.read_events(args.events),
    }


def parse_percents(items: list[str], cohorts: tuple[str, ...]) -> dict[str, float]:
    """`COHORT=PERCENT` items as a map; cohorts must be configured ones or `*`."""
    percents: dict[str, float] = {}
    for item in items:
        cohort, _, value = item.partition("=")
        if cohort not in (*cohorts, "*"):
            raise StepError(f"--percent names unknown cohort {cohort!r}; cohorts are {list(cohorts)} or '*'")
        try:
            percents[cohort] = float(value)
        except ValueError:
            raise StepError(f"--percent {item!r} is not COHORT=NUMBER") from None
    return percents


def _cmd_routing_set(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    config, store = _store(args, settings)

    def mutate(current: Any) -> Any:
        state = updated_state(current, args, config)
        if not args.skip_triton_check:  # inside the write: the checked document is the one stored
            from mlrelease.serving.local_layout import triton_url
            from mlrelease.serving.triton_client import require_ready

            require_ready(config.triton_url or triton_url(), config.model, state.serving_versions())
        return state

    state = store.update(mutate, by=f"cli:{os.environ.get('USER', 'unknown')}")
    store.append_event({"type": "routing_set", "revision": state.revision, "by": state.updated_by})
    return {"store": store.location, "state": state.model_dump(mode="json")}


def updated_state(current: Any, args: argparse.Namespace, config: Any) -> Any:
    """The routing document after applying `routing set` flags to `current` (validated)."""
    from pydantic import ValidationError

    from mlrelease.gateway.routing_state import RoutingState

    if current is None and args.stable is None:
        raise StepError("no routing state yet: --stable is required for the first write")
    fields: dict[str, Any] = current.model_dump() if current else {"model": config.model}
    if args.stable is not None:
        fields["stable_version"] = args.stable
    if args.candidate is not None and (args.candidate or None) != fields.get("candidate_version"):
        fields["candidate_version"] = args.candidate or None  # 0 removes the candidate
        fields["candidate_percent"] = {}  # a new candidate starts with no traffic unless --percent says so
    if args.percent is not None:
        fields["candidate_percent"] = parse_percents(args.percent, config.cohorts.names)
    if args.clear_trips:
        fields["guard_trips"] = ()
    try:
        return RoutingState.model_validate(fields)
    except ValidationError as exc:
        raise StepError(f"refused routing change: {exc.errors()[0]['msg']}") from None


def _cmd_traffic(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    from mlrelease.gateway import traffic

    config = _acting_config(args)
    traffic.require_loopback(args.url)
    if args.duration <= 0 or args.concurrency < 1 or args.rate < 0:
        raise StepError("--duration must be positive, --concurrency at least 1 and --rate at least 0")
    as_of = parse_timestamp(args.as_of, name="--as-of") if args.as_of else (config.replay_as_of or None)
    if as_of is None:
        from mlrelease.gateway.online_features import wall_clock

        as_of = wall_clock()
    pool = traffic.order_pool(settings.offline_dir, as_of, config.cohorts)
    mix = traffic.parse_mix(args.mix, config.cohorts.names)
    bodies = traffic.build_requests(pool, 5_000, mix, supply_features=args.supply_features, seed=args.seed)
    stop = threading.Event()  # SIGINT / SIGTERM end the run early, and the report is still printed
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    report = asyncio.run(
        traffic.send(
            args.url,
            bodies,
            api_key=args.api_key or os.environ.get("MLRELEASE_API_KEY"),
            rate=args.rate,
            duration_s=args.duration,
            concurrency=args.concurrency,
            header=config.auth.header,
            stop=stop,
            path=f"/v1/models/{config.model}/predict",  # the model's own path: any gateway serving it answers
        )
    )
    return {"as_of": as_of.isoformat(), "pool_size": len(pool), **report.summary()}


def _cmd_routing_init(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    """Point stable at the MLflow champion when no rollout holds the routing (after a first release)."""
    from mlrelease.gateway.routing_state import RoutingState
    from mlrelease.registry import CHAMPION, Registry
    from mlrelease.serving.local_layout import triton_url
    from mlrelease.serving.triton_client import require_ready

    config, store = _store(args, settings)
    champion = Registry.from_settings(settings).alias_version(CHAMPION)
    if champion is None:
        raise StepError("no champion in the model registry yet: run the nightly release once")
    current = store.read()
    if current is not None and current.stable_version == champion:
        return {"status": f"stable is already the champion v{champion}", "revision": current.revision}
    if current is not None and current.candidate_version is not None:
        raise StepError(f"a candidate (v{current.candidate_version}) is routed: finish or abort that rollout first")
    require_ready(config.triton_url or triton_url(), config.model, [champion])
    state = store.update(lambda _: RoutingState(model=config.model, stable_version=champion), by="routing init")
    store.append_event({"type": "routing_init", "revision": state.revision, "stable_version": champion})
    return {"status": f"stable is the champion v{champion}", "revision": state.revision}


def add_commands(sub: Any) -> None:
    """Register the gateway commands on the top-level subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", help="gateway YAML (default: MLRELEASE_GATEWAY_CONFIG or config/gateway.yaml)")

    gw = sub.add_parser("gateway", parents=[common], help="serve the prediction gateway (ASGI, uvicorn)")
    gw.add_argument("--host", default="127.0.0.1")
    gw.add_argument("--port", type=int, default=DEFAULT_PORT)
    gw.add_argument(
        "--workers",
        type=int,
        default=None,  # resolved when the gateway starts: every other command skips the cgroup reads
        help="processes on one port, each a replica with its own breakers, batcher and decision-log file; uvicorn "
        "replaces one that dies while the others keep answering (default: one per CPU core this process may use)",
    )
    gw.add_argument("--as-of", help="judge feature freshness at this instant (replays and demos only)")
    gw.set_defaults(handler=_cmd_gateway, result_to_xcom=False, quiet=True)

    key = sub.add_parser("gateway-key", help="API keys of the gateway").add_subparsers(dest="key_cmd", required=True)
    add = key.add_parser("add", parents=[common], help="create a client and print its key (shown once)")
    add.add_argument("name")
    add.add_argument("--rate-per-second", type=float, help="this client's limit (default: auth.default_rate)")
    add.add_argument("--burst", type=int, default=1000)
    add.set_defaults(handler=_cmd_key_add, result_to_xcom=False)

    routing = sub.add_parser("routing", help="the gateway's routing state").add_subparsers(
        dest="routing_cmd", required=True
    )
    show = routing.add_parser("show", parents=[common], help="print the routing state and recent events")
    show.add_argument("--events", type=int, default=20)
    show.set_defaults(handler=_cmd_routing_show, result_to_xcom=False)
    rset = routing.add_parser("set", parents=[common], help="change the routing state (one atomic write)")
    rset.add_argument("--stable", type=int)
    rset.add_argument("--candidate", type=int, help="candidate version; 0 removes it")
    rset.add_argument("--percent", action="append", metavar="COHORT=PCT", help="candidate share of a cohort ('*': all)")
    rset.add_argument("--clear-trips", action="store_true", help="forget recorded guard trips")
    rset.add_argument("--skip-triton-check", action="store_true", help="do not require the versions to be ready")
    rset.set_defaults(handler=_cmd_routing_set, result_to_xcom=False)
    init = routing.add_parser("init", parents=[common], help="make the MLflow champion stable (no rollout active)")
    init.set_defaults(handler=_cmd_routing_init, result_to_xcom=False)

    tr = sub.add_parser("traffic", parents=[common], help="send realistic orders to a loopback gateway")
    tr.add_argument("--url", default=f"http://127.0.0.1:{DEFAULT_PORT}")
    tr.add_argument("--rate", type=float, required=True, help="requests per second (0: closed loop)")
    tr.add_argument("--duration", type=float, required=True, help="seconds")
    tr.add_argument("--concurrency", type=int, default=64, help="most requests in flight")
    tr.add_argument("--mix", help="cohort weights, e.g. high_value=0.2,core=0.5,long_tail=0.3")
    tr.add_argument("--as-of", help="orders placed in the 5 h before this instant (default: replay_as_of or now)")
    tr.add_argument("--api-key", help="default: MLRELEASE_API_KEY")
    tr.add_argument("--supply-features", action="store_true", help="send features in the body (no Feast lookup)")
    tr.add_argument("--seed", type=int, default=0)
    tr.set_defaults(handler=_cmd_traffic, result_to_xcom=False)
