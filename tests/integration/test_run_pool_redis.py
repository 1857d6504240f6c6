"""The failure-run pool in a real Redis: replicas' runs meet on Redis's clock; a silent replica drops out."""

from __future__ import annotations

import asyncio
import time

import redis

from mlrelease.gateway.redis_run_pool import RedisRunPool
from mlrelease.gateway.run_pool_factory import open_run_pool

MODEL, CANDIDATE = "eta_model", 7


def test_replicas_runs_pool_in_redis_until_one_answers_the_candidate(redis_url):
    url = f"redis://{redis_url}/3"
    redis.Redis.from_url(url).flushdb()

    async def scenario() -> list[int]:
        pool = RedisRunPool(url, MODEL, live_s=30.0)
        try:
            return [
                await pool.report(CANDIDATE, "a", 3, True),
                await pool.report(CANDIDATE, "b", 4, True),
                await pool.report(CANDIDATE, "c", -1, False),  # never called the candidate: does not block
                await pool.report(CANDIDATE, "c", 0, False),  # answered it: the run is broken
                await pool.report(CANDIDATE + 1, "a", 2, True),  # another version's pool is its own
            ]
        finally:
            await pool.close()

    assert asyncio.run(scenario()) == [3, 7, 7, 0, 2]
    stored = redis.Redis.from_url(url).hgetall(f"mlrelease:guard:{MODEL}:{CANDIDATE}")
    assert set(stored) == {b"a", b"b", b"c"} and stored[b"c"].split()[:2] == [b"0", b"0"]
    assert redis.Redis.from_url(url).ttl(f"mlrelease:guard:{MODEL}:{CANDIDATE}") > 0  # goes away on its own


def test_a_replica_silent_past_live_s_no_longer_blocks_the_pool(redis_url):
    url = f"redis://{redis_url}/4"
    redis.Redis.from_url(url).flushdb()

    async def scenario() -> int:
        pool = RedisRunPool(url, MODEL, live_s=30.0)
        await pool.report(CANDIDATE, "gone", 0, False)
        await pool.close()
        time.sleep(0.05)
        short = RedisRunPool(url, MODEL, live_s=0.01)  # the same hash, read with a shorter memory
        try:
            return await short.report(CANDIDATE, "a", 5, True)
        finally:
            await short.close()

    assert asyncio.run(scenario()) == 5


def test_only_a_redis_routing_state_gets_a_pool(tmp_path):
    assert open_run_pool(f"file://{tmp_path}/routing.json", MODEL, heartbeat_s=1.0) is None
    pool = open_run_pool("redis://localhost:6379/0", MODEL, heartbeat_s=1.0)
    assert isinstance(pool, RedisRunPool) and pool.live_s == 3.0


def test_decoded_replies_and_replicas_gone_for_good_are_handled(redis_url):
    """A URL asking for decoded replies (str, not bytes) pools the same; a field silent for 10 × live_s goes."""
    url = f"redis://{redis_url}/5?decode_responses=True"
    redis.Redis.from_url(url).flushdb()

    async def scenario() -> tuple[int, int]:
        short = RedisRunPool(url, MODEL, live_s=0.01)  # fields silent for over 1 s are dropped
        try:
            await short.report(CANDIDATE, "gone", 0, False)
            time.sleep(2.1)  # Redis's clock counts whole seconds here
            first = await short.report(CANDIDATE, "a", 4, True)
        finally:
            await short.close()
        pool = RedisRunPool(url, MODEL, live_s=30.0)
        try:
            return first, await pool.report(CANDIDATE, "b", 3, True)
        finally:
            await pool.close()

    assert asyncio.run(scenario()) == (4, 7)
    assert set(redis.Redis.from_url(url).hgetall(f"mlrelease:guard:{MODEL}:{CANDIDATE}")) == {"a", "b"}
