"""Benchmark: the gateway vs direct Triton, and how fast the fast guard moves a failing candidate's traffic to stable.

Everything is real: generated data materialized into the Feast SQLite store, a CPU tritonserver serving a
good model and faulty copies, `mlrelease gateway` (uvicorn, one worker) and this process as the client.
    python bench/bench_gateway.py [--seconds 4] [--repeats 10]

Targets (issue 4): added p50 <= 2 ms over direct Triton; throughput at concurrency 16 >= 60 % of direct;
fault -> 100 % of the candidate's traffic on stable, p99 <= 1 s. Comparison anchor for the failover:
Flagger's documented analysis (interval 1 min x threshold 10 = 10 min before it rolls back).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bench_gateway_config, print_table, serving_home  # noqa: E402

CONCURRENCY = (1, 4, 16)
WINDOW = ("2026-11-28T02:00:00+00:00", "2026-11-29T02:00:00+00:00")
FLAGGER_SECONDS = 600.0


async def direct_triton(url: str, rows: list[np.ndarray], concurrency: int, seconds: float) -> dict[str, float]:
    """Closed loop on Triton with the gateway's own async client: throughput and p50/p99 ms."""
    from mlrelease.gateway.model_client import TritonModelClient

    client = TritonModelClient(url, "parcel_eta", (0.0, 500.0))
    latencies: list[float] = []
    stop = time.perf_counter() + seconds

    async def worker(offset: int) -> None:
        i = offset
        while time.perf_counter() < stop:
            began = time.perf_counter()
            await client.predict(1, rows[i % len(rows)], 2.0)
            latencies.append((time.perf_counter() - began) * 1000)
            i += concurrency

    began = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    elapsed = time.perf_counter() - began
    await client.close()
    return {
        "rate": len(latencies) / elapsed,
        "p50": float(np.percentile(latencies, 50)),
        "p99": float(np.percentile(latencies, 99)),
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def through_gateway(
    url: str, bodies: list[dict[str, Any]], key: str, concurrency: int, seconds: float, pid: int
) -> dict[str, float]:
    """Closed loop through the gateway: throughput, p50/p99 ms and the gateway's CPU ms per request (errors abort)."""
    from mlrelease.gateway.traffic import send

    cpu_before = cpu_seconds(pid)
    report = asyncio.run(send(url, bodies, api_key=key, rate=0, duration_s=seconds, concurrency=concurrency))
    cpu = cpu_seconds(pid) - cpu_before
    if report.errors:
        raise SystemExit(f"gateway answered errors during the benchmark: {report.statuses}")
    summary = report.summary()
    return {
        "rate": summary["achieved_rate"],
        "p50": summary["latency_ms"]["p50"],
        "p99": summary["latency_ms"]["p99"],
        "cpu_ms": cpu * 1000 / max(report.sent, 1),
    }


def gateway_pid(port: int) -> int:
    """The pid of the gateway listening on `port`."""
    out = subprocess.run(["pgrep", "-f", f"mlrelease gateway .*--port {port}"], capture_output=True, text=True).stdout
    return int(out.split()[0])


def set_routing(store: Any, **fields: Any) -> int:
    """One atomic routing write; returns the new revision."""
    from mlrelease.gateway.routing_state import RoutingState

    def mutate(current: RoutingState | None) -> RoutingState:
        base = current.model_dump() if current else {"model": "parcel_eta"}
        return RoutingState.model_validate({**base, **fields})

    return int(store.update(mutate, by="bench").revision)


def wait_revision(url: str, key: str, revision: int) -> None:
    """Until the gateway serves with `revision`."""
    import requests

    while requests.get(f"{url}/v1/routing", headers={"X-API-Key": key}).json()["state"]["revision"] < revision:
        time.sleep(0.01)


def kill_stub(version: int) -> None:
    """Kill the python-backend process serving one version: the candidate's Triton instance crashes."""
    pids = subprocess.run(["pgrep", "-f", f"parcel_eta/{version}/model.py"], capture_output=True, text=True).stdout
    for pid in pids.split():
        os.kill(int(pid), signal.SIGKILL)


def failover_once(
    kind: str, gateway: str, key: str, store: Any, bodies: list[dict[str, Any]], triton_url: str
) -> tuple[float, int]:
    """Inject one fault under 200 req/s; seconds from injection to the trip, and client-visible errors."""
    from mlrelease.gateway.traffic import send
    from mlrelease_drills.devkit import HEALTHY_CANDIDATE, NAN_ALL

    wait_revision(
        gateway,
        key,
        set_routing(store, candidate_version=HEALTHY_CANDIDATE, candidate_percent={"*": 100.0}, guard_trips=()),
    )
    faulty = NAN_ALL if kind == "nan" else HEALTHY_CANDIDATE
    injected: list[float] = []

    async def scenario() -> Any:
        load = asyncio.create_task(send(gateway, bodies, api_key=key, rate=200, duration_s=2.0, concurrency=64))
        await asyncio.sleep(0.5)
        injected.append(time.time())
        if kind == "nan":  # the rollout points traffic at a version that answers NaN
            await asyncio.to_thread(set_routing, store, candidate_version=NAN_ALL)
        else:  # the candidate's model instance dies under traffic
            kill_stub(HEALTHY_CANDIDATE)
        return await load

    report = asyncio.run(scenario())
    state = store.read()
    trips = [t for t in state.guard_trips if t.version == faulty]
    if not trips:
        raise SystemExit(f"{kind}: the guard never tripped version {faulty}")
    if kind == "crash":  # bring the instance back for the next round
        from mlrelease.serving.triton_client import TritonClient

        client = TritonClient(triton_url)
        client.load("parcel_eta")
        client.wait_ready("parcel_eta", HEALTHY_CANDIDATE)
        client.close()
    return trips[0].at.timestamp() - injected[0], report.errors


def main() -> None:  # noqa: C901 - a linear script: set up, measure, print
    """Build the world, measure both tables, print them."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=4.0, help="measurement per concurrency level and path")
    parser.add_argument("--repeats", type=int, default=10, help="fault injections per kind")
    args = parser.parse_args()

    from mlrelease.gateway.config import load_config
    from mlrelease.gateway.routing_store_factory import open_routing_store
    from mlrelease.gateway.traffic import build_requests, order_pool
    from mlrelease.model.features import FEATURES, encode_row
    from mlrelease.serving import local_triton
    from mlrelease.settings import Settings
    from mlrelease.timewindow import Window, parse_timestamp
    from mlrelease_drills import devkit
    from mlrelease_drills.devkit import free_port

    with serving_home("mlrelease-bench-gateway-") as home:
        settings = Settings.from_env()
        as_of: datetime = parse_timestamp(WINDOW[1], name="end")
        try:
            triton_url = devkit.start_serving_world(settings, Window.parse(*WINDOW))
            config, key, state_url = bench_gateway_config(
                home, triton_url, WINDOW[1], default_rate={"per_second": 100_000, "burst": 100_000}
            )
            store = open_routing_store(state_url, "parcel_eta")
            set_routing(store, stable_version=1)
            pool = order_pool(settings.offline_dir, as_of, load_config().cohorts)
            from_feast = build_requests(pool, 5_000, None, supply_features=False)
            supplied = build_requests(pool, 5_000, None, supply_features=True)
            rows = [encode_row(b["features"]) for b in supplied]
            assert all(r.shape == (1, len(FEATURES)) for r in rows)
            port = free_port()
            with devkit.gateway_process(config, port) as gateway:
                pid = gateway_pid(port)
                through_gateway(gateway, from_feast, key, 4, 1.0, pid)  # warm-up: connections, Feast registry cache
                table = []
                for c in CONCURRENCY:
                    direct = asyncio.run(direct_triton(triton_url, rows, c, args.seconds))
                    sup = through_gateway(gateway, supplied, key, c, args.seconds, pid)
                    feast = through_gateway(gateway, from_feast, key, c, args.seconds, pid)
                    row: list[object] = [c, f"{direct['rate']:,.0f}", f"{direct['p50']:.2f}", f"{direct['p99']:.2f}"]
                    for m in (sup, feast):
                        row += [
                            f"{m['rate']:,.0f}",
                            f"{m['p50']:.2f}",
                            f"{m['p99']:.2f}",
                            f"{m['p50'] - direct['p50']:+.2f}",
                            f"{m['rate'] / direct['rate']:.0%}",
                            f"{m['cpu_ms']:.2f}",
                        ]
                    table.append(row)
                failover = {}
                for kind in ("nan", "crash"):
                    samples = [
                        failover_once(kind, gateway, key, store, from_feast, triton_url) for _ in range(args.repeats)
                    ]
                    failover[kind] = samples
        finally:
            local_triton.down(settings)

    print("\nbatch 1, CPU, one uvicorn worker; closed loop at each concurrency; latencies in ms")
    print_table(
        [
            "conc.",
            "Triton infer/s",
            "p50",
            "p99",
            "gw (features supplied) req/s",
            "p50",
            "p99",
            "added p50",
            "of direct",
            "gw CPU ms/req",
            "gw (Feast lookup) req/s",
            "p50",
            "p99",
            "added p50",
            "of direct",
            "gw CPU ms/req",
        ],
        table,
    )
    print(f"\nfault injected under 200 req/s -> 100 % of the candidate's traffic on stable ({args.repeats} runs each)")
    rows_out = []
    for kind, samples in failover.items():
        seconds = np.asarray([s for s, _ in samples])
        label = "candidate answers NaN (routing points at it)" if kind == "nan" else "candidate instance killed"
        rows_out.append(
            [
                label,
                f"{np.percentile(seconds, 50):.3f}",
                f"{np.percentile(seconds, 99):.3f}",
                sum(e for _, e in samples),
                "<= 1 s (p99)",
                f"{FLAGGER_SECONDS:.0f} s",
            ]
        )
    print_table(["fault", "p50 s", "p99 s", "client errors", "target", "Flagger anchor (1 min x 10)"], rows_out)


if __name__ == "__main__":
    main()
