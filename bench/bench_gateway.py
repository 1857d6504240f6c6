"""Benchmark: the gateway vs direct Triton, micro-batching off vs on, and the fast guard's failover time.

Everything is real: generated data materialized into the Feast SQLite store, a CPU tritonserver serving a
good model and faulty copies, two `mlrelease gateway` processes (one uvicorn worker each, so the CPU per
request is one process's: batching off = the baseline, batching on = the config default) and this process
as the client. At each concurrency, side by side in one run: direct Triton with the Python async client
(tritonclient, batch 1), direct Triton with perf_analyzer (C++), and the gateway with features supplied
and with the Feast lookup, each with batching off and on, in interleaved rounds: this box's speed drifts
by tens of percent from one minute to the next, so each gateway round is compared with the direct client's
round next to it and the table gives the median over rounds with the range.
    python bench/bench_gateway.py [--seconds 2] [--rounds 5] [--repeats 10] [--concurrency 1,4,16,64] [--profile DIR]

Targets (issue 15): at concurrency 16 the gateway with features supplied >= 60 % of direct Triton (Python
client), with the Feast lookup >= 40 %; at concurrency 1 added p50 <= 1 ms (supplied), <= 2 ms (Feast).
Fault -> 100 % of the candidate's traffic on stable, p99 <= 1 s. Comparison anchor for the failover:
Flagger's documented analysis (interval 1 min x threshold 10 = 10 min before it rolls back).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
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

CONCURRENCY = (1, 4, 16, 64)
WINDOW = ("2026-11-28T02:00:00+00:00", "2026-11-29T02:00:00+00:00")
FLAGGER_SECONDS = 600.0
MODEL, STABLE = "parcel_eta", 1
# perf_analyzer is the reference column, not what is measured: on this box at concurrency 64 it once ran past the
# nightly step's 600 s limit without a stable window; the table shows the gap instead of waiting that long.
PERF_TIMEOUT_S = 90.0


async def direct_triton(url: str, rows: list[np.ndarray], concurrency: int, seconds: float) -> dict[str, float]:
    """Closed loop on Triton with tritonclient's async HTTP client, one row per call: throughput, p50/p99 ms."""
    import tritonclient.http.aio as aiohttpclient

    from mlrelease.serving.triton_client import host_port

    client = aiohttpclient.InferenceServerClient(host_port(url)[0], conn_limit=max(concurrency, 1))
    outputs = [aiohttpclient.InferRequestedOutput(n, binary_data=True) for n in ("eta_prediction", "confidence_score")]
    latencies: list[float] = []
    stop = time.perf_counter() + seconds

    async def worker(offset: int) -> None:
        i = offset
        while time.perf_counter() < stop:
            began = time.perf_counter()
            batch = aiohttpclient.InferInput("features", list(rows[i % len(rows)].shape), "FP32")
            batch.set_data_from_numpy(rows[i % len(rows)], binary_data=True)
            await client.infer(MODEL, [batch], model_version=str(STABLE), outputs=outputs)
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


def perf_analyzer(settings: Any, url: str, concurrency: int, workdir: Path, interval_ms: int) -> dict[str, float]:
    """The real perf_analyzer (C++ client, HTTP, batch 1) at one concurrency: throughput and p50/p99 ms."""
    from mlrelease.errors import StepError
    from mlrelease.serving.local_triton import perf_analyzer_command
    from mlrelease.serving.perf import PerfSettings, run_perf_analyzer

    binary, env = perf_analyzer_command(settings)
    perf = PerfSettings(concurrency_range=f"{concurrency}:{concurrency}", measurement_interval_ms=interval_ms)
    try:
        (level,), _ = run_perf_analyzer(
            binary, env, url, MODEL, STABLE, workdir / f"perf-{concurrency}.csv", perf, timeout_s=PERF_TIMEOUT_S
        )
    except StepError as exc:  # an unstable box: show the gap in the table rather than abort the whole run
        print(f"perf_analyzer at concurrency {concurrency}: {exc}", file=sys.stderr)
        return {"rate": float("nan"), "p50": float("nan"), "p99": float("nan")}
    return {"rate": level.throughput, "p50": level.p50_us / 1000, "p99": level.p99_us / 1000}


class GcPauses:
    """The longest garbage collection this (client) process ran while measuring: its pauses are the client's,
    but every request in flight during one is timed as if the gateway had been that slow."""

    def __init__(self) -> None:
        self.longest_ms = 0.0
        self._began = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.longest_ms = max(self.longest_ms, (time.perf_counter() - self._began) * 1000)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def batch_counters(gateway: str, triton: Any) -> tuple[float, float, int, int]:
    """Rows and calls the gateway's micro-batcher sent (its metric), rows and executions Triton ran (its statistics)."""
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    rows = calls = 0.0
    for family in text_string_to_metric_families(requests.get(f"{gateway}/metrics", timeout=5).text):
        for sample in family.samples:
            if sample.name == "mlrelease_gateway_model_batch_rows_sum":
                rows += sample.value
            elif sample.name == "mlrelease_gateway_model_batch_rows_count":
                calls += sample.value
    stats = triton.inference_stats(MODEL, STABLE)
    return rows, calls, stats["inferences"], stats["executions"]


def through_gateway(
    url: str, bodies: list[dict[str, Any]], key: str, concurrency: int, seconds: float, pid: int, triton: Any
) -> dict[str, float]:
    """Closed loop through the gateway: throughput, p50/p99 ms, the gateway's CPU ms per request, rows per call
    it sent and rows per model execution Triton ran (errors abort)."""
    from mlrelease.gateway.traffic import send

    before = batch_counters(url, triton)
    cpu_before = cpu_seconds(pid)
    report = asyncio.run(send(url, bodies, api_key=key, rate=0, duration_s=seconds, concurrency=concurrency))
    cpu = cpu_seconds(pid) - cpu_before
    after = batch_counters(url, triton)
    if report.errors:
        raise SystemExit(f"gateway answered errors during the benchmark: {report.statuses}")
    rows, calls, inferences, executions = (a - b for a, b in zip(after, before, strict=True))
    summary = report.summary()
    return {
        "rate": summary["achieved_rate"],
        "p50": summary["latency_ms"]["p50"],
        "p99": summary["latency_ms"]["p99"],
        "cpu_ms": cpu * 1000 / max(report.sent, 1),
        "rows_per_call": rows / calls if calls else 1.0,  # no batcher: one row per call
        "rows_per_exec": inferences / executions if executions else float("nan"),
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


def batching_off(config: Path) -> Path:
    """The same gateway config with micro-batching turned off: the baseline (one Triton call per request)."""
    import yaml

    raw = yaml.safe_load(config.read_text(encoding="utf-8"))
    raw["batching"] = {**raw.get("batching", {}), "enabled": False}
    off = config.with_name("gateway-batching-off.yaml")
    off.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return off


def _gateway_path(
    url: str, bodies: list[dict[str, Any]], key: str, pid: int, triton: Any, args: Any, name: str, path: str
) -> Any:
    """One gateway path as a function of the concurrency (py-spy'd when asked, for the batching gateway)."""

    def measure(c: int) -> dict[str, float]:
        profile = None
        if name == "on" and args.profile:
            profile = _profiled(pid, args.seconds, args.profile / f"gw-c{c}-{path}.txt")
        result = through_gateway(url, bodies, key, c, args.seconds, pid, triton)
        if profile is not None:
            profile.wait(timeout=60)
        return result

    return measure


def median(rounds: list[dict[str, float]], field: str) -> float:
    """The median of one field over the rounds."""
    return float(np.median([r[field] for r in rounds]))


def paired(gw: list[dict[str, float]], direct: list[dict[str, float]], of: Any) -> tuple[float, float, float]:
    """Median, min and max over the rounds of of(gateway round, direct round of the same round)."""
    values = [of(g, d) for g, d in zip(gw, direct, strict=True)]
    return float(np.median(values)), min(values), max(values)


def _cells(gw: list[dict[str, float]], direct: list[dict[str, float]]) -> list[object]:
    added = paired(gw, direct, lambda g, d: g["p50"] - d["p50"])
    share = paired(gw, direct, lambda g, d: g["rate"] / d["rate"])
    return [
        f"{median(gw, 'rate'):,.0f}",
        f"{median(gw, 'p50'):.2f}",
        f"{median(gw, 'p99'):.2f}",
        f"{added[0]:+.2f} ({added[1]:+.2f}..{added[2]:+.2f})",
        f"{share[0]:.0%} ({share[1]:.0%}..{share[2]:.0%})",
        f"{median(gw, 'cpu_ms'):.2f}",
        f"{median(gw, 'rows_per_call'):.1f}",
        f"{median(gw, 'rows_per_exec'):.1f}",
    ]


def _profiled(pid: int, seconds: float, out: Path | None) -> subprocess.Popen[bytes] | None:
    """py-spy recording the gateway for `seconds` (raw collapsed stacks in `out`), when asked for."""
    if out is None:
        return None
    argv = [
        "py-spy",
        "record",
        "-p",
        str(pid),
        "-d",
        str(max(1, int(seconds))),
        "-r",
        "200",
        "-f",
        "raw",
        "-o",
        str(out),
    ]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:  # noqa: C901 - a linear script: set up, measure, print
    """Build the world, measure the tables, print them."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=2.0, help="measurement per concurrency level, path and round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per concurrency level")
    parser.add_argument("--repeats", type=int, default=10, help="fault injections per kind")
    parser.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)), help="closed-loop levels")
    parser.add_argument("--perf-interval-ms", type=int, default=1000, help="perf_analyzer's measurement window")
    parser.add_argument("--profile", type=Path, help="py-spy the batching gateway at each level into this directory")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    from mlrelease.gateway.config import load_config
    from mlrelease.gateway.routing_store_factory import open_routing_store
    from mlrelease.gateway.traffic import build_requests, order_pool
    from mlrelease.model.features import FEATURES, encode_row
    from mlrelease.serving import local_triton
    from mlrelease.serving.triton_client import TritonClient
    from mlrelease.settings import Settings
    from mlrelease.timewindow import Window, parse_timestamp
    from mlrelease_drills import devkit
    from mlrelease_drills.devkit import free_port

    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    with serving_home("mlrelease-bench-gateway-") as home:
        settings = Settings.from_env()
        as_of: datetime = parse_timestamp(WINDOW[1], name="end")
        try:
            triton_url = devkit.start_serving_world(settings, Window.parse(*WINDOW))
            triton = TritonClient(triton_url)
            config, key, state_url = bench_gateway_config(
                home, triton_url, WINDOW[1], default_rate={"per_second": 100_000, "burst": 100_000}
            )
            store = open_routing_store(state_url, MODEL)
            set_routing(store, stable_version=STABLE)
            pool = order_pool(settings.offline_dir, as_of, load_config().cohorts)
            from_feast = build_requests(pool, 5_000, None, supply_features=False)
            supplied = build_requests(pool, 5_000, None, supply_features=True)
            rows = [encode_row(b["features"]) for b in supplied]
            assert all(r.shape == (1, len(FEATURES)) for r in rows)
            on_port, off_port = free_port(), free_port()
            with (
                devkit.gateway_process(config, on_port) as gateway,
                devkit.gateway_process(batching_off(config), off_port) as baseline,
            ):
                pids = {gateway: gateway_pid(on_port), baseline: gateway_pid(off_port)}
                for url in (gateway, baseline):  # warm-up: connections, the gateways' first reads
                    through_gateway(url, from_feast, key, 4, 1.0, pids[url], triton)
                # Building the world leaves this process a large heap (pandas, sklearn, ONNX, Feast): a full collection
                # of a mere Feast-importing process's ~2x10^5 objects takes ~0.2 s on a quiet box, and every request
                # in flight is timed through it (64 of them at concurrency 64: a p99 outlier). Frozen, later
                # collections only walk the objects made while measuring.
                gc.collect()
                gc.freeze()
                pauses = GcPauses()
                measured: dict[int, dict[str, list[dict[str, float]]]] = {}
                paths = {
                    "direct": lambda c: asyncio.run(direct_triton(triton_url, rows, c, args.seconds)),
                    **{
                        f"{name}-{path}": _gateway_path(url, bodies, key, pids[url], triton, args, name, path)
                        for name, url in (("off", baseline), ("on", gateway))
                        for path, bodies in (("supplied", supplied), ("feast", from_feast))
                    },
                }
                for c in levels:
                    m = measured[c] = {"perf": [perf_analyzer(settings, triton_url, c, home, args.perf_interval_ms)]}
                    # Interleaved rounds, each in a rotated order: this box's speed drifts by tens of percent
                    # between minutes, so each gateway figure is compared with the direct client of its own round.
                    order = list(paths)
                    for r in range(args.rounds):
                        for name in order[r % len(order) :] + order[: r % len(order)]:
                            m.setdefault(name, []).append(paths[name](c))
                failover = {}
                for kind in ("nan", "crash"):
                    samples = [
                        failover_once(kind, gateway, key, store, from_feast, triton_url) for _ in range(args.repeats)
                    ]
                    failover[kind] = samples
            triton.close()
        finally:
            local_triton.down(settings)

    print(f"\nlongest GC pause of the load generator (this process) while measuring: {pauses.longest_ms:.1f} ms")
    print("CPU box; one uvicorn worker per gateway; closed loop at each concurrency; latencies in ms.")
    print("direct: tritonclient (Python, async HTTP) and perf_analyzer (C++), one row per call. Gateway: batching on")
    print("(the default); rows/call = rows per Triton call the gateway sent; rows/exec = rows per model execution")
    print(
        "Triton ran (its statistics, after its own dynamic batching); added p50 and 'of direct' vs the Python client."
    )
    print(
        f"Each figure is the median of {args.rounds} interleaved rounds of {args.seconds:g} s per path; added p50 and"
        " 'of direct' pair each gateway round with the direct client's of the same round: median (min..max)."
    )
    gw_cols = ["req/s", "p50", "p99", "added p50", "of direct", "CPU ms/req", "rows/call", "rows/exec"]
    table = []
    for c, m in measured.items():
        d, (pa,) = m["direct"], m["perf"]
        table.append(
            [
                c,
                f"{median(d, 'rate'):,.0f}",
                f"{median(d, 'p50'):.2f}",
                f"{median(d, 'p99'):.2f}",
                f"{pa['rate']:,.0f}",
                f"{pa['p50']:.2f}",
                f"{pa['p99']:.2f}",
                *_cells(m["on-supplied"], d),
                *_cells(m["on-feast"], d),
            ]
        )
    print_table(
        ["conc.", "Python client infer/s", "p50", "p99", "perf_analyzer infer/s", "p50", "p99"]
        + [f"gw supplied {h}" for h in gw_cols]
        + [f"gw Feast {h}" for h in gw_cols],
        table,
    )
    print("\nbaseline side by side: the same gateway with micro-batching off (one Triton call per request) vs on")
    baseline_rows = []
    for c, m in measured.items():
        for path in ("supplied", "feast"):
            off, on = m[f"off-{path}"], m[f"on-{path}"]
            baseline_rows.append(
                [
                    c,
                    path,
                    f"{median(off, 'rate'):,.0f}",
                    f"{median(on, 'rate'):,.0f}",
                    f"{paired(on, off, lambda a, b: a['rate'] / b['rate'])[0]:.2f}x",
                    f"{median(off, 'p99'):.2f}",
                    f"{median(on, 'p99'):.2f}",
                    f"{median(off, 'cpu_ms'):.2f}",
                    f"{median(on, 'cpu_ms'):.2f}",
                    f"{median(off, 'rows_per_exec'):.1f}",
                    f"{median(on, 'rows_per_call'):.1f}",
                    f"{median(on, 'rows_per_exec'):.1f}",
                ]
            )
    print_table(
        [
            "conc.",
            "features",
            "off req/s",
            "on req/s",
            "on/off",
            "off p99",
            "on p99",
            "off CPU ms/req",
            "on CPU ms/req",
            "off rows/exec",
            "on rows/call",
            "on rows/exec",
        ],
        baseline_rows,
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
