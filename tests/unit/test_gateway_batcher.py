"""The micro-batcher against a fake Triton call: coalescing, per-row verdicts, whole-call failures, queues per role."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from mlrelease.gateway.batcher import BatchSettings, MicroBatcher
from mlrelease.gateway.model_client import ModelAnswer, ModelFailure

RANGES = ((0.0, 500.0), (0.0, 1.0))  # the parcel spec's ETA hours and confidence
OUTPUTS = ("eta_prediction", "confidence_score")


class FakeTriton:
    """Answers eta = first feature, confidence 0.5; records each call's version, rows and role."""

    def __init__(self, delay_s: float = 0.0, fail: str | None = None) -> None:
        self.calls: list[tuple[int, int, str]] = []
        self.delay_s, self.fail = delay_s, fail
        self.release = asyncio.Event()
        self.release.set()

    async def __call__(self, version: int, rows: np.ndarray, deadline: float, role: str):
        self.calls.append((version, len(rows), role))
        await self.release.wait()
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if asyncio.get_running_loop().time() > deadline:
            raise ModelFailure("timeout", f"version {version} did not answer in time")
        if self.fail:
            raise ModelFailure(self.fail, f"version {version} refused")
        return rows[:, 0].astype(np.float64), np.full(len(rows), 0.5)


def _row(value: float) -> np.ndarray:
    row = np.zeros((1, 14), dtype=np.float32)
    row[0, 0] = value
    return row


def _batcher(triton: FakeTriton, **settings) -> MicroBatcher:
    return MicroBatcher(triton, BatchSettings(**settings), RANGES, outputs=OUTPUTS)


async def _gather(batcher: MicroBatcher, values, version: int = 1, role: str = "stable", timeout_s: float = 1.0):
    return await asyncio.gather(
        *(batcher.predict(version, _row(v), timeout_s, role) for v in values), return_exceptions=True
    )


def test_a_lone_request_is_sent_at_once_alone():
    async def scenario():
        triton = FakeTriton()
        answer = await _batcher(triton).predict(1, _row(12.0), 1.0)
        return triton.calls, answer

    calls, answer = asyncio.run(scenario())
    assert calls == [(1, 1, "stable")]
    assert answer == ModelAnswer(12.0, 0.5)


def test_concurrent_requests_share_calls_and_each_gets_its_own_row():
    async def scenario():
        triton = FakeTriton(delay_s=0.01)
        return await _gather(_batcher(triton, max_batch=64, max_in_flight=1), range(1, 41)), triton.calls

    answers, calls = asyncio.run(scenario())
    assert [a.prediction for a in answers] == [float(v) for v in range(1, 41)]
    assert sum(n for _, n, _ in calls) == 40 and len(calls) < 40  # coalesced
    assert all(n <= 64 for _, n, _ in calls)


def test_batches_never_exceed_max_batch():
    async def scenario():
        triton = FakeTriton()
        await _gather(_batcher(triton, max_batch=8), range(1, 30))
        return triton.calls

    calls = asyncio.run(scenario())
    assert max(n for _, n, _ in calls) == 8 and sum(n for _, n, _ in calls) == 29


def test_a_nan_row_fails_only_its_own_request():
    async def scenario():
        return await _gather(_batcher(FakeTriton(), max_in_flight=1), [10.0, math.nan, 30.0, 600.0, 5.0])

    good1, nan, good2, too_long, good3 = asyncio.run(scenario())
    assert (good1.prediction, good2.prediction, good3.prediction) == (10.0, 30.0, 5.0)
    assert isinstance(nan, ModelFailure) and nan.kind == "nan"
    assert isinstance(too_long, ModelFailure) and too_long.kind == "out_of_range"


def test_a_failing_call_fails_every_row_with_its_kind():
    async def scenario():
        return await _gather(_batcher(FakeTriton(fail="error")), [1.0, 2.0, 3.0])

    failures = asyncio.run(scenario())
    assert all(isinstance(f, ModelFailure) and f.kind == "error" for f in failures)
    assert len({id(f) for f in failures}) == 3  # one exception per request, never a shared one
    assert failures[0].call is not None and {id(f.call) for f in failures} == {id(failures[0].call)}  # one call


def test_a_slow_call_times_out_every_row_in_it():
    async def scenario():
        return await _gather(_batcher(FakeTriton(delay_s=0.05)), [1.0, 2.0], timeout_s=0.01)

    assert all(isinstance(f, ModelFailure) and f.kind == "timeout" for f in asyncio.run(scenario()))


def test_candidate_rows_do_not_wait_behind_a_stuck_stable_call():
    async def scenario():
        triton = FakeTriton()
        triton.release.clear()  # every call hangs until released
        batcher = _batcher(triton, max_in_flight=1)
        stable = asyncio.ensure_future(batcher.predict(1, _row(1.0), 5.0, "stable"))
        await asyncio.sleep(0.01)
        more_stable = asyncio.ensure_future(batcher.predict(1, _row(2.0), 5.0, "stable"))
        candidate = asyncio.ensure_future(batcher.predict(2, _row(3.0), 5.0, "candidate"))
        await asyncio.sleep(0.01)
        seen = list(triton.calls)  # the candidate's call went out although stable's slot is taken
        triton.release.set()
        return seen, await stable, await more_stable, await candidate

    seen, *answers = asyncio.run(scenario())
    assert seen == [(1, 1, "stable"), (2, 1, "candidate")]
    assert [a.prediction for a in answers] == [1.0, 2.0, 3.0]


def test_rows_that_waited_past_their_timeout_for_a_slot_fail_without_being_sent():
    async def scenario():
        triton = FakeTriton()
        triton.release.clear()
        batcher = _batcher(triton, max_in_flight=1)
        first = asyncio.ensure_future(batcher.predict(1, _row(1.0), 5.0))
        await asyncio.sleep(0.01)
        late = asyncio.ensure_future(batcher.predict(1, _row(2.0), 0.01))
        await asyncio.sleep(0.05)
        triton.release.set()
        return await first, await asyncio.gather(late, return_exceptions=True), triton.calls

    first, (late,), calls = asyncio.run(scenario())
    assert first.prediction == 1.0
    assert isinstance(late, ModelFailure) and late.kind == "timeout"
    assert calls == [(1, 1, "stable")]


def test_a_cancelled_request_is_dropped_and_the_rest_answered():
    async def scenario():
        triton = FakeTriton()
        triton.release.clear()
        batcher = _batcher(triton, max_in_flight=1)
        first = asyncio.ensure_future(batcher.predict(1, _row(1.0), 5.0))
        await asyncio.sleep(0.01)
        gone = asyncio.ensure_future(batcher.predict(1, _row(2.0), 5.0))
        kept = asyncio.ensure_future(batcher.predict(1, _row(3.0), 5.0))
        await asyncio.sleep(0)
        gone.cancel()
        triton.release.set()
        return await first, await kept, triton.calls

    first, kept, calls = asyncio.run(scenario())
    assert (first.prediction, kept.prediction) == (1.0, 3.0)
    assert calls == [(1, 1, "stable"), (1, 1, "stable")]


def test_requests_parsed_together_on_an_idle_queue_share_one_call():
    async def scenario():
        triton = FakeTriton(delay_s=0.01)
        return await _gather(_batcher(triton), range(1, 6)), triton.calls

    answers, calls = asyncio.run(scenario())
    assert [a.prediction for a in answers] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert calls == [(1, 5, "stable")]


def test_a_request_cancelled_before_its_call_is_sent_leaves_the_others_their_call():
    async def scenario():
        triton = FakeTriton()
        batcher = _batcher(triton)
        leader = asyncio.ensure_future(batcher.predict(1, _row(1.0), 5.0))
        await asyncio.sleep(0)  # its row is queued and the send is scheduled for the end of this iteration
        riders = [asyncio.ensure_future(batcher.predict(1, _row(v), 5.0)) for v in (2.0, 3.0)]
        leader.cancel()
        answers = await asyncio.gather(*riders)
        return leader.cancelled(), answers, triton.calls

    cancelled, answers, calls = asyncio.run(scenario())
    assert cancelled and [a.prediction for a in answers] == [2.0, 3.0]
    assert calls == [(1, 2, "stable")]


def test_observer_sees_each_batch_size():
    seen: list[tuple[int, str, int]] = []

    async def scenario():
        batcher = MicroBatcher(
            FakeTriton(), BatchSettings(max_batch=4), RANGES, lambda v, r, n: seen.append((v, r, n)), outputs=OUTPUTS
        )
        await _gather(batcher, range(1, 10), version=7, role="candidate")

    asyncio.run(scenario())
    assert sum(n for _, _, n in seen) == 9 and {(v, r) for v, r, _ in seen} == {(7, "candidate")}


@pytest.mark.parametrize("bad", [{"max_batch": 0}, {"max_in_flight": 0}, {"max_delay_s": -1.0}])
def test_invalid_settings_are_refused(bad):
    with pytest.raises(ValueError):
        BatchSettings(**bad)
