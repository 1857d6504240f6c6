"""The failure-run pool (gateway/run_pool.py) in Redis, beside the routing state the replicas share."""

from __future__ import annotations

import redis.asyncio as aioredis  # async (the routing store's client is not): a write runs inside a request's loop

from mlrelease.gateway.run_pool import pooled_run


class RedisRunPool:
    """The runs in one Redis hash per candidate version, `mlrelease:guard:<model>:<version>`: field = replica,
    value = "<run> <stable answered: 0|1> <server time>". One script writes and reads atomically, on Redis's clock
    (the replicas' clocks differ).

    :param url: redis://host:port/db (the routing state's Redis).
    :param model: the model whose candidate this is.
    :param live_s: how long a replica's last write keeps it in the pool.
    """

    # ARGV: replica, "<run> <answered>", the hash's expiry (s), how long a silent replica's field is kept (s)
    _SCRIPT = """
local t = redis.call('TIME')
local now = tostring(t[1]) .. '.' .. string.format('%06d', tonumber(t[2]))
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ' ' .. now)
redis.call('EXPIRE', KEYS[1], ARGV[3])
local all = redis.call('HGETALL', KEYS[1])
local kept = {}
for i = 1, #all, 2 do
  if tonumber(t[1]) - tonumber(string.match(all[i + 1], '(%S+)$')) > tonumber(ARGV[4]) then
    redis.call('HDEL', KEYS[1], all[i])  -- a replica gone for good (restarted, scaled in)
  else
    kept[#kept + 1] = all[i]
    kept[#kept + 1] = all[i + 1]
  end
end
return {now, kept}
"""

    def __init__(self, url: str, model: str, live_s: float, timeout_s: float = 0.5) -> None:
        self.live_s = live_s
        self._prefix = f"mlrelease:guard:{model}"
        self._redis = aioredis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._script = self._redis.register_script(self._SCRIPT)

    async def report(self, candidate: int, replica: str, run: int, answered: bool) -> int:
        """Store this replica's run; the pooled run (see `pooled_run`)."""
        keep_s = max(3600, int(self.live_s * 10))  # a finished candidate's hash goes away on its own
        forget_s = int(self.live_s * 10) + 1
        value = f"{run} {int(answered)}"
        key = f"{self._prefix}:{candidate}"
        now, flat = await self._script(keys=[key], args=[replica, value, keep_s, forget_s])
        runs = {}
        for field, stored in zip(flat[::2], flat[1::2], strict=True):
            text = stored.decode() if isinstance(stored, bytes) else stored  # a URL may ask for decoded replies
            count, stable_answered, at = text.split()
            runs[field] = (int(count), stable_answered == "1", float(at))
        return pooled_run(runs, float(now), self.live_s)

    async def close(self) -> None:
        """Close the connection pool."""
        await self._redis.aclose()
