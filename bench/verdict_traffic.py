"""Synthetic production gateway traffic for the rollout-verdict simulator: vectorised numpy, one call per tick.

Model: Poisson arrivals from heavy-tailed users with sticky cohorts and canary buckets, client repeats, replicas,
background failures (some in per-replica bursts) on every version alike, and a `CandidateEffect` that degrades
only the candidate; a failed candidate call is retried on stable, as the real gateway does.

    python bench/verdict_traffic.py   # self-check: prints the model's key numbers and the generation time
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field, fields
from statistics import NormalDist
from typing import Any

import numpy as np

OK, ERROR, TIMEOUT, NAN = 0, 1, 2, 3  # outcome codes (int8)
BUCKETS = 10_000  # canary buckets, as the gateway hashes user ids


@dataclass(frozen=True)
class TrafficProfile:
    """Parameters of production traffic, shared by stable and candidate (defaults mirror production)."""

    rate_per_s: float = 100.0
    users: int = 20_000
    activity_sigma: float = 1.6  # log-normal activity weights: the top 1 % of users make ~25 % of requests
    cohorts: tuple[str, ...] = ("high_value", "long_tail", "core")
    cohort_shares: tuple[float, ...] = (0.24, 0.18, 0.58)
    # long_tail is 0.79, not a nominal 0.70: with total sd ~0.094 (user 0.05, call 0.08) 0.70 would put ~14 % of
    # its answers below 0.6; 0.79 puts ~2 % there, which is what production shows.
    confidence_base: tuple[float, ...] = (0.85, 0.79, 0.80)
    user_confidence_sd: float = 0.05
    call_confidence_sd: float = 0.08
    base_latency_s: float = 0.004
    user_latency_sd: float = 0.3
    call_latency_sd: float = 0.35
    eta_hours: float = 20.0
    user_eta_sd: float = 0.4
    call_eta_sd: float = 0.1
    repeat_share: float = 0.10
    repeat_window_s: float = 60.0
    replicas: int = 3
    failure_rate: float = 1e-4
    burst_share: float = 0.2
    timeout_share: float = 0.2  # background failures: 80 % ERROR, 20 % TIMEOUT
    stable_timeout_s: float = 2.0
    candidate_timeout_s: float = 0.5

    def __post_init__(self) -> None:
        """Reject per-cohort tuples that do not line up, which would silently mis-assign cohorts."""
        if not len(self.cohorts) == len(self.cohort_shares) == len(self.confidence_base):
            raise ValueError("cohorts, cohort_shares and confidence_base must have equal lengths")
        if abs(sum(self.cohort_shares) - 1.0) > 1e-9 or not 1 <= self.replicas <= 127:
            raise ValueError("cohort_shares must sum to 1 and replicas must fit int8")


@dataclass(frozen=True)
class CandidateEffect:
    """How the candidate differs from stable; the defaults are an A/A candidate (no difference)."""

    extra_error_rate: float = 0.0
    fail_share: float = 0.0
    fail_kind: int = ERROR
    nan_share: float = 0.0
    nan_cohorts: tuple[str, ...] = ()  # empty = every cohort (likewise for the other cohort filters)
    latency_tail_share: float = 0.0
    latency_tail_factor: float = 1.0
    latency_factor: float = 1.0
    low_confidence_cohorts: tuple[str, ...] = ()
    low_confidence_share: float = 0.0
    eta_factor: float = 1.0
    eta_cohorts: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False)
class World:
    """Per-user state drawn once per simulated rollout: activity, cohort, canary bucket and answer offsets."""

    profile: TrafficProfile
    weight: np.ndarray  # activity share per user, sums to 1
    cdf: np.ndarray  # cumulative weight: users are sampled by searchsorted, far faster than rng.choice(p=...)
    cohort: np.ndarray  # int8 index into profile.cohorts
    bucket: np.ndarray  # canary bucket in [0, BUCKETS), fixed per user like a hash of the id
    latency_offset: np.ndarray  # log scale
    confidence_offset: np.ndarray
    eta_base: np.ndarray  # hours


@dataclass(frozen=True, eq=False)
class Calls:
    """Per-call arrays of one stretch of gateway traffic, equal lengths, sorted by time."""

    t: np.ndarray  # float64 seconds
    unit: np.ndarray  # int64 user index
    cohort: np.ndarray  # int8
    arm: np.ndarray  # int8: 0 stable-assigned, 1 candidate-assigned
    served: np.ndarray  # int8: 0 stable answered, 1 candidate answered
    retry: np.ndarray  # bool: stable's retry of a failed candidate call
    outcome: np.ndarray  # int8 OK/ERROR/TIMEOUT/NAN
    latency_s: np.ndarray  # float64
    eta: np.ndarray  # float64 hours, NaN where not OK
    confidence: np.ndarray  # float64, NaN where not OK
    key: np.ndarray  # int64 request identity (a repeat and a retry share their original's)
    replica: np.ndarray  # int8

    def __len__(self) -> int:
        """Number of calls."""
        return int(self.t.size)

    def concat(self, other: Calls) -> Calls:
        """These calls followed by `other`'s, re-sorted only when they overlap in time."""
        arrays = {f.name: np.concatenate([getattr(self, f.name), getattr(other, f.name)]) for f in fields(self)}
        # A tick's retries land up to a timeout past its end, so the next tick may start before them.
        if len(self) and len(other) and other.t[0] < self.t[-1]:
            order = np.argsort(arrays["t"], kind="stable")
            arrays = {name: a[order] for name, a in arrays.items()}
        return Calls(**arrays)


def make_world(profile: TrafficProfile, rng: np.random.Generator) -> World:
    """Draw the per-user arrays of one simulated production world."""
    p, n = profile, profile.users
    weight = rng.lognormal(0.0, p.activity_sigma, n)
    weight /= weight.sum()
    cdf = np.cumsum(weight)
    cdf[-1] = 1.0  # so a uniform draw in [0, 1) always lands on a user despite rounding
    cohort = rng.choice(len(p.cohorts), size=n, p=p.cohort_shares).astype(np.int8)
    bucket = rng.integers(0, BUCKETS, n).astype(np.int16)
    lat, conf, eta = (rng.normal(0.0, sd, n) for sd in (p.user_latency_sd, p.user_confidence_sd, p.user_eta_sd))
    return World(p, weight, cdf, cohort, bucket, lat, conf, p.eta_hours * np.exp(eta))


def _in_cohorts(world: World, names: tuple[str, ...], cohort: np.ndarray) -> np.ndarray:
    """Mask of calls whose cohort is in `names` (empty = all); unknown names are an error, not a silent no-op."""
    if not names:
        return np.ones(cohort.size, bool)
    return np.isin(cohort, [world.profile.cohorts.index(name) for name in names])


def _thresholds(profile: TrafficProfile, candidate_percent: dict[str, float]) -> np.ndarray:
    """Per-cohort bucket threshold: a user is on the candidate when its bucket is below it (sticky per user)."""
    unknown = set(candidate_percent) - set(profile.cohorts) - {"*"}
    if unknown:
        raise ValueError(f"unknown cohorts in candidate_percent: {sorted(unknown)}")
    default = candidate_percent.get("*", 0.0)
    percent = np.array([candidate_percent.get(c, default) for c in profile.cohorts], float)
    if ((percent < 0) | (percent > 100)).any():
        raise ValueError("candidate percent must be within 0..100")
    return np.round(percent * (BUCKETS / 100)).astype(np.int32)


def _requests(world: World, rng: np.random.Generator, t0: float, t1: float) -> tuple:
    """Calls of base requests and repeats in time order: (t, unit, src, base_unit); src = the base request."""
    p, dt = world.profile, t1 - t0
    n_base = int(rng.poisson(p.rate_per_s * dt * (1 - p.repeat_share)))
    t = t0 + dt * rng.random(n_base)
    # Sorted draws make searchsorted cache-friendly (4x faster); harmless, as `t` is unsorted and independent.
    base_unit = np.minimum(np.searchsorted(world.cdf, np.sort(rng.random(n_base)), side="right"), p.users - 1)
    # Repeats past t1 are dropped (the next tick does not know this tick's requests), so draw more to keep the
    # expected repeat rate at repeat_share: the dropped fraction of U(0, dt) + U(0, W) past dt is below.
    w = p.repeat_window_s
    kept = 1 - (w / (2 * dt) if dt >= w else 1 - dt / (2 * w))
    n_rep = int(rng.poisson(p.rate_per_s * dt * p.repeat_share / kept)) if n_base else 0
    orig = rng.integers(0, max(n_base, 1), n_rep)
    t_rep = t[orig] + w * rng.random(n_rep)
    t, src = np.concatenate([t, t_rep[t_rep < t1]]), np.concatenate([np.arange(n_base), orig[t_rep < t1]])
    order = np.argsort(t)  # sorting once here keeps every later per-call array in time order, with no re-sort
    return t[order], base_unit[src[order]], src[order], base_unit


def _answers(world: World, effect: CandidateEffect, rng: np.random.Generator, unit: np.ndarray) -> tuple:
    """Stable's and the candidate's answer per base request: (conf_s, eta_s, conf_c, eta_c, nan_c)."""
    # Drawn per request, not per call, so a repeat gets the same answer from the same version, as in production.
    p, n = world.profile, unit.size
    cohort = world.cohort[unit]
    noise = rng.normal(0.0, p.call_confidence_sd, n)
    conf_s = np.clip(np.asarray(p.confidence_base)[cohort] + world.confidence_offset[unit] + noise, 0.01, 0.999)
    eta_s = world.eta_base[unit] * np.exp(rng.normal(0.0, p.call_eta_sd, n))
    conf_c, eta_c, nan_c = conf_s, eta_s, np.zeros(n, bool)
    if effect.low_confidence_share > 0:
        low = _in_cohorts(world, effect.low_confidence_cohorts, cohort) & (rng.random(n) < effect.low_confidence_share)
        conf_c = np.where(low, rng.uniform(0.3, 0.59, n), conf_s)
    if effect.eta_factor != 1.0:
        eta_c = np.where(_in_cohorts(world, effect.eta_cohorts, cohort), eta_s * effect.eta_factor, eta_s)
    if effect.nan_share > 0:
        nan_c = _in_cohorts(world, effect.nan_cohorts, cohort) & (rng.random(n) < effect.nan_share)
    return conf_s, eta_s, conf_c, eta_c, nan_c


def _latency(world: World, rng: np.random.Generator, unit: np.ndarray) -> np.ndarray:
    """Fresh latency per call: base x exp(user offset + call noise)."""
    p = world.profile
    return p.base_latency_s * np.exp(world.latency_offset[unit] + rng.normal(0.0, p.call_latency_sd, unit.size))


def _background(p: TrafficProfile, rng: np.random.Generator, replica: np.ndarray) -> np.ndarray:
    """Outcomes of one version's calls (in time order) under background failures: independent ones and bursts."""
    n = replica.size
    out = np.zeros(n, np.int8)
    u = rng.random(n)  # one draw decides both: independent failure below a, burst start in [a, a + b)
    a, b = p.failure_rate * (1 - p.burst_share), p.failure_rate * p.burst_share / 4  # bursts average 4 calls
    indep = np.flatnonzero(u < a)
    out[indep] = np.where(rng.random(indep.size) < p.timeout_share, TIMEOUT, ERROR)
    starts = np.flatnonzero((u >= a) & (u < a + b))
    if starts.size:  # rare, so the sort by (replica, time) is only paid when a burst happens
        order = np.argsort(replica, kind="stable")  # by replica, then time: callers pass calls in time order
        pos = np.empty(n, np.intp)
        pos[order] = np.arange(n)
        length = rng.integers(3, 6, starts.size)  # the starting call and the next 2-4 on its replica
        step = np.arange(length.sum()) - np.repeat(np.cumsum(length) - length, length)
        at = np.repeat(pos[starts], length) + step
        kind = np.repeat(np.where(rng.random(starts.size) < p.timeout_share, TIMEOUT, ERROR), length)
        inside = at < n
        at, kind, rep = at[inside], kind[inside], np.repeat(replica[starts], length)[inside]
        same = replica[order[at]] == rep  # a burst stops at the end of its replica's calls in this tick
        out[order[at[same]]] = kind[same]
    return out


def _serve(p: TrafficProfile, rng: np.random.Generator, col: dict, idx: np.ndarray, timeout_s: float) -> None:
    """Outcomes of one version's calls `idx`: its own (in col) unless background failures, then timeouts."""
    replica, latency = col["replica"][idx], col["latency_s"][idx]
    out = _background(p, rng, replica)
    out = np.where(out != OK, out, col["outcome"][idx]).astype(np.int8)
    out[latency > timeout_s] = TIMEOUT  # the gateway gives up at the timeout, whatever the call would have done
    col["outcome"][idx], col["latency_s"][idx] = out, np.where(out == TIMEOUT, timeout_s, latency)


def _candidate(effect: CandidateEffect, rng: np.random.Generator, col: dict, idx: np.ndarray, nan: np.ndarray) -> None:
    """The effect's own failures and latencies on candidate-served calls `idx`, written into col."""
    n = idx.size
    latency = col["latency_s"][idx] * effect.latency_factor
    tail = rng.random(n) < effect.latency_tail_share
    col["latency_s"][idx] = np.where(tail, latency * effect.latency_tail_factor, latency)
    own = np.where(nan, NAN, OK).astype(np.int8)
    own[rng.random(n) < effect.fail_share] = effect.fail_kind
    own[rng.random(n) < effect.extra_error_rate] = ERROR
    col["outcome"][idx] = own


def generate(
    world: World,
    effect: CandidateEffect,
    rng: np.random.Generator,
    t0: float,
    t1: float,
    candidate_percent: dict[str, float],
    candidate_retry: bool = True,
) -> Calls:
    """All gateway calls (first attempts and stable retries) of requests arriving in [t0, t1), sorted by time."""
    p = world.profile
    t, unit, src, base_unit = _requests(world, rng, t0, t1)
    conf_s, eta_s, conf_c, eta_c, nan_c = _answers(world, effect, rng, base_unit)
    key = rng.integers(0, np.iinfo(np.int64).max, base_unit.size, dtype=np.int64)
    cohort = world.cohort[unit]
    arm = (world.bucket[unit] < _thresholds(p, candidate_percent)[cohort]).astype(np.int8)
    n = t.size
    col = dict(t=t, unit=unit.astype(np.int64), cohort=cohort, arm=arm, served=arm.copy(), retry=np.zeros(n, bool))
    col.update(outcome=np.zeros(n, np.int8), latency_s=_latency(world, rng, unit), key=key[src], src=src)
    col["replica"] = rng.integers(0, p.replicas, n).astype(np.int8)
    c = np.flatnonzero(arm == 1)
    _candidate(effect, rng, col, c, nan_c[src[c]])
    _serve(p, rng, col, c, p.candidate_timeout_s)
    # The gateway retries a failed candidate call on stable at once: same request, stable's own outcome.
    r = c[col["outcome"][c] != OK] if candidate_retry else c[:0]
    if r.size:
        t_r = t[r] + col["latency_s"][r]
        r, t_r = r[np.argsort(t_r)], np.sort(t_r)
        again = {name: a[r] for name, a in col.items()}
        again.update(t=t_r, served=np.zeros(r.size, np.int8), retry=np.ones(r.size, bool))
        again.update(outcome=np.zeros(r.size, np.int8), latency_s=_latency(world, rng, unit[r]))
        at = np.searchsorted(t, t_r, side="right")  # few retries: inserting them beats a full re-sort
        col = {name: np.insert(a, at, again[name]) for name, a in col.items()}
    _serve(p, rng, col, np.flatnonzero(col["served"] == 0), p.stable_timeout_s)
    ok, on_c, src = col["outcome"] == OK, col["served"] == 1, col.pop("src")
    col["confidence"] = np.where(ok, np.where(on_c, conf_c[src], conf_s[src]), np.nan)
    col["eta"] = np.where(ok, np.where(on_c, eta_c[src], eta_s[src]), np.nan)
    return Calls(**col)


def p99_regression(profile: TrafficProfile | None = None, ratio: float = 1.5, share: float = 0.01) -> CandidateEffect:
    """A candidate whose p99 latency is `ratio` x stable's while its mean log latency moves by < 3 %."""
    # Log latency is N(mu, s^2); slowing `share` of calls by F moves the mean log by only share x ln F, so pick the
    # F whose mixture puts exactly 1 % of calls above stable's p99 x ratio. A share of 1 % about minimises
    # share x ln F (~0.022 for the defaults): a smaller share needs a far larger F, a larger one moves the body.
    p, norm = profile or TrafficProfile(), NormalDist()
    s = math.hypot(p.user_latency_sd, p.call_latency_sd)
    target = norm.inv_cdf(0.99) * s + math.log(ratio)  # the new p99, as an offset from mu
    # (1 - share) * Phi(target / s) + share * Phi((target - ln F) / s) = 0.99, solved for ln F:
    log_f = target - s * norm.inv_cdf((0.99 - (1 - share) * norm.cdf(target / s)) / share)
    return CandidateEffect(latency_tail_share=share, latency_tail_factor=math.exp(log_f))


# --- Aggregated traffic: a tick as per-user sums, failures as timed events ----------------------------------------
# `generate` draws every call (~60,000 rows per 10-minute tick), and the simulator then sums them per user: that was
# most of a simulated rollout's time. `generate_sums` draws the same traffic's per-user sums directly. What stays per
# call is one normal draw of each call's latency (cheaper than a multinomial over 41 latency bounds per user, and the
# per-user sum of log latency and the counts above every bound then come from the very same draws, as they do from
# calls). Requests are Poisson per user and repeats copy random requests of the tick, as `_requests` draws them;
# failures are sparse events with a time and a replica (the fast guard and the outage timeline take them one by one);
# successes are only counts per (arm, replica, second); the answers' sums come from per-user moments (a binomial count
# below LOW_CONFIDENCE, normal sums of log confidence and log ETA).

STABLE_ARM, CANDIDATE_ARM = 0, 1
LOW_CONFIDENCE = 0.6  # mlrelease.rollout.windows.LOW_CONFIDENCE (no mlrelease import here: the baseline runs this)
SUMS = ("calls", "failed", "nan", "log_latency", "answers", "low_confidence", "log_eta", "log_confidence")
NO_TIME = np.nan  # an event whose time is drawn once the outcome that wins its call is known


@dataclass(frozen=True, eq=False)
class Assignment:
    """Each arm's users under one stage's candidate percentages, cohort by cohort: the layout of per-user arrays."""

    users: tuple[np.ndarray, ...]  # per arm (stable, candidate): user ids, grouped by cohort, ascending within
    blocks: tuple[np.ndarray, ...]  # per arm: where each cohort's users start (len(cohorts) + 1 offsets)


@dataclass(frozen=True, eq=False)
class UserModel:
    """Per-user parameters of each version's calls and answers (index 0 stable, 1 candidate), for one world and
    one candidate effect."""

    world: World
    effect: CandidateEffect
    log_latency: tuple[np.ndarray, ...]  # mean log latency of a call
    low: tuple[np.ndarray, ...]  # P(an answer's confidence < LOW_CONFIDENCE)
    low_log: tuple[tuple[np.ndarray, np.ndarray], ...]  # mean and variance of log confidence of such an answer
    high_log: tuple[tuple[np.ndarray, np.ndarray], ...]  # … and of the other answers
    log_eta: tuple[np.ndarray, ...]  # mean log ETA (its per-answer sd is the profile's call_eta_sd)
    nan_share: np.ndarray  # the candidate's share of NaN answers (per request, so its repeats are NaN too)


@dataclass(frozen=True, eq=False)
class ArmModel:
    """One arm's users under a stage's assignment and their parameters under the arm's version (gathered once)."""

    arm: int
    users: np.ndarray
    requests_per_s: np.ndarray  # new requests (not repeats) per second
    log_latency: np.ndarray  # float32: mean log latency of a call
    answers: np.ndarray  # (6, users): P(low), mean and variance of log confidence low / other, mean log ETA
    nan_share: np.ndarray
    _tables: dict = field(default_factory=dict, repr=False)  # per tick length: its `_PoissonTable`

    def requests(self, rng: np.random.Generator, dt: float) -> np.ndarray:
        """Each user's requests in a tick of `dt` seconds (Poisson)."""
        table = self._tables.get(dt)
        if table is None:
            table = self._tables[dt] = _PoissonTable(self.requests_per_s * dt)
        return table.draw(rng)


@dataclass(frozen=True, eq=False)
class StageTraffic:
    """What `generate_sums` draws from: the user model, and each arm of one stage's assignment."""

    model: UserModel
    assignment: Assignment
    arms: tuple[ArmModel, ...]


@dataclass(frozen=True, eq=False)
class Failures:
    """First-call failures of a tick, oldest first: when, on which replica, whose arm, what outcome, which call."""

    t: np.ndarray
    replica: np.ndarray
    arm: np.ndarray
    outcome: np.ndarray
    call: np.ndarray  # index into the arm's calls of the tick


@dataclass(eq=False)
class _ArmCalls:
    """One arm's first calls of a tick laid out user by user (calls carry no time: only failures get one)."""

    model: ArmModel
    requests: np.ndarray  # per user: requests (a client repeat is a call, not a request)
    calls: np.ndarray  # per user: requests + repeats
    first: np.ndarray  # per user: index of its first call (its requests come first, then its repeats)
    user: np.ndarray  # per call: index into the arm's users
    repeated: np.ndarray  # per repeat (in call order): the index of the request it repeats, among the tick's requests
    log_latency: np.ndarray  # per call, float32 (a timeout's is the timeout's)

    def sources(self) -> np.ndarray:
        """Per repeat in call order: the call of the request it repeats (only NaN answers need them)."""
        ends = np.cumsum(self.requests)
        owner = np.searchsorted(ends, self.repeated, side="right")
        return self.first[owner] + self.repeated - (ends - self.requests)[owner]

    def repeat(self, call: np.ndarray) -> np.ndarray:
        """Whether each call is a client repeat (a user's requests come first, then their repeats)."""
        user = self.user[call]
        return call - self.first[user] >= self.requests[user]

    def all_repeats(self) -> np.ndarray:
        """Every call's repeat flag (only cutting pieces needs them all)."""
        return self.repeat(np.arange(len(self.user)))


@dataclass(eq=False)
class _Events:
    """Failures of one arm before the outcome that wins each call is chosen (the lowest priority wins)."""

    call: np.ndarray
    outcome: np.ndarray
    priority: np.ndarray
    t: np.ndarray
    replica: np.ndarray

    @classmethod
    def of(cls, call: np.ndarray, outcome: Any, priority: int, t: Any = NO_TIME, replica: Any = -1) -> _Events:
        """Events of one kind; scalars are broadcast."""
        n = len(call)
        as_array = lambda v, dtype: np.full(n, v, dtype) if np.ndim(v) == 0 else np.asarray(v, dtype)  # noqa: E731
        return cls(
            np.asarray(call, np.int64),
            as_array(outcome, np.int8),
            np.full(n, priority, np.int8),
            as_array(t, np.float64),
            as_array(replica, np.int8),
        )

    @classmethod
    def join(cls, parts: list[_Events]) -> _Events:
        """One failure per call: where several hit the same call, the lowest priority wins."""
        parts = [e for e in parts if len(e.call)] or parts[:1]
        joined = [np.concatenate([getattr(e, f.name) for e in parts]) for f in fields(cls)]
        call, priority = joined[0], joined[2]
        order = np.lexsort((priority, call))
        keep = order[np.r_[True, call[order][1:] != call[order][:-1]]] if len(call) else order
        return cls(*(a[keep] for a in joined))


@dataclass(frozen=True)
class _Span:
    """Arrival times within one tick: requests uniform; a client repeat up to `window` s after its request, so
    repeats ramp up over the tick's first window (a repeat past the tick's end is never drawn)."""

    t0: float
    dt: float
    window: float

    @property
    def seconds(self) -> int:
        """Seconds the tick covers (the last one may be partial)."""
        return int(math.ceil(self.dt - 1e-9))

    def ramp(self, x: Any) -> np.ndarray:
        """∫₀ˣ min(s, window) ds: the repeats' cumulative density, unnormalised."""
        w, x = self.window, np.asarray(x, np.float64)
        return np.where(x <= w, x * x / 2, w * w / 2 + w * (x - w))

    def times(self, rng: np.random.Generator, repeat: np.ndarray) -> np.ndarray:
        """A time for each call (True: a repeat), by inverting the densities."""
        u, w = rng.random(len(repeat)), self.window
        y = u * float(self.ramp(self.dt))
        late = np.sqrt(2 * y), w + (y - w * w / 2) / w
        return self.t0 + np.where(repeat, np.where(y <= w * w / 2, *late), u * self.dt)

    def shares(self, a: float, b: float) -> tuple[float, float]:
        """The share of requests and of repeats that arrive within [t0 + a, t0 + b)."""
        a, b = max(a, 0.0), min(b, self.dt)
        return (b - a) / self.dt, float(self.ramp(b) - self.ramp(a)) / float(self.ramp(self.dt))

    def per_second(self) -> tuple[np.ndarray, np.ndarray]:
        """Each second's share of requests and of repeats (the same for every tick of a stage: cached)."""
        return _per_second(_Span(0.0, self.dt, self.window))

    def rescue(self, p: TrafficProfile) -> float:
        """The chance that a request has at least one repeat in the tick (a failed request answered by it)."""
        return _rescue(self.dt, p.repeat_window_s, p.repeat_share)


@functools.lru_cache(maxsize=16)
def _per_second(span: _Span) -> tuple[np.ndarray, np.ndarray]:
    edges = np.minimum(np.arange(span.seconds + 1), span.dt)
    repeats = np.diff(span.ramp(edges))
    return np.diff(edges) / span.dt, repeats / repeats.sum()


@functools.lru_cache(maxsize=16)
def _rescue(dt: float, window: float, share: float) -> float:
    kept = 1 - (window / (2 * dt) if dt >= window else 1 - dt / (2 * window))  # as `_requests` draws repeats
    per_request = share / (1 - share) / kept
    t = (np.arange(1000) + 0.5) / 1000 * dt
    return float(np.mean(1 - np.exp(-per_request * np.minimum(1.0, (dt - t) / window))))


@dataclass(frozen=True, eq=False)
class Tick:
    """One tick of traffic as per-user sums per arm (Assignment layout), failures and per-second successes."""

    t0: float
    t1: float
    sums: tuple[dict[str, Any], ...]  # per arm: SUMS (arrays over the arm's users), and 'slow' (SlowCounts)
    ok: np.ndarray  # successful first calls per (arm, replica, second of the tick)
    failures: Failures
    retry_t: np.ndarray  # stable's retries of failed candidate calls (calls, not requests)
    span: _Span
    _arms: tuple[Any, ...] = ()  # what `pieces` cuts from: per arm (calls, events, answer totals)

    def pieces(
        self, spans: list[tuple[float, float]], rng: np.random.Generator, log_bounds: np.ndarray
    ) -> list[tuple[dict[str, np.ndarray], ...]]:
        """Per arm, the per-user sums of the calls within each span [a, b) of absolute time: cut from this tick's
        calls (each call lands in a span with its arrival density), so each piece is part of the tick's sums."""
        cut = [_cut_arm(arm, spans, self.span, rng, log_bounds) for arm in self._arms]
        return [tuple(arm[j] for arm in cut) for j in range(len(spans))]


def assign(world: World, candidate_percent: dict[str, float]) -> Assignment:
    """Split the users into arms by their sticky bucket, as `generate` does per call."""
    on = world.bucket < _thresholds(world.profile, candidate_percent)[world.cohort]
    users, blocks = [], []
    for arm in (False, True):
        ids = np.flatnonzero(on == arm)
        ids = ids[np.argsort(world.cohort[ids], kind="stable")]
        users.append(ids)
        blocks.append(np.searchsorted(world.cohort[ids], np.arange(len(world.profile.cohorts) + 1)))
    return Assignment(tuple(users), tuple(blocks))


def user_model(world: World, effect: CandidateEffect) -> UserModel:
    """Per-user parameters of both versions (the effect only moves the candidate's)."""
    p, cohort = world.profile, world.cohort
    mean_conf = np.asarray(p.confidence_base)[cohort] + world.confidence_offset
    low, low_m, low_v, high_m, high_v = _confidence_moments(mean_conf, p.call_confidence_sd)
    share = effect.low_confidence_share * _in_cohorts(world, effect.low_confidence_cohorts, cohort)
    c_low, c_low_m, c_low_v = _uniform_low(low, low_m, low_v, share)
    latency = math.log(p.base_latency_s) + world.latency_offset
    eta = np.log(world.eta_base)
    eta_c = eta + math.log(effect.eta_factor) * _in_cohorts(world, effect.eta_cohorts, cohort)
    return UserModel(
        world,
        effect,
        log_latency=(latency, latency + math.log(effect.latency_factor)),
        low=(low, c_low),
        low_log=((low_m, low_v), (c_low_m, c_low_v)),
        high_log=((high_m, high_v), (high_m, high_v)),
        log_eta=(eta, eta_c),
        nan_share=effect.nan_share * _in_cohorts(world, effect.nan_cohorts, cohort),
    )


def stage_traffic(model: UserModel, assignment: Assignment) -> StageTraffic:
    """The arms of one stage's assignment with their users' parameters, for every tick of the stage."""
    p, arms = model.world.profile, []
    for arm, users in enumerate(assignment.users):
        arms.append(
            ArmModel(
                arm,
                users,
                requests_per_s=p.rate_per_s * (1 - p.repeat_share) * model.world.weight[users],
                log_latency=model.log_latency[arm][users].astype(np.float32),
                answers=np.stack([model.low[arm], *model.low_log[arm], *model.high_log[arm], model.log_eta[arm]])[
                    :, users
                ],
                nan_share=model.nan_share[users] if arm == CANDIDATE_ARM else np.zeros(len(users)),
            )
        )
    return StageTraffic(model, assignment, tuple(arms))


def _confidence_moments(mean: np.ndarray, sd: float) -> tuple[np.ndarray, ...]:
    """Per user (mean confidence `mean`, per-answer noise `sd`, clipped as `_answers` clips): P(low) and the mean
    and variance of log confidence of low and of other answers, integrated on a grid of means and interpolated."""
    grid = np.linspace(mean.min() - 1e-6, mean.max() + 1e-6, 256)
    z = np.linspace(-8.0, 8.0, 1601)
    w = np.exp(-z * z / 2)
    w /= w.sum()
    conf = np.clip(grid[:, None] + sd * z, 0.01, 0.999)
    log_c, low = np.log(conf), conf < LOW_CONFIDENCE
    out = []
    for part in (low, ~low):
        mass = (w * part).sum(axis=1)
        m1 = np.where(mass > 1e-12, (w * part * log_c).sum(axis=1) / np.maximum(mass, 1e-300), math.log(0.6))
        m2 = np.where(mass > 1e-12, (w * part * log_c**2).sum(axis=1) / np.maximum(mass, 1e-300), m1**2)
        out.append((mass, m1, np.maximum(m2 - m1**2, 0.0)))
    (low_mass, low_m, low_v), (_, high_m, high_v) = out
    return tuple(np.interp(mean, grid, a) for a in (low_mass, low_m, low_v, high_m, high_v))


def _uniform_low(
    low: np.ndarray, mean: np.ndarray, var: np.ndarray, share: np.ndarray, a: float = 0.3, b: float = 0.59
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The candidate's low answers when a `share` of its answers gets a U(a, b) confidence (as `_answers` draws)."""
    f1 = lambda u: u * math.log(u) - u  # noqa: E731  (∫ ln u du)
    f2 = lambda u: u * (math.log(u) ** 2 - 2 * math.log(u) + 2)  # noqa: E731  (∫ ln² u du)
    u1, u2 = (f1(b) - f1(a)) / (b - a), (f2(b) - f2(a)) / (b - a)
    mass, kept = share + (1 - share) * low, (1 - share) * low
    safe = np.maximum(mass, 1e-300)
    m1 = np.where(mass > 0, (share * u1 + kept * mean) / safe, mean)
    m2 = np.where(mass > 0, (share * u2 + kept * (var + mean**2)) / safe, var + mean**2)
    return mass, m1, np.maximum(m2 - m1**2, 0.0)


class _PoissonTable:
    """Poisson draws at fixed means (a stage's users in a tick), exact by inversion: for the users of small mean
    (most of them) one uniform each, compared with their first `rows` cumulative probabilities, computed once; a
    draw beyond them (below 1e-4 per user) continues the inversion one term at a time; numpy's sampler for the
    rest. Half the time of numpy's per-mean sampler on 20,000 users."""

    def __init__(self, mean: np.ndarray, small: float = 2.0, rows: int = 10) -> None:
        self.mean, self.rows = mean, rows
        self.small, self.large = np.flatnonzero(mean < small), np.flatnonzero(mean >= small)
        lam = mean[self.small]
        k = np.arange(rows)
        log_lam = np.log(np.where(lam > 0, lam, 1.0))
        pmf = np.exp(-lam[:, None] + k * log_lam[:, None] - np.array([math.lgamma(i + 1.0) for i in k]))
        pmf[lam == 0, 1:] = 0.0  # a user of mean 0 never requests
        self.pmf_last = pmf[:, -1]
        self.cdf = np.ascontiguousarray(np.cumsum(pmf, axis=1).T)  # (rows, users): a row compare is contiguous

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        """One draw per user."""
        out = np.empty(len(self.mean), np.int64)
        u = rng.random(len(self.small))
        k = np.zeros(len(self.small), np.int64)
        for row in self.cdf:  # X = min{j: u < F(j)} = how many of F(0) … F(rows-1) are ≤ u, while X < rows
            k += u >= row
        for i in np.flatnonzero(k == self.rows).tolist():
            k[i] = self._beyond(float(u[i]), i)
        out[self.small] = k
        out[self.large] = rng.poisson(self.mean[self.large])
        return out

    def _beyond(self, u: float, i: int) -> int:
        lam, j = float(self.mean[self.small[i]]), self.rows - 1
        pmf, cdf = float(self.pmf_last[i]), float(self.cdf[-1, i])
        while u >= cdf and pmf > 0:
            j += 1
            pmf *= lam / j
            cdf += pmf
        return j if u < cdf else j + 1  # (cdf short of 1 by rounding: a tail below 1e-16 ends here)


def _sample(rng: np.random.Generator, n: int, p: float) -> np.ndarray:
    """Indices of the n trials that succeed, each with chance p (a sparse draw when p is small)."""
    if n == 0 or p <= 0:
        return np.zeros(0, np.int64)
    if p >= 0.05:
        return np.flatnonzero(rng.random(n) < p)
    return np.sort(rng.choice(n, size=int(rng.binomial(n, p)), replace=False, shuffle=False)).astype(np.int64)


def _arm_calls(stage: StageTraffic, arm: int, rng: np.random.Generator, dt: float) -> _ArmCalls:
    """Each user's requests (Poisson), client repeats of random requests of the tick (as `_requests` draws them),
    and every call's log latency."""
    p, e, model = stage.model.world.profile, stage.model.effect, stage.arms[arm]
    requests = model.requests(rng, dt)
    ends = np.cumsum(requests)
    total = int(ends[-1]) if len(ends) else 0
    repeated = rng.integers(0, max(total, 1), rng.poisson(total * p.repeat_share / (1 - p.repeat_share)))
    repeated.sort()  # sorted, the search below is 2.5 times faster (and a user's repeats follow their requests)
    calls = requests + np.bincount(np.searchsorted(ends, repeated, side="right"), minlength=len(requests))
    first = np.cumsum(calls) - calls
    user = np.repeat(np.arange(len(calls)), calls)
    noise = rng.standard_normal(len(user), dtype=np.float32)
    log_latency = model.log_latency[user] + np.float32(p.call_latency_sd) * noise
    if arm == CANDIDATE_ARM and e.latency_tail_share > 0:
        tail = rng.random(len(user)) < e.latency_tail_share
        log_latency[tail] += np.float32(math.log(e.latency_tail_factor))
    return _ArmCalls(model, requests, calls, first, user, repeated, log_latency)


def _served_failures(
    p: TrafficProfile, rng: np.random.Generator, span: _Span, calls: _ArmCalls, retry: tuple[np.ndarray, np.ndarray]
) -> list[_Events]:
    """A version's background failures on its served calls (the arm's first calls, then stable's retries):
    independent ones, and bursts over the next calls on the same replica (as `_background` draws them per call)."""
    first, served = len(calls.user), len(calls.user) + len(retry[0])
    a, b = p.failure_rate * (1 - p.burst_share), p.failure_rate * p.burst_share / 4  # bursts average 4 calls
    alone = _sample(rng, served, a)
    alone = alone[alone < first]  # a retry's outcome is no request's
    kind = np.where(rng.random(len(alone)) < p.timeout_share, TIMEOUT, ERROR)
    starts = _sample(rng, served, b)
    return [_Events.of(alone, kind, 1), _bursts(p, rng, span, calls, retry, starts, served)]


def _bursts(
    p: TrafficProfile,
    rng: np.random.Generator,
    span: _Span,
    calls: _ArmCalls,
    retry: tuple[np.ndarray, np.ndarray],
    starts: np.ndarray,
    served: int,
) -> _Events:
    """Each burst: its starting call and the next 2-4 calls of the version on its replica, up to the tick's end
    (those calls are random calls of the version: calls do not depend on their time)."""
    first = len(calls.user)
    if not len(starts):
        return _Events.of(np.zeros(0, np.int64), ERROR, 1)
    on_retry = starts >= first
    t = np.zeros(len(starts))
    replica = rng.integers(0, p.replicas, len(starts)).astype(np.int8)
    t[~on_retry] = span.times(rng, calls.repeat(starts[~on_retry]))
    t[on_retry] = retry[0][starts[on_retry] - first]
    replica[on_retry] = retry[1][starts[on_retry] - first]
    length = rng.integers(3, 6, len(starts))
    owner = np.repeat(np.arange(len(starts)), length)
    begins = np.cumsum(length) - length
    nth = np.arange(len(owner)) - begins[owner]
    # the next call of the version on that replica: exponential gaps at the version's rate on one replica
    gap = np.where(nth == 0, 0.0, rng.exponential(span.dt * p.replicas / max(served, 1), len(owner)))
    total = np.cumsum(gap)
    at = t[owner] + total - total[begins[owner]]
    call = np.where(nth == 0, starts[owner], rng.integers(0, served, len(owner)))
    kind = np.repeat(np.where(rng.random(len(starts)) < p.timeout_share, TIMEOUT, ERROR), length)
    keep = (call < first) & (at < span.t0 + span.dt)
    return _Events.of(call[keep], kind[keep], 1, at[keep], replica[owner][keep])


def _own(
    stage: StageTraffic, rng: np.random.Generator, span: _Span, calls: _ArmCalls
) -> tuple[list[_Events], np.ndarray]:
    """The candidate's own failures (`CandidateEffect`), and the requests it answers NaN (each with its repeats)."""
    e, n = stage.model.effect, len(calls.user)
    parts = [_Events.of(_sample(rng, n, e.extra_error_rate), ERROR, 2)]
    parts.append(_Events.of(_sample(rng, n, e.fail_share), e.fail_kind, 3))
    nan_requests = np.zeros(0, np.int64)
    if e.nan_share > 0:
        events, nan_requests = _nan_requests(rng, span, calls)
        parts.append(events)
    return parts, nan_requests


def _nan_requests(rng: np.random.Generator, span: _Span, calls: _ArmCalls) -> tuple[_Events, np.ndarray]:
    """NaN answers per request: the request's first call and every repeat of it (same request, same answer)."""
    repeats = calls.all_repeats()
    requests = np.flatnonzero(~repeats)
    nan = requests[rng.random(len(requests)) < calls.model.nan_share[calls.user[requests]]]
    if not len(nan):
        return _Events.of(nan, NAN, 4), nan
    t = span.times(rng, np.zeros(len(nan), bool))
    sources = calls.sources()
    hit = np.isin(sources, nan)
    base_t = t[np.searchsorted(nan, sources[hit])]
    end = span.t0 + span.dt
    repeat_t = base_t + np.minimum(span.window, end - base_t) * rng.random(len(base_t))
    events = _Events.of(np.concatenate([nan, np.flatnonzero(repeats)[hit]]), NAN, 4, np.r_[t, repeat_t])
    return events, nan


def _timeouts(calls: _ArmCalls, timeout_s: float) -> _Events:
    """Calls slower than the gateway's timeout for that version: a timeout, whatever else happened."""
    return _Events.of(np.flatnonzero(calls.log_latency > np.float32(math.log(timeout_s))), TIMEOUT, 0)


def _placed(rng: np.random.Generator, span: _Span, calls: _ArmCalls, events: _Events, replicas: int) -> _Events:
    """Events with a time and a replica each (drawn where the winning outcome did not bring its own)."""
    free = np.isnan(events.t)
    events.t[free] = span.times(rng, calls.repeat(events.call[free]))
    free = events.replica < 0
    events.replica[free] = rng.integers(0, replicas, int(free.sum()))
    return events


def _successes(rng: np.random.Generator, span: _Span, calls: _ArmCalls, events: _Events, replicas: int) -> np.ndarray:
    """The arm's successful first calls per (replica, second): Poisson at the arm's rate in that second (requests
    and repeats with their own densities, less the tick's failures). The timeline and the guard read rates, so
    these counts are not tied to the per-user sums' total: a multinomial per second and replica cost 10 times more."""
    ok = 1.0 - len(events.call) / max(len(calls.user), 1)
    requests, repeats = span.per_second()
    rate = (len(calls.user) - len(calls.repeated)) * requests + len(calls.repeated) * repeats
    return rng.poisson(np.broadcast_to(rate * ok / replicas, (replicas, len(rate)))).astype(np.float64)


def _above(log_latency: np.ndarray, log_bounds: np.ndarray) -> np.ndarray:
    """Per call, the bounds strictly below its latency (`searchsorted(bounds, latency, side="left")`), from the
    bounds' geometric spacing checked against the two nearest (rounded) bounds: 20 times faster in float32."""
    step = (log_bounds[-1] - log_bounds[0]) / (len(log_bounds) - 1)
    scaled = (log_latency - np.float32(log_bounds[0])) * np.float32(1 / step) + np.float32(1)
    guess = np.clip(scaled, 0, len(log_bounds)).astype(np.int32)  # floor + 1, for what is not clipped
    padded = np.concatenate([[-np.inf], log_bounds, [np.inf, np.inf]]).astype(np.float32)  # [i + 1] is bound i
    return guess - 1 + (log_latency > padded[guess]) + (log_latency > padded[guess + 1])


@dataclass(frozen=True, eq=False)
class SlowCounts:
    """Per user, the calls slower than each latency bound (as `summarize_calls` counts them): dense rows for the
    first bounds, the few calls beyond them one by one (a timeout sits 20 bounds past the rest: a dense row for each
    of those bounds would cost more than all the others)."""

    dense: np.ndarray  # (rows, users): calls slower than bounds 0 … rows - 1
    user: np.ndarray  # each call slower than bound `rows`: its user …
    above: np.ndarray  # … and how many bounds are below its latency (it counts for bounds rows … above - 1)

    def add_into(self, into: np.ndarray, users: slice) -> None:
        """Add the counts of the users in `users` into `into` (bounds x those users)."""
        rows = len(self.dense)
        into[:rows] += self.dense[:, users]
        mine = (self.user >= users.start) & (self.user < users.stop)
        if mine.any():
            span = self.above[mine] - rows
            cells = np.arange(span.sum()) - np.repeat(np.cumsum(span) - span, span) + rows
            np.add.at(into, (cells, np.repeat(self.user[mine] - users.start, span)), 1)

    def full(self, bounds: int) -> np.ndarray:
        """Every bound's row (as floats)."""
        out = np.zeros((bounds, self.dense.shape[1]))
        self.add_into(out, slice(0, self.dense.shape[1]))
        return out


def _slow(user: np.ndarray, users: int, log_latency: np.ndarray, log_bounds: np.ndarray) -> SlowCounts:
    """Per user, the calls slower than each bound: dense rows up to the bound past which the remaining calls are
    cheaper one by one (a dense row costs a pass over every user, a call past it one scattered add per bound)."""
    above = _above(log_latency, log_bounds)
    if not len(above):
        return SlowCounts(np.zeros((0, users), np.float32), above, above)
    per_row = np.bincount(above, minlength=len(log_bounds) + 1)
    beyond = np.cumsum(per_row[::-1])[::-1]  # beyond[k]: calls with at least k bounds below
    scattered = np.cumsum(beyond[::-1])[::-1] - beyond  # cells the calls past row k add one by one
    lo = int(np.flatnonzero(per_row)[0])
    hi = lo + int(np.argmin(np.arange(len(beyond) - lo) * users + 32 * scattered[lo:]))
    clipped = np.minimum(above, hi)
    cells = np.bincount((clipped - lo) * users + user, minlength=(hi - lo + 1) * users)
    band = cells.astype(np.float32).reshape(-1, users)  # exact: a tick's count per user is far below 2**24
    for i in range(hi - lo - 1, -1, -1):  # band[i]: calls with at least lo + i bounds below (row adds beat cumsum)
        band[i] += band[i + 1]
    # rows < lo count every call; rows lo … hi - 1 are band[1:]; rows from hi on: the calls past hi, one by one
    dense = band[1:] if lo == 0 else np.concatenate([np.broadcast_to(band[0], (lo, users)), band[1:]])
    out = above > hi
    return SlowCounts(dense, user[out], above[out])


def _call_sums(calls: _ArmCalls, events: _Events, log_bounds: np.ndarray, select: Any = None) -> dict:
    """Calls, failures, NaN, log latency and the slow counts per user (of the selected calls; default all)."""
    m = len(calls.requests)
    user, log_latency, mine = calls.user, calls.log_latency, np.ones(len(events.call), bool)
    per_user = calls.calls
    if select is not None:
        user, log_latency, mine = user[select], log_latency[select], select[events.call]
        per_user = np.bincount(user, minlength=m)
    hard = ((events.outcome == ERROR) | (events.outcome == TIMEOUT)) & mine
    nan = (events.outcome == NAN) & mine
    return {
        "calls": per_user.astype(np.float64),
        "failed": np.bincount(calls.user[events.call[hard]], minlength=m).astype(np.float64),
        "nan": np.bincount(calls.user[events.call[nan]], minlength=m).astype(np.float64),
        "log_latency": np.bincount(user, weights=log_latency, minlength=m),
        "slow": _slow(user, m, log_latency, log_bounds),
    }


def _answer_sums(
    rng: np.random.Generator, calls: _ArmCalls, events: _Events, nan_requests: np.ndarray, rescue: float, eta_sd: float
) -> dict:
    """Per user: distinct requests answered, those below LOW_CONFIDENCE, and the sums of log confidence and log ETA
    (a failed request still counts once if one of its repeats is answered, unless its answer is NaN)."""
    m, model = len(calls.requests), calls.model
    lost = np.bincount(calls.user[events.call[~calls.repeat(events.call)]], minlength=m)
    rescued = np.zeros(m, np.int64)
    if len(events.call):
        hopeless = np.bincount(calls.user[nan_requests], minlength=m)
        # drawn only for the few users with a failed request (a binomial of 0 trials per user cost ~1 ms a tick)
        some_lost = np.flatnonzero(lost > hopeless)
        chance = rescue * (1 - len(events.call) / max(len(calls.user), 1))
        rescued[some_lost] = rng.binomial((lost - hopeless)[some_lost], chance)
    answers = calls.requests - lost + rescued
    some = np.flatnonzero(answers)  # only users with answers draw (often half of them)
    n = answers[some]
    p_low, low_m, low_v, high_m, high_v, log_eta = model.answers[:, some]
    low = rng.binomial(n, p_low)
    noise = rng.standard_normal((2, len(some)))
    low_sum = np.zeros(len(some))
    any_low = np.flatnonzero(low)  # a sum of no low answers is 0: only the few users with one draw its noise
    k = low[any_low]
    low_sum[any_low] = k * low_m[any_low] + np.sqrt(k * low_v[any_low]) * rng.standard_normal(len(any_low))
    high_sum = (n - low) * high_m + np.sqrt((n - low) * high_v) * noise[0]
    out = {name: np.zeros(m) for name in ("low_confidence", "log_eta", "log_confidence")}
    out["low_confidence"][some] = low
    out["log_eta"][some] = n * log_eta + np.sqrt(n) * eta_sd * noise[1]
    out["log_confidence"][some] = low_sum + high_sum
    out["answers"] = answers.astype(np.float64)
    return {**out, "_some": some, "_low_sum": low_sum, "_high_sum": high_sum, "_eta_sd": eta_sd, "_rescued": rescued}


def generate_sums(
    stage: StageTraffic,
    rng: np.random.Generator,
    t0: float,
    t1: float,
    log_bounds: np.ndarray,
    candidate_retry: bool = True,
) -> Tick:
    """The traffic of [t0, t1) as per-user sums per arm, first-call failures as events, successes per second.

    `log_bounds`: the log of the latency bounds the slow counts are taken at (mlrelease's LATENCY_BOUNDS_S).
    """
    p = stage.model.world.profile
    span = _Span(t0, t1 - t0, p.repeat_window_s)
    cand = _arm_calls(stage, CANDIDATE_ARM, rng, span.dt)
    own, nan_requests = _own(stage, rng, span, cand)
    no_retry = (np.zeros(0), np.zeros(0, np.int8))
    c_events = [_timeouts(cand, p.candidate_timeout_s), *_served_failures(p, rng, span, cand, no_retry), *own]
    c_events = _placed(rng, span, cand, _Events.join(c_events), p.replicas)
    _fix_timeouts(cand, c_events, p.candidate_timeout_s)
    retry = _retries(cand, c_events) if candidate_retry else no_retry
    stab = _arm_calls(stage, STABLE_ARM, rng, span.dt)
    s_events = [_timeouts(stab, p.stable_timeout_s), *_served_failures(p, rng, span, stab, retry)]
    s_events = _placed(rng, span, stab, _Events.join(s_events), p.replicas)
    _fix_timeouts(stab, s_events, p.stable_timeout_s)
    rescue, arms, sums = span.rescue(p), [], []
    for calls, events, nan in ((stab, s_events, np.zeros(0, np.int64)), (cand, c_events, nan_requests)):
        answers = _answer_sums(rng, calls, events, nan, rescue, p.call_eta_sd)
        sums.append({**_call_sums(calls, events, log_bounds), **{k: answers[k] for k in SUMS if k in answers}})
        arms.append((calls, events, answers))
    ok = np.stack([_successes(rng, span, calls, events, p.replicas) for calls, events, _ in arms])
    return Tick(t0, t1, tuple(sums), ok, _failures(arms), retry[0], span, tuple(arms))


def _fix_timeouts(calls: _ArmCalls, events: _Events, timeout_s: float) -> None:
    """A call that timed out took the timeout (the gateway gave up then), as `_serve` records it."""
    calls.log_latency[events.call[events.outcome == TIMEOUT]] = np.float32(math.log(timeout_s))


def _retries(calls: _ArmCalls, events: _Events) -> tuple[np.ndarray, np.ndarray]:
    """Stable's retry of each failed candidate call: when the failure came back, on the same replica."""
    return events.t + np.exp(calls.log_latency[events.call].astype(np.float64)), events.replica.copy()


def _failures(arms: list[tuple[_ArmCalls, _Events, dict]]) -> Failures:
    """Both arms' failures in one time-ordered list."""
    parts = [(events, np.full(len(events.call), calls.model.arm, np.int8)) for calls, events, _ in arms]
    t = np.concatenate([e.t for e, _ in parts])
    order = np.argsort(t, kind="stable")
    pick = lambda name: np.concatenate([getattr(e, name) for e, _ in parts])[order]  # noqa: E731
    arm = np.concatenate([a for _, a in parts])[order]
    return Failures(t[order], pick("replica"), arm, pick("outcome"), pick("call"))


def _cut_arm(
    arm: tuple[_ArmCalls, _Events, dict],
    spans: list[tuple[float, float]],
    span: _Span,
    rng: np.random.Generator,
    log_bounds: np.ndarray,
) -> list[dict]:
    """One arm's sums within each span: every call lands in at most one span (failed calls by their time)."""
    calls, events, totals = arm
    repeats = calls.all_repeats()
    where = _span_of_calls(calls, events, spans, span, rng, repeats)
    left = _answer_totals(calls, totals)
    failed = np.zeros(len(calls.user), bool)
    failed[events.call] = True
    answerable = ~repeats & ~failed
    pieces, rescued, left_share = [], totals["_rescued"], 1.0
    for j, (a, b) in enumerate(spans):
        inside = where == j
        piece = _call_sums(calls, events, log_bounds, inside)
        answered = np.bincount(calls.user[inside & answerable], minlength=len(calls.requests))
        # a failed request answered by a repeat: its answer arrived with the repeat, in this span at the repeats' share
        share = span.shares(a - span.t0, b - span.t0)[1]
        found = rng.binomial(rescued, min(share / left_share, 1.0)) if rescued.any() else 0
        rescued, left_share = rescued - found, left_share - share
        piece.update(_cut_answers(rng, left, np.minimum(answered + found, left["answers"]).astype(np.int64)))
        pieces.append(piece)
    return pieces


def _answer_totals(calls: _ArmCalls, totals: dict) -> dict:
    """The tick's answer sums per user, and what a piece's answer sums are bridged from."""
    m, some, model = len(calls.requests), totals["_some"], calls.model
    left = {name: totals[name].copy() for name in ("answers", "low_confidence", "log_eta")}
    for name in ("_low_sum", "_high_sum"):
        left[name] = np.zeros(m)
        left[name][some] = totals[name]
    left["_low_var"], left["_high_var"] = model.answers[2], model.answers[4]
    left["_eta_var"] = np.full(m, totals["_eta_sd"] ** 2)
    return left


def _span_of_calls(
    calls: _ArmCalls,
    events: _Events,
    spans: list[tuple[float, float]],
    span: _Span,
    rng: np.random.Generator,
    repeats: np.ndarray,
) -> np.ndarray:
    """The span each call arrived in (-1: none): a failed call by its time, any other by its arrival density."""
    u, where = rng.random(len(calls.user)), np.full(len(calls.user), -1)
    low = np.zeros(len(calls.user))
    for j, (a, b) in enumerate(spans):
        request, repeat = span.shares(a - span.t0, b - span.t0)
        high = low + np.where(repeats, repeat, request)
        where[(u >= low) & (u < high)] = j
        low = high
    where[events.call] = -1
    for j, (a, b) in enumerate(spans):
        where[events.call[(events.t >= a) & (events.t < b)]] = j
    return where


def _cut_answers(rng: np.random.Generator, left: dict, take: np.ndarray) -> dict:
    """`take` of each user's answers not yet in a piece: how many were low (hypergeometric) and their sums, bridged
    from what is left (a subset's sum of iid normals given the total); `left` loses the piece."""
    n, low = left["answers"].astype(np.int64), left["low_confidence"].astype(np.int64)
    low_take = rng.hypergeometric(low, n - low, take)
    high_take, high = take - low_take, n - low
    piece = {"answers": take.astype(np.float64), "low_confidence": low_take.astype(np.float64)}
    piece["log_eta"] = _bridge(rng, left["log_eta"], n, take, left["_eta_var"])
    low_sum = _bridge(rng, left["_low_sum"], low, low_take, left["_low_var"])
    high_sum = _bridge(rng, left["_high_sum"], high, high_take, left["_high_var"])
    piece["log_confidence"] = low_sum + high_sum
    for name, part in (("answers", take), ("low_confidence", low_take), ("log_eta", piece["log_eta"])):
        left[name] = left[name] - part
    left["_low_sum"], left["_high_sum"] = left["_low_sum"] - low_sum, left["_high_sum"] - high_sum
    return piece


def _bridge(rng: np.random.Generator, total: np.ndarray, n: np.ndarray, k: np.ndarray, var: np.ndarray) -> np.ndarray:
    """The sum of k of n iid normal values (variance `var` each) whose sum is `total`."""
    safe = np.maximum(n, 1)
    spread = np.sqrt(np.maximum(var * k * (n - k) / safe, 0.0))
    return np.where(n > 0, total * k / safe, 0.0) + spread * rng.standard_normal(len(n))


def _self_check() -> None:
    """Print the model's key numbers, to check against the profile's intent."""
    rng, aa, half = np.random.default_rng(7), CandidateEffect(), {"*": 50.0}
    world = make_world(TrafficProfile(), rng)
    hour = generate(world, aa, rng, 0.0, 300.0, half)
    for t0 in range(300, 3600, 300):  # in 300 s ticks, as the simulator calls it
        hour = hour.concat(generate(world, aa, rng, float(t0), t0 + 300.0, half))
    first = ~hour.retry
    print(f"calls/s (first attempts): {first.sum() / 3600:.1f}, retries: {hour.retry.sum()}")
    counts = np.sort(np.bincount(hour.unit[first], minlength=world.profile.users))[::-1]
    print(f"top 1 % of users make {counts[: world.profile.users // 100].sum() / counts.sum():.1%} of calls")
    day = generate(world, aa, rng, 0.0, 86_400.0, half)  # ~860 failures: a tighter estimate than one hour's ~36
    for calls, span in ((hour, 3600), (day, 86_400)):
        for arm, name in ((0, "stable"), (1, "candidate")):
            sel = ~calls.retry & (calls.arm == arm)
            bad = np.count_nonzero(calls.outcome[sel])
            print(f"A/A {span} s failure rate, {name} arm: {bad / sel.sum():.2e} ({bad} of {sel.sum()})")
    tail = (hour.cohort == world.profile.cohorts.index("long_tail")) & (hour.outcome == OK)
    print(f"long-tail answers with confidence < 0.6: {np.mean(hour.confidence[tail] < 0.6):.2%}")
    effect, lat = p99_regression(), []
    for eff in (aa, effect):  # same seed and users: only the effect differs
        calls = generate(world, eff, np.random.default_rng(11), 0.0, 7200.0, {"*": 100.0})
        lat.append(calls.latency_s[(calls.served == 1) & (calls.outcome == OK)])
    p99 = np.percentile(lat[1], 99) / np.percentile(lat[0], 99)
    geo = math.exp(np.log(lat[1]).mean() - np.log(lat[0]).mean())
    print(
        f"p99_regression (share {effect.latency_tail_share}, factor {effect.latency_tail_factor:.2f}) vs A/A: "
        f"p99 x {p99:.3f}, mean-log-latency x {geo:.4f} (mean x {lat[1].mean() / lat[0].mean():.3f})"
    )
    best = math.inf
    for _ in range(30):
        began = time.perf_counter()
        calls = generate(world, aa, rng, 0.0, 600.0, half)
        best = min(best, time.perf_counter() - began)
    print(f"generate 600 s ({len(calls)} calls): {best * 1000:.1f} ms (best of 30)")
    stage = stage_traffic(user_model(world, aa), assign(world, half))
    log_bounds = np.log(np.round(np.geomspace(0.001, 10.0, 41), 6))  # mlrelease's LATENCY_BOUNDS_S
    best = math.inf
    for _ in range(30):
        began = time.perf_counter()
        tick = generate_sums(stage, rng, 0.0, 600.0, log_bounds)
        best = min(best, time.perf_counter() - began)
    calls = sum(int(arm["calls"].sum()) for arm in tick.sums)
    print(f"generate_sums 600 s ({calls} calls as per-user sums): {best * 1000:.1f} ms (best of 30)")


if __name__ == "__main__":
    _self_check()
