"""Benchmark: one gateway feature lookup read on a worker thread (the baseline) vs on the event loop.

Real parts: generated data applied and materialized into the Feast SQLite online store (WAL, as the gateway
prepares it), the gateway's OnlineReader, FeatureLookup and BatchingLookup, under uvloop. Each variant fetches the
same one-row lookups one after another (no load: every fetch is read alone), in alternating rounds so the box's
drift hits all variants alike; the table gives the median over rounds of CPU and wall time per fetch.
    python bench/bench_feature_read.py [--fetches 1500] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import print_table, serving_home  # noqa: E402

WINDOW = ("2026-11-28T02:00:00+00:00", "2026-11-29T02:00:00+00:00")
Fetch = Callable[[dict[str, int]], Awaitable[Any]]


async def measure(variants: dict[str, Fetch], ids: list[dict[str, int]], rounds: int) -> dict[str, list[float]]:
    """Per variant: median CPU µs and median wall µs per fetch over the rounds."""
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    wall: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fetch in variants.items():
            latencies = []
            started_cpu = time.process_time()
            for entity_ids in ids:
                began = time.perf_counter()
                await fetch(entity_ids)
                latencies.append(time.perf_counter() - began)
            cpu[name].append((time.process_time() - started_cpu) / len(ids) * 1e6)
            wall[name].append(statistics.median(latencies) * 1e6)
    return {name: [statistics.median(cpu[name]), statistics.median(wall[name])] for name in variants}


def main() -> None:
    """Build the store, measure both variants, print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fetches", type=int, default=1500, help="one-row lookups per variant and round")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds")
    args = parser.parse_args()

    import uvloop

    from mlrelease.feast_store import open_store
    from mlrelease.gateway.config import load_config
    from mlrelease.gateway.online_features import BatchingLookup, FeatureLookup
    from mlrelease.gateway.online_reader import OnlineReader
    from mlrelease.gateway.traffic import build_requests, order_pool
    from mlrelease.release_spec import process_spec
    from mlrelease.settings import Settings
    from mlrelease.steps.apply_features import apply_features
    from mlrelease.steps.materialize import materialize
    from mlrelease.steps.validate_data import validate_data
    from mlrelease.timewindow import Window, parse_timestamp

    with serving_home("mlrelease-bench-feature-read-"):
        settings = Settings.from_env()
        window = Window.parse(*WINDOW)
        as_of = parse_timestamp(WINDOW[1], name="end")
        apply_features(settings)
        validate_data(settings, window, overlap=timedelta(hours=2), reference_days=0)
        materialize(settings, window, timedelta(hours=2))
        pool = order_pool(settings.offline_dir, as_of, load_config().cohorts)
        ids = [
            {key: body[key] for key in ("user_id", "package_id", "route_id")}
            for body in build_requests(pool, args.fetches, None, supply_features=False)
        ]
        reader = OnlineReader(open_store(settings), process_spec().features)
        if not reader.prepare_local_reads(busy_timeout_ms=1000):
            raise SystemExit("the online store could not be prepared for reads on the event loop (not WAL)")
        lookup = FeatureLookup(reader, lambda: as_of)

        async def compare(rounds: int) -> dict[str, list[float]]:
            on_thread, inline = BatchingLookup(lookup), BatchingLookup(lookup, inline=True)
            try:
                return await measure(
                    {"worker thread (before)": on_thread.fetch, "event loop": inline.fetch}, ids, rounds
                )
            finally:
                await on_thread.close()
                await inline.close()

        uvloop.run(compare(1))  # warm-up: the connection, the key caches, the page cache
        results = uvloop.run(compare(args.rounds))

    print(f"\none-row lookups via BatchingLookup, {args.fetches} per variant and round, {args.rounds} rounds, medians")
    base_cpu, base_wall = results["worker thread (before)"]
    print_table(
        ["read on", "CPU µs/fetch", "wall p50 µs/fetch", "CPU vs thread", "wall vs thread"],
        [
            [name, f"{c:.0f}", f"{w:.0f}", f"{c / base_cpu:.2f}x", f"{w / base_wall:.2f}x"]
            for name, (c, w) in results.items()
        ],
    )


if __name__ == "__main__":
    main()
