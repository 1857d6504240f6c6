"""`mlrelease traffic`: a bounded, loopback-only load generator that sends realistic orders to the gateway.

Orders come from the generated offline data: those placed in the hours before `as_of` (so their
features are fresh at that instant), each labelled with the cohort the gateway's rules give it, so a
cohort mix can be requested. Open loop at a fixed rate (closed loop when rate is 0), at most
`concurrency` requests in flight.
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pandas as pd

from mlrelease.cohort_rules import CohortConfig
from mlrelease.errors import StepError
from mlrelease.gateway.cohorts import assign_cohort
from mlrelease.model.features import FEATURES
from mlrelease.sources import read_window
from mlrelease.timewindow import Window

MAX_REQUESTS = 1_000_000  # a bound on one run, whatever rate × duration says


def require_loopback(url: str) -> None:
    """Refuse any target that does not resolve only to loopback addresses."""
    host = urlsplit(url).hostname
    if not host:
        raise StepError(f"traffic target {url!r} has no host")
    try:
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except socket.gaierror as exc:
        raise StepError(f"traffic target host {host!r} does not resolve: {exc}") from None
    if not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses):
        raise StepError(f"traffic only targets loopback; {host} resolves to {sorted(addresses)}")


def _latest_before(frame: pd.DataFrame, key: str, as_of: pd.Timestamp) -> pd.DataFrame:
    frame = frame[frame["event_timestamp"] < as_of].sort_values("event_timestamp")
    return frame.drop_duplicates(key, keep="last").drop(columns="event_timestamp")


def order_pool(offline_dir: Path, as_of: datetime, cohorts: CohortConfig, hours: float = 5.0) -> pd.DataFrame:
    """Orders placed in [as_of - hours, as_of) with their model features and cohort."""
    as_of_ts = pd.Timestamp(as_of)
    window = Window(as_of - timedelta(hours=hours), as_of)
    context = Window(as_of - timedelta(days=2), as_of)  # users and routes: their latest snapshot before as_of
    orders = read_window(offline_dir / "orders", window)
    if orders.empty:
        raise StepError(f"no orders in {window}: generate data for that day first (`mlrelease data generate`)")
    packages = read_window(offline_dir / "packages", window).drop(columns="event_timestamp")
    users = _latest_before(read_window(offline_dir / "users", context, allow_missing=True), "user_id", as_of_ts)
    routes = _latest_before(read_window(offline_dir / "routes", context, allow_missing=True), "route_id", as_of_ts)
    # An order contributes its keys only: its outcomes (eta_hours, promised_hours, is_late) are labels, never sent.
    pool = orders[["order_id", "user_id", "package_id", "route_id"]].merge(packages, on="package_id")
    pool = pool.merge(users, on="user_id").merge(routes, on="route_id")
    pool["cohort"] = [assign_cohort(cohorts, {str(k): v for k, v in row.items()}) for row in pool.to_dict("records")]
    return pool.reset_index(drop=True)


def parse_mix(text: str | None, known: tuple[str, ...]) -> dict[str, float] | None:
    """`high_value=0.2,core=0.5,long_tail=0.3` as weights; None means the natural mix of the pool."""
    if not text:
        return None
    mix: dict[str, float] = {}
    for part in text.split(","):
        name, _, weight = part.partition("=")
        if name not in known:
            raise StepError(f"--mix names unknown cohort {name!r}; cohorts are {list(known)}")
        try:
            mix[name] = float(weight)
        except ValueError:
            raise StepError(f"--mix weight for {name} must be a number, got {weight!r}") from None
    if any(w < 0 for w in mix.values()) or sum(mix.values()) <= 0:
        raise StepError(f"--mix weights must be non-negative and not all zero, got {mix}")
    return mix


def build_requests(
    pool: pd.DataFrame, n: int, mix: dict[str, float] | None, *, supply_features: bool, seed: int = 0
) -> list[dict[str, Any]]:
    """`n` request bodies drawn from the pool in the requested cohort mix."""
    rng = random.Random(seed)
    if mix is None:
        picks = [rng.randrange(len(pool)) for _ in range(n)]
    else:
        by_cohort = {c: np.flatnonzero(pool["cohort"].to_numpy() == c) for c in mix if mix[c] > 0}
        empty = [c for c, rows in by_cohort.items() if len(rows) == 0]
        if empty:
            raise StepError(f"no orders of cohort(s) {empty} in the pool; change --mix or --as-of")
        cohorts = rng.choices(list(by_cohort), weights=[mix[c] for c in by_cohort], k=n)
        picks = [int(rng.choice(by_cohort[c])) for c in cohorts]
    records = pool.to_dict("records")
    bodies = []
    for i in picks:
        row = records[i]
        body: dict[str, Any] = {k: int(row[k]) for k in ("order_id", "user_id", "package_id", "route_id")}
        if supply_features:
            body["features"] = {f: _plain(row[f]) for f in FEATURES}
        bodies.append(body)
    return bodies


def route_headers(
    pool: pd.DataFrame, bodies: list[dict[str, Any]], cohort_header: str, bucket_header: str, bucket_key: str
) -> list[dict[str, str]]:
    """What an upstream sets for a Gateway API route that assigns users (HTTPRoute `backends: gateways`): each
    request's cohort and its user's canary bucket, four digits, computed as the gateway computes them."""
    from mlrelease.gateway.cohorts import bucket

    cohort_of = dict(zip(pool["order_id"].astype(int), pool["cohort"], strict=True))
    return [
        {cohort_header: str(cohort_of[body["order_id"]]), bucket_header: f"{bucket(body[bucket_key]):04d}"}
        for body in bodies
    ]


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


@dataclass
class TrafficReport:
    """What a traffic run achieved."""

    sent: int = 0
    duration_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    served: Counter[str] = field(default_factory=Counter)

    @property
    def errors(self) -> int:
        """Requests that did not get a 200."""
        return sum(n for status, n in self.statuses.items() if status != "200")

    def summary(self) -> dict[str, Any]:
        """JSON-ready numbers: rate, latency percentiles, status counts, cohort/version/source counts."""
        lat = np.asarray(self.latencies_ms) if self.latencies_ms else np.asarray([np.nan])
        return {
            "sent": self.sent,
            "errors": self.errors,
            "achieved_rate": round(self.sent / self.duration_s, 1) if self.duration_s else 0.0,
            "latency_ms": {
                q: round(float(np.percentile(lat, p)), 3) for q, p in (("p50", 50), ("p95", 95), ("p99", 99))
            },
            "statuses": dict(self.statuses),
            "served": dict(sorted(self.served.items())),
        }


async def send(
    url: str,
    bodies: list[dict[str, Any]],
    *,
    api_key: str | None,
    rate: float,
    duration_s: float,
    concurrency: int,
    header: str = "X-API-Key",
    stop: threading.Event | None = None,
    max_requests: int = MAX_REQUESTS,
    path: str = "/v1/predict",
    headers_per_body: list[dict[str, str]] | None = None,
) -> TrafficReport:
    """POST bodies (cycled) to {url}{path} (a model's predict path; the default model's by default) for `duration_s`
    (or until `stop` is set, or `max_requests` were sent): `rate` per second, or closed loop when rate is 0.
    `headers_per_body`: each body's own headers (e.g. `route_headers`), beside the API key."""
    import aiohttp

    if not bodies:
        raise StepError("no request bodies to send")
    report = TrafficReport()
    gate = asyncio.Semaphore(concurrency)
    headers = {header: api_key} if api_key else {}
    timeout = aiohttp.ClientTimeout(total=10)
    limit = min(max_requests, int(rate * duration_s)) if rate > 0 else max_requests
    async with aiohttp.ClientSession(
        base_url=url.rstrip("/"), headers=headers, timeout=timeout, connector=aiohttp.TCPConnector(limit=concurrency)
    ) as session:

        async def one(body: dict[str, Any], own: dict[str, str] | None) -> None:
            started = time.perf_counter()
            try:
                async with session.post(path, json=body, allow_redirects=False, headers=own) as response:
                    report.statuses[str(response.status)] += 1
                    if response.status == 200:
                        payload = await response.json(content_type=None)
                        report.served[f"{payload['cohort']}/v{payload['model_version']}/{payload['source']}"] += 1
            except Exception as exc:  # a refused connection, a timeout, a non-JSON body: count it, keep going
                report.statuses[type(exc).__name__] += 1
            finally:
                report.latencies_ms.append((time.perf_counter() - started) * 1000)
                gate.release()

        loop = asyncio.get_running_loop()
        start = loop.time()
        tasks = []
        for i in range(limit):
            if rate > 0:
                delay = start + i / rate - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            elif loop.time() - start >= duration_s:
                break
            if stop is not None and stop.is_set():
                break
            await gate.acquire()  # bounded: a slow gateway slows the sender (reported as the achieved rate)
            own = headers_per_body[i % len(bodies)] if headers_per_body else None
            tasks.append(asyncio.create_task(one(bodies[i % len(bodies)], own)))
            report.sent += 1
        await asyncio.gather(*tasks)
        report.duration_s = loop.time() - start
    return report
