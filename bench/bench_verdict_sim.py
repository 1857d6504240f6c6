"""Release verdicts at production exposure: simulated rollouts through the product's own analysis, tick by tick.

Usage: python bench/bench_verdict_sim.py [--profile production|demo] [--scenario aa|errors|...|all] [--rollouts 200]
                                         [--workers N] [--seed 1] [--exact] [--baseline REV [--baseline-rollouts N]]
       python bench/bench_verdict_sim.py --agreement [--scenario …] [--rollouts 40]   # exact vs aggregated
       python bench/bench_verdict_sim.py --check-tick [--repeats 200]                 # one tick's per-user sums
       python bench/bench_verdict_sim.py --check-baseline [--exact]                   # the pre-rollout windows

Traffic (`bench/verdict_traffic.py`): 100 req/s from 20,000 users with heavy-tailed activity (the top 1 % make ~23 %
of the requests), per-user differences in latency, confidence and ETA, sticky assignment by user bucket, 10 % client
repeats within a minute, 3 gateway replicas, and every version's own hard failures at 1 in 10,000 calls (a fifth of
them in bursts of 3–5); a candidate call that fails is retried on stable. Time is compressed (nothing sleeps).

By default each tick's traffic is drawn *aggregated* (`verdict_traffic.generate_sums`): per-user sums per arm,
failures as timed events, successes as counts per replica and second, ~10x faster than drawing every call. `--exact`
draws every call (`verdict_traffic.generate`) and sums them with the product's `summarize_calls`; `--agreement` runs
both on the same seeds and compares the outcomes, `--check-tick` compares one tick's per-user sums.

What runs is the product's code, not a re-implementation: every tick is the product's one look
(`mlrelease.rollout.tick.look`, what the DAG's analyze step runs: exposure, `analyze_stage` on the arms' per-user
windows (`CohortWindow`: clustered bands, relative outage cut, each user's pre-rollout sums as the covariate) and
`next_action`), and the simulator stores its action with `apply`; each replica's fast guard is the gateway's
`SplitGuard`, fed the replica's first calls in time order as the gateway tells it (a candidate's NaN answer is an
invalid answer, tripping at `invalid_to_trip`, not a failure weighed against stable). The pre-rollout baseline the
look asks for (the plan's `baseline_s` before the first stage opened, every user on stable) is drawn once per rollout
from the same traffic model on its own random stream (`--check-baseline` shows it as the product reads it). A guard
trip reaches the analysis at its next tick, as in a real run (the replica that tripped moves its own traffic at once
and the routing store tells the others within a refresh). A rollout ends at promotion, rollback or pause, and also
once a cohort was rolled back: such a rollout can never be promoted automatically (`next_action` pauses it at the
last stage), so its remaining stages are not simulated.

With `--baseline REV` traffic of the same seeds is judged by the engine of commit REV too (its analysis grouped by
the version that answered, independent calls, the absolute 3-in-10 s breaker), in a subprocess on that commit's
source (`bench/verdict_sim_baseline.py`, per-call traffic: the very same calls as `--exact`), and the table shows
both side by side.
"""

from __future__ import annotations

import os

# One BLAS thread per process: the contracts' dot products are on ~20,000 users, where OpenBLAS's threads only
# contend with the other worker (on a busy 2-core box a 20,000-long dot took 9 ms instead of 5 µs).
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")


def _keep_freed_memory() -> None:
    """Let glibc's malloc reuse freed blocks of any size instead of mapping fresh pages for each large array: every
    tick and look allocates several arrays of 20,000 users × 41 latency bounds (3 MB), and faulting their pages in
    anew cost ~10 % of a rollout's CPU (the workers are forked and inherit this). No effect elsewhere than glibc."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    libc.mallopt(m_mmap_threshold, 256 << 20)
    libc.mallopt(m_trim_threshold, 1 << 30)
    libc.mallopt(m_top_pad, 64 << 20)


_keep_freed_memory()

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from datetime import datetime, timedelta  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import verdict_traffic as traffic  # noqa: E402
from verdict_scenarios import CANDIDATE, REFRESH_S, SCENARIOS, STABLE, T0, Outcome  # noqa: E402

from mlrelease.gateway.arm_metrics import ANALYSIS_UNITS, UNIT_OF_BUCKET  # noqa: E402
from mlrelease.gateway.config import GuardConfig  # noqa: E402
from mlrelease.gateway.run_pool import pooled_run  # noqa: E402
from mlrelease.gateway.split_guard import SplitGuard  # noqa: E402
from mlrelease.rollout.analysis import StageAnalysis  # noqa: E402
from mlrelease.rollout.machine import (  # noqa: E402
    Action,
    ActionKind,
    Phase,
    RolloutState,
    apply,
    candidate_percent,
    next_action,
)
from mlrelease.rollout.outage import CallTimeline  # noqa: E402
from mlrelease.rollout.plan import RolloutPlan, load_plan  # noqa: E402
from mlrelease.rollout.tick import look  # noqa: E402
from mlrelease.rollout.windows import (  # noqa: E402
    EMPTY,
    HARD_FAILURES,
    LATENCY_BOUNDS_S,
    LOW_CONFIDENCE,
    NAN,
    SERVING_FAILURES,
    CohortWindow,
    by_unit,
    dense,
    summarize_calls,
)

LOG_BOUNDS = np.log(LATENCY_BOUNDS_S)
VERSIONS = (STABLE, CANDIDATE)  # by arm: 0 stable-assigned, 1 candidate-assigned
BASELINE_STREAM = 0xBA5E  # the pre-rollout traffic's random stream: (seed, this)
RESULTS = ("promoted", "rolled_back", "cohort_rolled_back", "paused")
assert traffic.LOW_CONFIDENCE == LOW_CONFIDENCE and traffic.SUMS == tuple(
    f for f in CohortWindow.__dataclass_fields__ if f not in ("units", "slow")
), "verdict_traffic's per-user sums must be the product's"


# --- Per-call traffic (--exact): every call summed by the product's summarize_calls ------------------------------


class SimSource:
    """The MetricsSource of one stage from per-call traffic, fed tick by tick: per-user sums per (cohort, assigned
    version), dense by user, and the per-second timeline; slices of `max_gap_s` where stable failed at least 3 times
    are kept apart so that an outage can be cut out of the windows exactly."""

    location = "simulated"

    def __init__(
        self, opened: float, users: int, cohorts: tuple[str, ...], slice_s: float, before: Baseline | None = None
    ) -> None:
        self.opened, self.users, self.cohorts, self.slice_s, self.before = opened, users, cohorts, slice_s, before
        self.units = np.arange(users, dtype=np.int64)  # dense windows: every user of the world, by id
        self.total: dict[tuple[str, int], CohortWindow] = {}
        self.suspect: dict[int, dict[tuple[str, int], CohortWindow]] = {}
        self.calls = np.zeros(0)
        self.stable_requests = np.zeros(0)
        self.stable_failures = np.zeros(0)

    def add(self, calls: traffic.Calls) -> None:
        """Fold one tick's calls in."""
        seconds = (calls.t - self.opened).astype(np.int64)
        size = int(seconds.max()) + 1 if len(seconds) else 0
        first = ~calls.retry
        stable_first = first & (calls.arm == 0)
        failed = stable_first & np.isin(calls.outcome, SERVING_FAILURES)
        self.calls = _grow(self.calls, np.bincount(seconds, minlength=size))
        self.stable_requests = _grow(self.stable_requests, np.bincount(seconds[stable_first], minlength=size))
        self.stable_failures = _grow(self.stable_failures, np.bincount(seconds[failed], minlength=size))
        slices = (calls.t[failed] - self.opened) // self.slice_s
        suspects = {int(s) for s, n in Counter(slices.tolist()).items() if n >= 3}
        for index, name in enumerate(self.cohorts):
            for arm, version in enumerate(VERSIONS):
                part = _subset(calls, (calls.cohort == index) & (calls.arm == arm))
                key = (name, version)
                window = dense(_summarize(part), self.users)
                self.total[key] = self.total[key].merged(window) if key in self.total else window
                for s in suspects:
                    piece = dense(_summarize(_subset(part, (part.t - self.opened) // self.slice_s == s)), self.users)
                    slot = self.suspect.setdefault(s, {})
                    slot[key] = slot[key].merged(piece) if key in slot else piece

    def windows(self, since: datetime, until: datetime, exclude: Any = ()) -> dict:
        """Every (cohort, assigned version) of the stage so far, with the excluded slices' requests taken out; a
        window that ends by the rollout's start is the pre-rollout baseline (every cohort on stable)."""
        if self.before is not None and self.before.covers(since, until):
            return self.before.windows(self.units)
        return _cut(self.total, self.suspect, _slices(exclude, self.opened, self.slice_s))

    def timeline(self, since: datetime, until: datetime, stable: int) -> Any:
        """The stage's per-second timeline up to `until`."""
        return _timeline(since, until, self.calls, self.stable_requests, self.stable_failures)

    def features(self, cohort: str, since: datetime, until: datetime) -> np.ndarray:
        """No feature rows in the simulation (diagnose is not part of a verdict)."""
        return np.zeros((0, 14))


def _summarize(part: traffic.Calls) -> CohortWindow:
    return summarize_calls(
        part.unit,
        part.outcome,
        part.latency_s,
        retry=part.retry,
        key=part.key,
        eta=part.eta,
        confidence=part.confidence,
    )


def _grow(have: np.ndarray, more: np.ndarray, at: int = 0) -> np.ndarray:
    """`have` with `more` added from index `at` on (grown as needed)."""
    if at + len(more) > len(have):
        have = np.pad(have, (0, at + len(more) - len(have)))
    have[at : at + len(more)] += more
    return have


def _subset(calls: traffic.Calls, rows: np.ndarray) -> traffic.Calls:
    return traffic.Calls(**{k: getattr(calls, k)[rows] for k in calls.__dataclass_fields__})


def _slices(exclude: Any, opened: float, slice_s: float) -> set[int]:
    """The slices (of `slice_s` from the stage's opening) that the excluded outages start at."""
    return {int(round((a.timestamp() - T0.timestamp() - opened) / slice_s)) for a, _ in exclude}


def _cut(total: dict, suspect: dict[int, dict], cut: set[int]) -> dict:
    """The windows with the suspect slices in `cut` taken out (the product's CohortWindow.minus)."""
    result = dict(total)
    for s in cut & set(suspect):
        for key, piece in suspect[s].items():
            result[key] = result[key].minus(piece)
    return result


def _timeline(since: datetime, until: datetime, *per_second: np.ndarray) -> CallTimeline:
    """The stage's per-second counts up to `until`, as the product's CallTimeline."""
    n = int(math.ceil((until - since).total_seconds()))
    pad = lambda a: a[:n] if len(a) >= n else np.pad(a, (0, n - len(a)))  # noqa: E731  (views: read only)
    return CallTimeline(since.timestamp(), *(pad(a) for a in per_second))


class ReplicaGuards:
    """The gateway's SplitGuard on each replica, fed that replica's first calls in time order (failures one by one,
    the successes between them in bulk at the failure's second; a candidate's NaN answer as the gateway reports it,
    `invalid_answer`, judged at a zero limit and not weighed against stable), the replicas' failures merged in time
    so that their runs pool as the gateway pools them (`_pooled_trip`); nothing more once a replica tripped."""

    def __init__(self, replicas: int, guard: GuardConfig) -> None:
        self.clock = [0.0]
        self.guards = [_split_guard(guard, lambda: self.clock[0]) for _ in range(replicas)]
        self.tripped_at: float | None = None

    def feed(self, calls: traffic.Calls) -> None:
        """One tick's calls; remembers the earliest trip's time."""
        if self.tripped_at is not None:
            return
        first = ~calls.retry
        bad = np.isin(calls.outcome, (*HARD_FAILURES, NAN))
        rows = [np.flatnonzero(first & (calls.replica == r)) for r in range(len(self.guards))]
        fed = [0] * len(self.guards)  # each replica's calls before this index are told to its guard

        def advance(replica: int, upto: int) -> None:  # the successes among the replica's calls [fed, upto)
            arm = calls.arm[rows[replica][fed[replica] : upto]]
            self.clock[0] = float(calls.t[rows[replica][upto - 1]]) if upto > fed[replica] else self.clock[0]
            self.guards[replica].observe("candidate", False, count=int((arm == 1).sum()))
            self.guards[replica].observe("stable", False, count=int((arm == 0).sum()))
            fed[replica] = max(fed[replica], upto)

        events = sorted(
            (float(calls.t[rows[r][i]]), r, i) for r in range(len(rows)) for i in np.flatnonzero(bad[rows[r]])
        )
        for when, replica, i in events:
            advance(replica, i)
            self.clock[0] = when
            row = rows[replica][i]
            guard, arm, outcome = self.guards[replica], int(calls.arm[row]), int(calls.outcome[row])
            fed[replica] = i + 1
            if _guarded(guard, arm, outcome):
                self.tripped_at = when
                return
            if arm == traffic.CANDIDATE_ARM and outcome != NAN:
                for other in range(len(rows)):  # the others' state at this moment: their successes up to it
                    if other != replica and self.guards[other].clean_run[0] != 0:  # in a run, or unseen yet
                        advance(other, int(np.searchsorted(calls.t[rows[other]], when)))
                if _pooled_trip(self.guards, replica, when):
                    self.tripped_at = when
                    return
        for replica in range(len(rows)):
            advance(replica, len(rows[replica]))


def _split_guard(guard: GuardConfig, clock: Any) -> SplitGuard:
    """One replica's guard as the gateway builds it from its GuardConfig."""
    return SplitGuard(
        ratio=guard.failure_ratio,
        alpha=guard.false_trip_rate,
        window_s=guard.window_s,
        invalid_to_trip=guard.invalid_to_trip,
        burst_failures=guard.burst_failures,
        clock=clock,
    )


def _pooled_trip(guards: list[SplitGuard], replica: int, now: float) -> bool:
    """After a candidate failure on `replica`: the replicas' runs pooled as the gateway pools them
    (gateway/run_pool.py; every replica is live, and the pool answers at once: Redis takes about a millisecond)."""
    if len(guards) < 2 or guards[replica].clean_run[0] < 1:
        return False
    runs = {str(r): (*g.clean_run, now) for r, g in enumerate(guards)}
    return guards[replica].pooled_trip(pooled_run(runs, now, live_s=1.0))


def _guarded(guard: SplitGuard, arm: int, outcome: int) -> bool:
    """One failed first call told to its replica's guard as the gateway does (`GatewayService._guarded`): a NaN
    answer from the candidate is an invalid answer (a zero limit, not weighed against stable, not counted as a
    request); any other failure is a failed request of the version that made it. True when it trips."""
    if arm == traffic.CANDIDATE_ARM and outcome == NAN:
        return guard.invalid_answer()
    return guard.observe("candidate" if arm == traffic.CANDIDATE_ARM else "stable", True)


# --- Aggregated traffic (default): per-user sums drawn per tick ---------------------------------------------------


class SumSource:
    """The MetricsSource of one stage from aggregated ticks. Every window of the stage is laid out over the same
    units, every user of the world (the stable arm's users cohort by cohort, then the candidate arm's), and is zero
    outside its own cohort and arm: pooling cohorts adds arrays, and the pre-rollout baseline lies beside any arm
    user by user with nothing to look up. Also the per-second timeline; and, for slices of `max_gap_s` where stable
    failed at least 3 times, the slice's own per-user sums (cut from the tick's calls) so that an outage can be cut
    out of the windows."""

    location = "simulated"

    def __init__(
        self,
        opened: float,
        stage: traffic.StageTraffic,
        cohorts: tuple[str, ...],
        slice_s: float,
        seconds: int,
        before: Baseline | None = None,
    ) -> None:
        self.opened, self.stage, self.cohorts, self.slice_s, self.before = opened, stage, cohorts, slice_s, before
        self.units = np.concatenate(stage.assignment.users).astype(np.int64)
        self.blocks = self._blocks()
        self.total = {key: _zeros(len(self.units)) for key, *_ in self.blocks}
        self.suspect: dict[int, dict[tuple[str, int], CohortWindow]] = {}
        # the timeline for the stage's longest exposure at once (growing it tick by tick copied it every tick)
        self.calls, self.stable_requests, self.stable_failures = np.zeros((3, seconds))

    def _blocks(self) -> list[tuple[tuple[str, int], int, slice, slice]]:
        """(cohort, version), arm, the cohort's users within the arm's arrays and within the stage's units, for
        every cohort with users in the arm."""
        out, offset = [], 0
        for arm, blocks in enumerate(self.stage.assignment.blocks):
            for index, name in enumerate(self.cohorts):
                a, b = int(blocks[index]), int(blocks[index + 1])
                if b > a:
                    out.append(((name, VERSIONS[arm]), arm, slice(a, b), slice(offset + a, offset + b)))
            offset += len(self.stage.assignment.users[arm])
        return out

    def add(self, tick: traffic.Tick, rng: np.random.Generator) -> None:
        """Fold one tick in."""
        for key, arm, users, at in self.blocks:
            _accumulate(self.total[key], tick.sums[arm], users, at)
        self._add_timeline(tick)
        suspects = self._suspects(tick)
        if suspects:
            spans = [(self.opened + s * self.slice_s, self.opened + (s + 1) * self.slice_s) for s in suspects]
            for s, piece in zip(suspects, tick.pieces(spans, rng, LOG_BOUNDS), strict=True):
                self._keep(s, piece)

    def _add_timeline(self, tick: traffic.Tick) -> None:
        f, at = tick.failures, int(round(tick.t0 - self.opened))
        stable = f.arm == traffic.STABLE_ARM
        serving = stable & _serving(f.outcome)
        self.calls = _grow(self.calls, tick.ok.sum(axis=(0, 1)), at)
        self.calls = _grow(self.calls, self._per_second(np.concatenate([f.t, tick.retry_t])))
        self.stable_requests = _grow(self.stable_requests, tick.ok[traffic.STABLE_ARM].sum(axis=0), at)
        self.stable_requests = _grow(self.stable_requests, self._per_second(f.t[stable]))
        self.stable_failures = _grow(self.stable_failures, self._per_second(f.t[serving]))

    def _per_second(self, t: np.ndarray) -> np.ndarray:
        return np.bincount((t - self.opened).astype(np.int64)).astype(np.float64)

    def _suspects(self, tick: traffic.Tick) -> list[int]:
        f = tick.failures
        serving = (f.arm == traffic.STABLE_ARM) & _serving(f.outcome)
        slices = Counter(((f.t[serving] - self.opened) // self.slice_s).astype(int).tolist())
        return sorted(s for s, n in slices.items() if n >= 3)

    def _keep(self, s: int, piece: tuple[dict[str, np.ndarray], ...]) -> None:
        slot = self.suspect.setdefault(s, {})
        for key, arm, users, at in self.blocks:
            sums = _zeros(len(self.units))
            _accumulate(sums, piece[arm], users, at)
            window = _window(self.units, sums)
            slot[key] = slot[key].merged(window) if key in slot else window  # a slice across two ticks (demo)

    def windows(self, since: datetime, until: datetime, exclude: Any = ()) -> dict:
        """Every (cohort, assigned version) of the stage so far, with the excluded slices' requests taken out; a
        window that ends by the rollout's start is the pre-rollout baseline (every cohort on stable)."""
        if self.before is not None and self.before.covers(since, until):
            return self.before.windows(self.units)
        total = {key: _window(self.units, self.total[key]) for key, *_ in self.blocks}
        return _cut(total, self.suspect, _slices(exclude, self.opened, self.slice_s))

    def timeline(self, since: datetime, until: datetime, stable: int) -> Any:
        """The stage's per-second timeline up to `until`."""
        return _timeline(since, until, self.calls, self.stable_requests, self.stable_failures)

    def features(self, cohort: str, since: datetime, until: datetime) -> np.ndarray:
        """No feature rows in the simulation (diagnose is not part of a verdict)."""
        return np.zeros((0, 14))


def _serving(outcome: np.ndarray) -> np.ndarray:
    """Which outcomes are SERVING_FAILURES (np.isin costs more than the comparisons on a few events)."""
    return np.logical_or.reduce([outcome == code for code in SERVING_FAILURES])


def _zeros(users: int) -> dict[str, np.ndarray]:
    sums = {name: np.zeros(users) for name in traffic.SUMS}
    # (bounds, users): a bound's column is contiguous. float32 holds these counts exactly (below 2**24 per user and
    # bound; the sums over users numpy takes pairwise), and halves the memory the analysis's merges stream through.
    sums["slow"] = np.zeros((len(LATENCY_BOUNDS_S), users), np.float32)
    return sums


def _accumulate(into: dict[str, np.ndarray], more: dict[str, Any], users: slice, at: slice | None = None) -> None:
    """Add one tick's sums of the users in `users` (a cohort's block of the arm's arrays) in place, at `at` of
    `into` (default: the same positions)."""
    at = users if at is None else at
    for name in traffic.SUMS:
        into[name][at] += more[name][users]
    more["slow"].add_into(into["slow"][:, at], users)


def _window(units: np.ndarray, sums: dict[str, np.ndarray]) -> CohortWindow:
    """The sums as the product's CohortWindow (views: the analysis only reads them)."""
    return CohortWindow(units, **{name: sums[name] for name in traffic.SUMS}, slow=sums["slow"].T)


# --- Before the rollout: every user on stable (the contracts' covariate) ------------------------------------------


class Baseline:
    """Every user's sums over the `baseline_s` before the rollout started, when everyone was on stable: what the
    product's contracts adjust on (CUPED). Drawn once per rollout by user id, from the same traffic model with
    stable's behaviour (background failures, timeouts and repeats included); each stage's source asks for them laid
    out over its own units, keyed (cohort, stable) for every cohort."""

    def __init__(
        self, since: datetime, until: datetime, cohort: np.ndarray, cohorts: tuple[str, ...], sums: dict
    ) -> None:
        self.since, self.until, self.cohort, self.cohorts, self.sums = since, until, cohort, cohorts, sums
        self._laid: tuple[np.ndarray, dict] | None = None  # the last layout asked for (one per stage)

    def covers(self, since: datetime, until: datetime) -> bool:
        """Whether a window ending at `until` lies before the rollout's start (then these sums answer it; only the
        whole stretch drawn can: a shorter one, after a previous rollout's end, is no rollout the simulator runs)."""
        if until > self.until:
            return False
        if (since, until) != (self.since, self.until):
            raise ValueError(f"the simulator drew the baseline {self.since} … {self.until}, not {since} … {until}")
        return True

    def windows(self, units: np.ndarray) -> dict[tuple[str, int], CohortWindow]:
        """(cohort, stable) for every cohort, laid out over `units` (user ids; zero outside the cohort)."""
        if self._laid is not None and self._laid[0] is units:
            return self._laid[1]
        cohort = self.cohort[units]
        gathered = {name: self.sums[name][units] for name in traffic.SUMS}
        slow = self.sums["slow"][:, units]
        out = {}
        for index, name in enumerate(self.cohorts):
            mine = cohort == index
            sums = {key: np.where(mine, values, 0.0) for key, values in gathered.items()}
            sums["slow"] = np.where(mine, slow, np.float32(0.0))
            out[(name, STABLE)] = _window(units, sums)
        self._laid = (units, out)
        return out


def draw_baseline(
    world: traffic.World,
    model: traffic.UserModel | None,
    rng: np.random.Generator,
    seconds: float,
    until: datetime,
    exact: bool = False,
    chunk_s: float = 600.0,
) -> Baseline:
    """`seconds` of stable-only traffic for the world, ending at the rollout's start, as per-user sums: aggregated
    in one draw (`generate_sums` over everyone on stable: ~720,000 calls' latencies for 2 h at 100 req/s), or per
    call (`model` None or `exact`: `generate` in chunks, summed by the product's `summarize_calls`)."""
    users, bounds = world.profile.users, len(LATENCY_BOUNDS_S)
    sums = {name: np.zeros(users) for name in traffic.SUMS}
    if exact or model is None:
        total = EMPTY
        for t0 in np.arange(-seconds, 0.0, chunk_s):
            calls = traffic.generate(world, traffic.CandidateEffect(), rng, float(t0), min(t0 + chunk_s, 0.0), {})
            total = total.merged(dense(_summarize(calls), users))
        if len(total.units):
            sums = {name: np.asarray(getattr(total, name), np.float64) for name in traffic.SUMS}
            sums["slow"] = np.ascontiguousarray(total.slow.T, np.float32)
        else:
            sums["slow"] = np.zeros((bounds, users), np.float32)
    else:
        assignment = traffic.assign(world, {})  # everyone on stable
        tick = traffic.generate_sums(traffic.stage_traffic(model, assignment), rng, -seconds, 0.0, LOG_BOUNDS)
        ids, drawn = assignment.users[traffic.STABLE_ARM], tick.sums[traffic.STABLE_ARM]
        for name in traffic.SUMS:
            sums[name][ids] = drawn[name]
        sums["slow"] = np.zeros((bounds, users), np.float32)
        sums["slow"][:, ids] = drawn["slow"].full(bounds)
    return Baseline(until - timedelta(seconds=seconds), until, world.cohort, world.profile.cohorts, sums)


class _ReplicaFeed:
    """One replica's guard and its successes per second not yet told to it: the tick's, and the previous tick's last
    seconds (the next failures look back a window)."""

    def __init__(self, guard: SplitGuard, window: int, clock: list[float]) -> None:
        self.guard, self.window, self.clock = guard, window, clock
        self.pending: tuple[float, np.ndarray] | None = None

    def begin(self, tick: traffic.Tick, replica: int) -> None:
        """The tick's successes on this replica after the unfed seconds of the previous tick."""
        ok = tick.ok[:, replica, :]
        if self.pending is None:
            self.start, self.ok = tick.t0, ok.copy()
        else:
            self.start, self.ok = self.pending[0], np.concatenate([self.pending[1], ok], axis=1)
        self.fed, self.part, self.last = 0, 0.0, self.ok.shape[1] - 1  # seconds before `fed` are in; `part` of `fed`

    def advance(self, when: float, rng: np.random.Generator) -> None:
        """Tell the guard the successes up to `when`: the window's whole seconds before it, and the share of its own
        second that came before it (seconds that expire unseen are never fed: the guard would drop them unread)."""
        second = min(int(when - self.start), self.last)
        if second > self.fed:
            for earlier in range(max(self.fed, second - self.window), second):
                self.clock[0] = self.start + earlier
                _successes(self.guard, self.ok[:, earlier])
            self.fed, self.part = second, 0.0
        into = min(max(when - self.start - second, self.part), 1.0)
        share = (into - self.part) / (1.0 - self.part) if self.part < 1 else 0.0
        before = rng.binomial(self.ok[:, second].astype(np.int64), share)
        self.ok[:, second] -= before
        self.part = into
        self.clock[0] = when
        _successes(self.guard, before)

    def end(self) -> None:
        """Keep the seconds the next tick's first failures look back to."""
        keep = max(self.fed, self.last - self.window)
        self.pending = (self.start + keep, self.ok[:, keep:])


class TickGuards:
    """The gateway's SplitGuard on each replica, fed from a tick's failures in time order and its successes per
    second (`_ReplicaFeed`); the replicas' failures merged in time so that their runs pool as the gateway pools them
    (`_pooled_trip`); nothing more once a replica tripped."""

    def __init__(self, replicas: int, guard: GuardConfig) -> None:
        self.clock = [0.0]
        window = int(math.ceil(guard.window_s))
        self.feeds = [
            _ReplicaFeed(_split_guard(guard, lambda: self.clock[0]), window, self.clock) for _ in range(replicas)
        ]
        self.guards = [feed.guard for feed in self.feeds]
        self.tripped_at: float | None = None

    def feed(self, tick: traffic.Tick, rng: np.random.Generator) -> None:
        """One tick; remembers the earliest trip's time."""
        if self.tripped_at is not None:
            return
        for replica, feed in enumerate(self.feeds):
            feed.begin(tick, replica)
        f = tick.failures
        hard = np.isin(f.outcome, (*HARD_FAILURES, NAN))
        for when, replica, arm, outcome in zip(
            *(a[hard].tolist() for a in (f.t, f.replica, f.arm, f.outcome)), strict=True
        ):
            self.feeds[replica].advance(when, rng)
            if _guarded(self.guards[replica], arm, outcome) or self._pooled(replica, arm, outcome, when, rng):
                self.tripped_at = when
                return
        for feed in self.feeds:
            feed.end()

    def _pooled(self, replica: int, arm: int, outcome: int, when: float, rng: np.random.Generator) -> bool:
        """After a candidate failure (not NaN, which the gateway judges apart), the pool's answer as of `when`."""
        if arm != traffic.CANDIDATE_ARM or outcome == NAN or self.guards[replica].clean_run[0] < 1:
            return False
        for other, feed in enumerate(self.feeds):  # the others' runs at this moment: their successes up to it
            if other != replica and feed.guard.clean_run[0] != 0:  # in a run, or its first calls unfed
                feed.advance(when, rng)
        return _pooled_trip(self.guards, replica, when)


def _successes(guard: SplitGuard, counts: np.ndarray) -> None:
    stable, candidate = int(counts[traffic.STABLE_ARM]), int(counts[traffic.CANDIDATE_ARM])
    if candidate:
        guard.observe("candidate", False, count=candidate)
    if stable:
        guard.observe("stable", False, count=stable)


# --- One rollout ---------------------------------------------------------------------------------------------------


@dataclass
class Rollout:
    """One simulated rollout in progress: the plan, the traffic model, the rollout state and what was measured."""

    plan: RolloutPlan
    profile: str
    exact: bool
    shape: traffic.TrafficProfile
    world: traffic.World
    effect: traffic.CandidateEffect
    model: traffic.UserModel | None
    rng: np.random.Generator
    guards: Any
    state: RolloutState
    clock: float = 0.0
    opened: float = 0.0
    stage_times: list[float] = field(default_factory=list)
    first_trip: float | None = None
    source: Any = None
    before: Baseline | None = None  # every user's pre-rollout sums (None: the plan asks for none)


def start(scenario: str, profile: str, seed: int, exact: bool = False) -> Rollout:
    """A rollout of the scenario's candidate before its first stage opens."""
    effect = SCENARIOS[scenario][0]
    rng = np.random.default_rng(seed)
    shape = traffic.TrafficProfile(rate_per_s=100.0 if profile == "production" else 200.0)
    plan = _plan(shape.cohorts)
    world = traffic.make_world(shape, rng)
    guard = GuardConfig()
    guards = (ReplicaGuards if exact else TickGuards)(shape.replicas, guard)
    model = None if exact else traffic.user_model(world, effect)
    state = RolloutState(candidate_version=CANDIDATE, stable_version=STABLE)
    run = Rollout(plan, profile, exact, shape, world, effect, model, rng, guards, state)
    seconds = getattr(plan, "baseline_s", {}).get(profile, 0.0)
    if seconds > 0:  # its own stream: the rollout's traffic is the same with or without it
        before_rng = np.random.default_rng([seed, BASELINE_STREAM])
        run.before = draw_baseline(world, model, before_rng, seconds, T0, exact)
    return run


@functools.cache
def _plan(cohorts: tuple[str, ...]) -> RolloutPlan:
    """The plan, read and validated once per process (it is immutable): contracts' α drawn from the plan's error
    budget, as the rollout step does."""
    plan = load_plan()
    return plan.allocated(cohorts) if hasattr(plan, "allocated") else plan


def simulate(scenario: str, profile: str, seed: int, exact: bool = False) -> Outcome:
    """One rollout of the scenario's candidate, from stage 1 to promotion, rollback (of all, or of a cohort) or
    pause."""
    run = start(scenario, profile, seed, exact)
    while True:
        outcome = step(run)
        if outcome is not None:
            return outcome


def step(run: Rollout) -> Outcome | None:
    """One analysis tick (or opening a stage); the outcome once the rollout ended."""
    now = T0 + timedelta(seconds=run.clock)
    action = next_action(run.state, run.plan, run.profile, now, None)
    if action.kind is ActionKind.OPEN_STAGE:
        _open(run, action, now)
        return None
    spec = run.plan.stage(run.state.stage)
    _traffic(run, spec.check_every_s[run.profile])
    now = T0 + timedelta(seconds=run.clock)
    tripped = "guard" if run.guards.tripped_at is not None else None
    # the product's one look (exposure, analyze_stage with the pre-rollout covariate, next_action), as the DAG runs it
    action, analysis = look(run.state, run.plan, run.profile, run.source, run.shape.cohorts, now, tripped=tripped)
    if action.kind is ActionKind.WAIT:
        return None
    return _decide(run, action, analysis, now)


def _open(run: Rollout, action: Action, now: datetime) -> None:
    run.state, run.opened = apply(run.state, action, run.plan, now), run.clock
    if getattr(run.state, "started_at", now) is None:  # the product sets it on the first opening; older ones did not
        run.state = run.state.model_copy(update={"started_at": now})
    slice_s, cohorts = run.plan.max_gap_s[run.profile], run.shape.cohorts
    if run.exact:
        run.source = SimSource(run.clock, run.shape.users, cohorts, slice_s, run.before)
    else:
        assert run.model is not None
        assignment = traffic.assign(run.world, candidate_percent(run.state, run.plan))
        spec = run.plan.stage(run.state.stage)
        seconds = int(spec.max_exposure_s[run.profile] + 2 * spec.check_every_s[run.profile])
        stage = traffic.stage_traffic(run.model, assignment)
        run.source = SumSource(run.clock, stage, cohorts, slice_s, seconds, run.before)
    if _BY_UNIT:  # the gateway's units: contiguous canary-bucket ranges (gateway/arm_metrics.py)
        unit_of_user = np.asarray(UNIT_OF_BUCKET, dtype=np.int64)[run.world.bucket.astype(np.int64)]
        run.source = UnitSource(run.source, unit_of_user)


class UnitSource:
    """A stage's source read as the Prometheus source reads the gateway: every window summed into analysis units
    (`--by-unit`: gateway/arm_metrics.UNIT_OF_BUCKET) instead of per user."""

    def __init__(self, source: Any, unit_of_user: np.ndarray) -> None:
        self.source, self.unit_of_user = source, unit_of_user

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)  # the simulator feeds the wrapped source its traffic (add, stage)

    def windows(self, since: datetime, until: datetime, exclude: Any = ()) -> dict:
        """The source's windows, by unit."""
        windows = self.source.windows(since, until, exclude)
        return {key: by_unit(w, self.unit_of_user[w.units]) for key, w in windows.items()}

    def timeline(self, since: datetime, until: datetime, stable: int) -> Any:
        """The source's timeline (not per user)."""
        return self.source.timeline(since, until, stable)

    def features(self, cohort: str, since: datetime, until: datetime) -> np.ndarray:
        return self.source.features(cohort, since, until)


# Whether windows are summed into the gateway's analysis units (else per user), set by main before the workers fork.
_BY_UNIT = False


def _traffic(run: Rollout, step_s: float) -> None:
    """The tick's traffic into the stage's source and the replicas' guards."""
    t0, t1 = run.clock, run.clock + step_s
    if run.exact:
        calls = traffic.generate(run.world, run.effect, run.rng, t0, t1, candidate_percent(run.state, run.plan))
        run.source.add(calls)
        run.guards.feed(calls)
    else:
        assert run.model is not None
        tick = traffic.generate_sums(run.source.stage, run.rng, t0, t1, LOG_BOUNDS)
        run.source.add(tick, run.rng)
        run.guards.feed(tick, run.rng)
    run.clock = t1
    if run.guards.tripped_at is not None and run.first_trip is None:
        run.first_trip = run.guards.tripped_at - run.opened + REFRESH_S  # every replica moved: the stored trip adopted


def _decide(run: Rollout, action: Action, analysis: StageAnalysis, now: datetime) -> Outcome | None:
    """Store the decision; the outcome if the rollout ended (a cohort rolled back ends it: see the docstring)."""
    assert run.state.stage_opened_at is not None
    run.stage_times.append((now - run.state.stage_opened_at).total_seconds())
    why = "; ".join(sorted({f"{r.cohort} {r.metric}" for r in analysis.breaches()})) or action.reason
    run.state = apply(run.state, action, run.plan, now)
    ended = {Phase.PROMOTED: "promoted", Phase.PAUSED: "paused", Phase.ROLLING_BACK: "rolled_back"}
    result = "cohort_rolled_back" if action.kind is ActionKind.ROLLBACK_COHORT else ended.get(run.state.phase)
    if result is None:
        return None
    hours = run.clock / 3600
    return Outcome(result, action.stage, why, hours, run.first_trip, run.stage_times)


# --- Many rollouts, and the table ----------------------------------------------------------------------------------


def _run(args: tuple[str, str, int, bool]) -> dict[str, Any]:
    began = time.process_time()
    outcome = simulate(*args).as_dict()
    return {**outcome, "cpu_s": time.process_time() - began}  # what one rollout costs, whatever else runs


def run_all(
    scenarios: list[str], profile: str, rollouts: int, seed: int, workers: int, exact: bool = False
) -> dict[str, list[dict]]:
    """Every rollout of every scenario (seeds seed, seed+1, … so the baseline sees traffic of the same seeds)."""
    jobs = [(s, profile, seed + i, exact) for s in scenarios for i in range(rollouts)]
    began, done = time.perf_counter(), []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for outcome in pool.map(_run, jobs, chunksize=2):
            done.append(outcome)
            if len(done) % max(len(jobs) // 10, 1) == 0:  # progress on stderr: a full run takes minutes
                print(
                    f"{len(done)}/{len(jobs)} rollouts, {time.perf_counter() - began:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
    results: dict[str, list[dict]] = {s: [] for s in scenarios}
    for (scenario, *_), outcome in zip(jobs, done, strict=True):
        results[scenario].append(outcome)
    return results


def summarize(outcomes: list[dict]) -> dict[str, Any]:
    """Shares per result, first-stage stops, median time to each stage's decision, the guard's times, reasons."""
    n = len(outcomes)
    by = Counter(o["result"] for o in outcomes)
    stops = Counter(f"s{o['stage']} {o['result']}: {o['why']}"[:90] for o in outcomes if o["result"] != "promoted")
    trips = sorted(o["guard_s"] for o in outcomes if o.get("guard_s") is not None)
    stages = max((len(o["stage_s"]) for o in outcomes), default=0)
    per_stage = [[o["stage_s"][i] for o in outcomes if len(o["stage_s"]) > i] for i in range(stages)]
    return {
        "n": n,
        **{result: by[result] / n for result in RESULTS},
        "first_stage_stop": sum(o["result"] != "promoted" and o["stage"] == 1 for o in outcomes) / n,
        "stage_min": [statistics.median(times) / 60 for times in per_stage],
        "median_hours": statistics.median(o["hours"] for o in outcomes),
        "guard_trips": len(trips) / n,
        "guard_s_max": trips[-1] if trips else None,
        "guard_s_median": statistics.median(trips) if trips else None,
        "top_stops": stops.most_common(3),
        "cpu_s": statistics.mean(o["cpu_s"] for o in outcomes) if all("cpu_s" in o for o in outcomes) else None,
    }


def _baseline(
    rev: str, scenarios: list[str], profile: str, rollouts: int, seed: int, workers: int
) -> dict[str, list[dict]]:
    """The same seeds' per-call traffic judged by the engine of commit `rev`, in a subprocess on its source (its
    progress on stderr)."""
    repo = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "-C", str(repo), "archive", rev, "src", "config"], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        env = {**os.environ, "PYTHONPATH": f"{tmp}/src"}
        argv = [
            sys.executable,
            str(Path(__file__).with_name("verdict_sim_baseline.py")),
            *("--profile", profile, "--rollouts", str(rollouts), "--seed", str(seed)),
            *("--scenarios", ",".join(scenarios), "--workers", str(workers)),
        ]
        done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, text=True)
        if done.returncode != 0:
            raise SystemExit(f"baseline engine {rev} failed (its error is above)")
        return json.loads(done.stdout)


HEADER = (
    f"{'scenario':32} {'engine':9} {'promot.':>7} {'rollbk':>7} {'cohort':>7} {'paused':>7} {'1st st':>7} "
    f"{'s1 min':>6} {'s2 min':>6} {'s3 min':>6} {'trips':>6} {'guard s max/med':>15} {'cpu s':>7}"
)  # cpu s: CPU seconds per rollout (a worker runs 1 / that rollouts per second)


def _fmt(summary: dict[str, Any]) -> str:
    shares = " ".join(f"{summary[k]:7.1%}" for k in (*RESULTS, "first_stage_stop"))
    stages = " ".join(f"{m:6.1f}" for m in summary["stage_min"]) + "       " * (3 - len(summary["stage_min"]))
    trip = (
        f"{summary['guard_s_max']:.1f} / {summary['guard_s_median']:.1f}" if summary["guard_s_max"] is not None else "-"
    )
    cpu = f"{summary['cpu_s']:7.2f}" if summary["cpu_s"] is not None else f"{'-':>7}"
    return f"{shares} {stages} {summary['guard_trips']:6.1%} {trip:>15} {cpu}  (n={summary['n']})"


def print_table(current: dict, before: dict, baseline: str, label: str) -> None:
    """The comparison table: per scenario, the current engine (and the baseline's) and the top stops."""
    print(HEADER)
    for scenario, outcomes in current.items():
        now = summarize(outcomes)
        print(f"{scenario:32} {label:9} {_fmt(now)}")
        if scenario in before:
            print(f"{'':32} {baseline[:9]:9} {_fmt(summarize(before[scenario]))}")
        for stop, count in now["top_stops"]:
            print(f"{'':42} stopped: {stop} ×{count}")


# --- Checks: the aggregated path against the per-call one ---------------------------------------------------------


def agreement(scenarios: list[str], profile: str, rollouts: int, seed: int, workers: int) -> None:
    """Outcome shares of both paths on the same seeds, with the difference in standard errors (|z| < 2: within
    sampling noise)."""
    shares = {}
    for exact in (True, False):
        began = time.perf_counter()
        shares[exact] = run_all(scenarios, profile, rollouts, seed, workers, exact)
        print(f"{'exact' if exact else 'aggregated'}: {time.perf_counter() - began:.0f} s", flush=True)
    print(f"\n{'scenario':32} {'result':20} {'exact':>7} {'aggr.':>7} {'z':>6}")
    for scenario in scenarios:
        for result in RESULTS:
            a, b = (sum(o["result"] == result for o in shares[e][scenario]) for e in (True, False))
            if a or b:
                pooled = (a + b) / (2 * rollouts)
                se = math.sqrt(2 * pooled * (1 - pooled) / rollouts) or 1.0
                z = (b - a) / rollouts / se
                print(f"{scenario:32} {result:20} {a / rollouts:7.1%} {b / rollouts:7.1%} {z:6.2f}")
    print()
    print_table(shares[True], {s: shares[False][s] for s in scenarios}, "aggregated", "exact")


def check_tick(scenario: str, repeats: int, seed: int) -> None:
    """One 600 s tick of stage 3 traffic drawn both ways many times over one world: per (cohort, arm) and per-user
    sum, the mean and sd of its total across draws, and the mean over draws of its spread across users."""
    effect = SCENARIOS[scenario][0]
    rng = np.random.default_rng(seed)
    world = traffic.make_world(traffic.TrafficProfile(), rng)
    model, percent = traffic.user_model(world, effect), {"*": 95.0}
    assignment = traffic.assign(world, percent)
    stage = traffic.stage_traffic(model, assignment)
    stats: dict[str, dict] = {"exact": {}, "aggregated": {}}
    for _ in range(repeats):
        calls = traffic.generate(world, effect, rng, 0.0, 600.0, percent)
        tick = traffic.generate_sums(stage, rng, 0.0, 600.0, LOG_BOUNDS)
        for arm in (0, 1):
            for index, cohort in enumerate(world.profile.cohorts):
                key = (cohort, arm)
                part = _subset(calls, (calls.cohort == index) & (calls.arm == arm))
                _tally(stats["exact"], key, dense(_summarize(part), world.profile.users))
                users = slice(*assignment.blocks[arm][index : index + 2])
                sums = {k: v[users] for k, v in tick.sums[arm].items() if k != "slow"}
                sums["slow"] = tick.sums[arm]["slow"].full(len(LATENCY_BOUNDS_S))[:, users]
                _tally(stats["aggregated"], key, _window(assignment.users[arm][users], sums))
    _print_tick(stats, world)


def check_baseline(profile: str, seed: int, exact: bool) -> bool:
    """The pre-rollout baseline as the product reads it, a quarter hour into stage 1 of an A/A rollout: its keys and
    units, its totals against the traffic model's, and per user how its sums predict the stage's (what CUPED relies
    on); then the look's bands, with the share of each contract's variance the covariate removed. True if it holds."""
    run = start("aa", profile, seed, exact)
    step(run)  # opens stage 1
    while run.clock - run.opened < run.plan.stages[0].min_exposure_s[profile] / 2:
        _traffic(run, run.plan.stages[0].check_every_s[profile])
    seconds = getattr(run.plan, "baseline_s", {}).get(profile, 0.0)
    if run.before is None:
        print("the plan asks for no pre-rollout baseline (baseline_s is 0 or absent)")
        return False
    now = T0 + timedelta(seconds=run.clock)
    before = run.source.windows(T0 - timedelta(seconds=seconds), T0)
    stage = run.source.windows(T0 + timedelta(seconds=run.opened), now)
    ok = set(before) == {(c, STABLE) for c in run.shape.cohorts}
    print(f"keys {sorted(before)}: {'every cohort on stable' if ok else 'WRONG'}")
    units = {id(w.units) for w in (*before.values(), *stage.values())}
    same = all(np.array_equal(w.units, run.source.units) for w in (*before.values(), *stage.values()))
    print(f"units: {len(units)} array(s), {'the same users as the stage windows' if same else 'DIFFERENT'}")
    ok &= same
    calls, failed, nan = (sum(w.total(name) for w in before.values()) for name in ("calls", "failed", "nan"))
    expected = run.shape.rate_per_s * seconds
    print(
        f"calls {calls:,.0f} in {seconds:g} s (model: {expected:,.0f}); failed {failed:.0f} "
        f"(model: ~{expected * run.shape.failure_rate:.0f}); NaN {nan:.0f}"
    )
    ok &= abs(calls / expected - 1) < 0.05 and nan == 0
    print(f"{'cohort':11} {'users':>6} {'calls':>9}   per-user correlation with the stage (users, ≥ 5 calls in both)")
    for index, cohort in enumerate(run.shape.cohorts):
        pre = before[(cohort, STABLE)]
        outside = pre.calls[run.world.cohort[pre.units] != index].sum()
        ok &= outside == 0
        now_sums = [stage[key] for key in stage if key[0] == cohort]
        merged = now_sums[0]
        for w in now_sums[1:]:
            merged = merged.merged(w)
        r = {name: _correlation(pre, merged, name) for name in ("log_latency", "log_eta", "log_confidence")}
        correlations = "  ".join(f"{k} r={v:.2f}" for k, v in r.items())
        print(f"{cohort:11} {pre.users:6d} {pre.total('calls'):9.0f}   {correlations}")
        ok &= r["log_latency"] > 0.3 and r["log_eta"] > 0.8
    tripped = "guard" if run.guards.tripped_at is not None else None
    _, analysis = look(run.state, run.plan, profile, run.source, run.shape.cohorts, now, tripped=tripped)
    print("the look's bands (variance removed by the pre-rollout covariate):")
    for result in analysis.results:
        removed = result.band.get("variance_removed")
        print(f"  {result.cohort:11} {result.metric:22} {result.verdict!s:12} removed {removed if removed else 0:.0%}")
    print("baseline check:", "ok" if ok else "FAILED")
    return bool(ok)


def _correlation(before: CohortWindow, now: CohortWindow, name: str) -> float:
    """Across users with at least 5 calls in both windows: the correlation of their per-call (or per-answer) means."""
    per = "calls" if name == "log_latency" else "answers"
    a, b = getattr(before, per), getattr(now, per)
    users = (a >= 5) & (b >= 5)
    x, y = getattr(before, name)[users] / a[users], getattr(now, name)[users] / b[users]
    return float(np.corrcoef(x, y)[0, 1]) if users.sum() > 2 else math.nan


def _tally(into: dict, key: tuple, window: CohortWindow) -> None:
    bound = 11  # LATENCY_BOUNDS_S[11] ≈ 12.6 ms: the bound at stable's p99, where the tail contract looks
    active = window.calls > 0
    for name in (*traffic.SUMS, "slow@10ms"):
        values = window.slow[:, bound] if name == "slow@10ms" else getattr(window, name)
        into.setdefault((key, name), []).append((float(values.sum()), float(values[active].var())))


def _print_tick(stats: dict, world: traffic.World) -> None:
    head = f"{'total: exact':>22} {'aggregated':>22}   {'var/user: exact':>15} {'aggr.':>9}"
    print(f"{'cohort':11} {'arm':4} {'sum':15} {head}")
    for (key, name), exact in stats["exact"].items():
        agg = np.array(stats["aggregated"][(key, name)])
        ex = np.array(exact)
        if not ex[:, 0].any() and not agg[:, 0].any():
            continue
        cell = lambda a: f"{a[:, 0].mean():11.1f} ± {a[:, 0].std(ddof=1):8.1f}"  # noqa: E731
        print(
            f"{key[0]:11} {'cand' if key[1] else 'stab':4} {name:15} {cell(ex):>22} {cell(agg):>22}   "
            f"{ex[:, 1].mean():15.4g} {agg[:, 1].mean():9.4g}"
        )


# --- Entry point ---------------------------------------------------------------------------------------------------


def scenarios_of(name: str) -> list[str]:
    """The scenarios `--scenario` names."""
    return list(SCENARIOS) if name == "all" else [name]


def compare_units(scenarios: list[str], args: argparse.Namespace) -> None:
    """The same traffic (same seeds) judged on per-user windows and on windows summed into the gateway's analysis
    units (what the Prometheus source reads)."""
    global _BY_UNIT
    spent, results = {}, {}
    for by_unit_now in (False, True):
        _BY_UNIT = by_unit_now  # read by _open in the workers, which fork after this
        began = time.perf_counter()
        results[by_unit_now] = run_all(scenarios, args.profile, args.rollouts, args.seed, args.workers, args.exact)
        spent[by_unit_now] = time.perf_counter() - began
    print(
        f"\nverdicts at {args.profile} exposure ({'per-call' if args.exact else 'aggregated'} traffic), "
        f"{args.rollouts} rollouts per scenario on the same seeds: per user ({spent[False]:.0f} s) against the "
        f"Prometheus source's {ANALYSIS_UNITS} analysis units ({spent[True]:.0f} s)"
    )
    print_table(results[True], results[False], "per user", "by unit")


def main() -> None:
    """Run the scenarios and print the comparison table (or one of the checks)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=("production", "demo"), default="production")
    parser.add_argument("--scenario", default="all", help=f"one of {', '.join(SCENARIOS)}, or all")
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes (default: every CPU)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--exact", action="store_true", help="draw every call (slow) instead of per-user sums")
    parser.add_argument("--agreement", action="store_true", help="run both paths on the same seeds and compare")
    parser.add_argument("--check-tick", action="store_true", help="compare one tick's per-user sums of both paths")
    parser.add_argument("--repeats", type=int, default=200, help="ticks drawn each way by --check-tick")
    parser.add_argument("--check-baseline", action="store_true", help="the pre-rollout baseline windows, as read")
    parser.add_argument("--baseline", default="", help="a commit whose engine runs the same traffic (e.g. 9de3f55)")
    parser.add_argument(
        "--baseline-rollouts", type=int, help="rollouts per scenario for the baseline engine (default: --rollouts)"
    )
    parser.add_argument("--json", type=Path, help="also write every outcome here")
    parser.add_argument(
        "--by-unit",
        action="store_true",
        help="judge windows summed into the gateway's analysis units (the Prometheus source) beside per-user ones",
    )
    args = parser.parse_args()
    if args.by_unit:
        return compare_units(scenarios_of(args.scenario), args)
    scenarios = scenarios_of(args.scenario)
    if args.check_tick:
        return check_tick(scenarios[0], args.repeats, args.seed)
    if args.check_baseline:
        raise SystemExit(0 if check_baseline(args.profile, args.seed, args.exact) else 1)
    if args.agreement:
        return agreement(scenarios, args.profile, args.rollouts, args.seed, args.workers)
    began = time.perf_counter()
    current = run_all(scenarios, args.profile, args.rollouts, args.seed, args.workers, args.exact)
    spent = time.perf_counter() - began
    before, old = {}, f"baseline {args.baseline or 'not run'}"
    if args.baseline:
        rollouts = args.rollouts if args.baseline_rollouts is None else args.baseline_rollouts
        began = time.perf_counter()
        before = _baseline(args.baseline, scenarios, args.profile, rollouts, args.seed, args.workers)
        took = time.perf_counter() - began
        rate = rollouts * len(scenarios) / took
        old = f"baseline {args.baseline}: {rollouts} rollouts per scenario in {took:.0f} s wall ({rate:.2f}/s)"
    total = args.rollouts * len(scenarios)
    print(
        f"\nverdicts at {args.profile} exposure ({'per-call' if args.exact else 'aggregated'} traffic): "
        f"{args.rollouts} rollouts per scenario in {spent:.0f} s wall ({total / spent:.2f} rollouts/s, "
        f"{args.workers} workers); {old}"
    )
    print_table(current, before, args.baseline, "current")
    if args.json:
        args.json.write_text(json.dumps({"current": current, "baseline": before}, indent=1))


if __name__ == "__main__":
    main()
