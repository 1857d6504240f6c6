"""The candidate's failure runs pooled across gateway replicas, so a broken candidate is stopped at the fleet's pace.

Each replica's SplitGuard trips a candidate that fails `run_to_trip` calls in a row on that replica. With N replicas
each sees 1/N of the candidate's calls, so a candidate that fails every call waits N times longer than its traffic
needs (3 replicas, 12 candidate calls a second: ~1.8 s for one replica's own run, ~0.6 s pooled; the slowest of a
thousand rollouts took 3.1 s per replica).

The pool holds each replica's current run: the candidate's back-to-back failures there since its last candidate
success (and since stable last failed there), and whether stable answered there during it. The runs add up to one
pooled run only while *every* live replica is in a run and stable answered in each of them: then no replica has had
a candidate success since its run began, so the candidate's calls failed back to back across the fleet while stable
worked beside them everywhere. A healthy candidate's burst on one replica leaves the others answering, which holds the
pool at zero; a serving outage fails stable too, which ends the runs, and a replica whose stable rests behind its
breaker (stable failed there) has no answer from stable, so its run cannot add up with the others'.

What pooling assumes: `burst_failures` bounds a healthy version's back-to-back failures across the fleet, not only
on one replica. A stall of the candidate's serving instance that fails every replica's calls at once for ~0.5 s (at
12 candidate calls a second) is 7 in a row across the fleet, where one replica saw only 2 or 3. A fleet whose healthy
versions stall like that sets `burst_failures` higher, or `guard.pool_runs: false` (each replica decides alone, ~3
times slower with 3 replicas).

A replica writes its run only when it changes (a failure, the success or stable failure that ends it, stable's first
answer during it), never per healthy call, and once every `heartbeat_s` so that the pool knows every live replica:
one that answers the candidate well is in the pool at run 0 and keeps it there. A replica silent for `live_s` (gone)
no longer counts. Nor does one the candidate never called yet (run -1): it had no candidate success to block with,
and at the opening of a stage a replica may wait seconds for its first candidate call.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

log = logging.getLogger(__name__)
RETRY_S = 0.05  # one quick retry of a failed write: a lost "run ended" would leave a stale run standing a heartbeat


def pooled_run(runs: Mapping[str, tuple[int, bool, float]], now: float, live_s: float) -> int:
    """The candidate's back-to-back failures across the replicas: the sum of the live replicas' runs while every
    live one is in a run and stable answered there during it, else 0. `runs`: replica → (its run, whether stable
    answered there during it, when it wrote them); a run of -1: the candidate made no call there (yet, or since it
    was tripped)."""
    live = [(run, answered) for run, answered, at in runs.values() if now - at <= live_s and run >= 0]
    if not live or not all(run >= 1 and answered for run, answered in live):
        return 0
    return sum(run for run, _ in live)


class RunPool(Protocol):
    """Where the replicas' runs meet: Redis, shared by every replica of a model (gateway/redis_run_pool.py; the
    factory in run_pool_factory.py)."""

    async def report(self, candidate: int, replica: str, run: int, answered: bool) -> int:
        """Store this replica's run of the candidate (and whether stable answered during it); the pooled run across
        the live replicas, now."""


class RunReporter:
    """Sends this replica's run to the pool one write at a time, always the newest value (concurrent writes could
    land out of order and leave an old run standing), and hands each pooled answer to `on_pooled`. A failed write is
    tried once more; then the next change or heartbeat writes the newest value.

    :param pool: where the runs meet.
    :param replica: this replica's name in the pool.
    :param on_pooled: called with (candidate, pooled run) after each write.
    """

    def __init__(self, pool: RunPool, replica: str, on_pooled: Callable[[int, int], None]) -> None:
        self.pool = pool
        self.replica = replica
        self.on_pooled = on_pooled
        self._latest: tuple[int, int, bool] | None = None
        self._sent: tuple[int, int, bool] | None = None
        self._task: asyncio.Task[None] | None = None

    def latest(self) -> tuple[int, int, bool] | None:
        """The newest (candidate, run, answered) handed to the reporter: what the pool has, or soon will have."""
        return self._latest

    def update(self, candidate: int, run: int, answered: bool, *, force: bool = False) -> None:
        """This replica's run of `candidate` is now `run` (`answered`: stable answered here during it); `force`
        writes it even unchanged (the heartbeat)."""
        self._latest = (candidate, run, answered)
        if force:
            self._sent = None
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        retried = False
        while self._latest is not None and self._latest != self._sent:
            candidate, run, answered = sent = self._latest
            try:
                pooled = await self.pool.report(candidate, self.replica, run, answered)
            except Exception as exc:  # Redis down: the replica's own run rule still guards
                if not retried:
                    retried = True
                    await asyncio.sleep(RETRY_S)
                    continue
                log.warning("cannot pool the candidate's failure run (the next change or heartbeat retries): %s", exc)
                return
            self._sent, retried = sent, False
            self.on_pooled(candidate, pooled)

    async def close(self) -> None:
        """Wait for a write under way (a trip it brings is not lost)."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
