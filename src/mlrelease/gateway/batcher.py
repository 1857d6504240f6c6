"""Micro-batching into Triton: concurrent rows for one version (and role) share one inference call.

Every request still gets its own answer or its own failure: the outputs are checked row by row, so a
NaN in one row fails only that row's request, and a call that fails (error, timeout) fails each of its
rows, which the service then retries on stable one by one, exactly as with unbatched calls.

Each (version, role) has its own queue and its own in-flight limit, so a candidate's rows never wait
behind stable's (nor a slow stable behind a candidate). A batch is sent:

- at once when no call of that queue is running (no load: nobody waits for company);
- otherwise after at most `max_delay_s` (rows that arrive meanwhile join), or as soon as `max_batch`
  rows are waiting;
- never while `max_in_flight` calls of that queue are running: rows arriving then form the next batch.

Under load the batches grow by themselves, which is what pays for the gateway's per-call cost and
gives Triton's dynamic batcher whole batches instead of single rows.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from mlrelease.gateway.guard import OutputRanges, output_problem
from mlrelease.gateway.model_client import ModelAnswer, ModelFailure, answered

# (version, rows [n, F], deadline on the loop clock, role) -> (prediction [n], score [n])
BatchCall = Callable[[int, np.ndarray, float, str], Awaitable[tuple[np.ndarray, np.ndarray]]]
# (version, role, rows in the batch): told once per call sent, for the batch-size metric
BatchObserver = Callable[[int, str, int], None]


@dataclass(frozen=True)
class BatchSettings:
    """How rows are coalesced: most rows per call, longest wait for company, calls in flight per queue."""

    max_batch: int = 64
    max_delay_s: float = 0.0005
    max_in_flight: int = 2

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_in_flight < 1 or self.max_delay_s < 0:
            raise ValueError(f"invalid batch settings {self}")


@dataclass(slots=True)
class _Pending:
    row: np.ndarray  # one encoded row, shape [F] or [1, F]
    enqueued: float  # loop time it was queued at
    deadline: float  # loop time after which the row's answer is useless (its timeout)
    future: asyncio.Future[ModelAnswer]


class RowQueue:
    """The rows waiting for one (version, role), and the calls that carry them.

    :param version: the model version every row goes to.
    :param role: stable or candidate (which connection pool, and the failure detail).
    :param call: sends one batch to Triton; raises ModelFailure for the whole call.
    :param settings: batch size, delay and in-flight limit.
    :param ranges: the valid prediction and score; an answer outside them is a failure.
    :param observe: told the size of each batch sent.
    :param outputs: the prediction's and the score's names (a failure's detail says what was answered).
    """

    def __init__(
        self,
        version: int,
        role: str,
        call: BatchCall,
        settings: BatchSettings,
        ranges: OutputRanges,
        observe: BatchObserver | None = None,
        *,
        outputs: tuple[str, str],
    ) -> None:
        self.version, self.role, self.outputs = version, role, outputs
        self._call, self._settings, self._ranges, self._observe = call, settings, ranges, observe
        self._pending: deque[_Pending] = deque()
        self._in_flight = 0
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop = asyncio.get_running_loop()

    def submit(self, row: np.ndarray, timeout_s: float) -> asyncio.Future[ModelAnswer]:
        """Queue one row; the future holds its answer or its ModelFailure."""
        future: asyncio.Future[ModelAnswer] = self._loop.create_future()
        now = self._loop.time()
        self._pending.append(_Pending(row, now, now + timeout_s, future))
        self._schedule()
        return future

    def _schedule(self) -> None:
        if self._scheduled or not self._pending or self._in_flight >= self._settings.max_in_flight:
            return
        self._scheduled = True
        settings = self._settings
        if self._in_flight and settings.max_delay_s > 0 and len(self._pending) < settings.max_batch:
            # Calls are running, so requests are arriving together: a short wait lets more rows share this call.
            self._loop.call_at(self._pending[0].enqueued + settings.max_delay_s, self._send)
        else:
            # call_soon, not now: every request already parsed in this loop iteration still joins the batch.
            self._loop.call_soon(self._send)

    def _send(self) -> None:
        self._scheduled = False
        now = self._loop.time()
        batch: list[_Pending] = []
        while self._pending and len(batch) < self._settings.max_batch:
            entry = self._pending.popleft()
            if entry.future.done():  # its request went away (client gone, cancelled)
                continue
            if entry.deadline <= now:  # waited its whole timeout for a free call: fail it, do not send it
                entry.future.set_exception(self._failure("timeout", "waited past its timeout for a call"))
                continue
            batch.append(entry)
        if batch:
            self._in_flight += 1
            task = self._loop.create_task(self._run(batch))
            self._tasks.add(task)  # the loop holds tasks weakly: keep each until it is done
            task.add_done_callback(self._tasks.discard)
        self._schedule()

    async def _run(self, batch: list[_Pending]) -> None:
        try:
            rows = np.stack([np.asarray(p.row, dtype=np.float32).reshape(-1) for p in batch])
            if self._observe is not None:
                self._observe(self.version, self.role, len(batch))
            try:
                prediction, score = await self._call(self.version, rows, min(p.deadline for p in batch), self.role)
                if len(prediction) != len(batch) or len(score) != len(batch):
                    answered_rows = f"answered {len(prediction)} rows for {len(batch)}"
                    raise ModelFailure("error", f"version {self.version} {answered_rows}")
            except ModelFailure as failure:
                self._fail_all(batch, failure)
                return
            except Exception as exc:  # a bug in the call path must fail these rows, never hang them
                self._fail_all(batch, self._failure("error", f"{type(exc).__name__}: {exc}"))
                return
            self._answer(batch, prediction, score)
        finally:
            self._in_flight -= 1
            self._schedule()

    def _fail_all(self, batch: list[_Pending], failure: ModelFailure) -> None:
        """Every row of a failed call fails on its own (each request retries on stable), all naming that one call."""
        call = object()
        for entry in batch:
            if not entry.future.done():
                entry.future.set_exception(ModelFailure(failure.kind, failure.detail, call=call))

    def _answer(self, batch: list[_Pending], prediction: np.ndarray, score: np.ndarray) -> None:
        """Each row its own verdict: a NaN or out-of-range row fails only its own request."""
        for entry, p, c in zip(batch, prediction.tolist(), score.tolist(), strict=True):
            if entry.future.done():
                continue
            problem = output_problem(p, c, self._ranges)
            if problem:
                entry.future.set_exception(ModelFailure(problem, answered(self.version, p, c, self.outputs)))
            else:
                entry.future.set_result(ModelAnswer(p, c))

    def _failure(self, kind: str, detail: str) -> ModelFailure:
        return ModelFailure(kind, f"version {self.version}: {detail}")

    async def close(self) -> None:
        """Cancel the calls still running (shutdown)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class MicroBatcher:
    """One RowQueue per (version, role), created on first use.

    :param call: sends one batch to Triton (TritonModelClient.infer_rows, or a fake in tests).
    :param settings: batch size, delay and in-flight limit (max_batch 1 turns batching off).
    :param ranges: the valid prediction and score; an answer outside them is a failure.
    :param observe: told the size of each batch sent.
    :param outputs: the prediction's and the score's names.
    """

    def __init__(
        self,
        call: BatchCall,
        settings: BatchSettings,
        ranges: OutputRanges,
        observe: BatchObserver | None = None,
        *,
        outputs: tuple[str, str],
    ) -> None:
        self._call, self.settings, self._ranges, self._observe = call, settings, ranges, observe
        self.outputs = outputs
        self._queues: dict[tuple[int, str], RowQueue] = {}

    async def predict(self, version: int, row: np.ndarray, timeout_s: float, role: str = "stable") -> ModelAnswer:
        """Prediction and score for one encoded row, sent with whatever else is waiting for that version."""
        queue = self._queues.get((version, role))
        if queue is None:
            queue = self._queues[version, role] = RowQueue(
                version, role, self._call, self.settings, self._ranges, self._observe, outputs=self.outputs
            )
        return await queue.submit(row, timeout_s)

    async def close(self) -> None:
        """Cancel every call still running."""
        await asyncio.gather(*(q.close() for q in self._queues.values()))
