"""The candidate's fast guard, relative to stable: do hard failures fall on the candidate more than its traffic says?

A count of failures ("3 in 10 s") says nothing about the candidate once stages last hours: stable itself fails now
and then (1 in 10,000 calls is ordinary), and an absolute count is reached by chance sooner or later. This guard
asks how the failures of the same seconds *split* between the arms. If the candidate fails no more often than
stable, a failure falls on the candidate with probability π, the candidate's share of the recent requests
(conditioning on the total count removes the unknown common failure rate: Lindon, Sanden & Shirikian, "Rapid
Regression Detection in Software Deployments through Sequential Testing", KDD 2022). Against the alternative that
the candidate fails `ratio` times as often, a failure on the candidate multiplies the likelihood ratio by θ₁/π and one
on stable by (1 − θ₁)/(1 − π), with θ₁ = ratio·π / (ratio·π + 1 − π).

The statistic is a CUSUM of those log ratios (reset at zero, so evidence from a good past cannot hide a candidate
that starts failing now: the e-CUSUM of Shin, Ramdas & Rinaldo, "E-detectors", 2023). The j-th weighed failure is
checked against log(1/α_j) with α_j = α · 6/(π² j²). Why that spends at most α in all: the CUSUM crosses at
failure j only if the likelihood-ratio product started at some earlier failure i ≤ j crosses 1/α_j ≥ 1/α_i, and by
Ville's inequality the product started at i ever crosses 1/α_i with probability at most α_i; Σ_i α_i = α.

That bound needs failures independent given the traffic, and real ones come in bursts: a stalled instance fails the
next few calls of its version on that replica back to back. A burst falls on one arm as a whole, so five failures
of one burst are one piece of evidence, not five (weighed one by one, a burst of 5 on a 12 % candidate carries
~10.5 nats and tripped ~0.2 % of A/A rollouts in the simulator). So failures are weighed by *runs*: back-to-back
failures of one arm on this replica with no success of that arm between them weigh once per `burst_failures`
(the longest burst a healthy version shows). Bursts are then the independent events the bound counts.

A candidate that fails every call makes one endless run, which the CUSUM weighs only every `burst_failures`
failures; such a run is decided exactly instead, like a zero limit: a healthy version never fails more than
`burst_failures` calls in a row (one more allows an independent failure right beside a burst), so
`burst_failures + 2` back-to-back candidate failures trip it, provided stable answered on this replica during the
run and never failed (a serving outage fails both arms: a stable failure starts the count again). Replicas pool
their runs (gateway/run_pool.py): while every replica is in a run, their sum is the candidate's run across the fleet,
and `pooled_trip` decides it by the same rule at the fleet's pace.

A failure is one failed *model call*: the rows of one failed batch (the gateway's micro-batcher sends many requests
in one call) fail together and weigh as one, as do they in the run rule. And stable is judged at the candidate's
budget: the gateway reports a stable answer slower than the candidate's timeout as a stable failure, so a slowdown
of serving that times out the candidate's calls (its budget is shorter) splits between the arms instead of falling
on the candidate alone.

Every model call counts by the version that made it: stable's retries of failed candidate calls are stable calls of
the same seconds (a shared outage fails them too), so even a candidate that serves every cohort is compared with
stable.

NaN/inf and out-of-range answers are judged exactly, like the plan's zero limit on `nan_rate`: stable never gives one
(it would be broken itself), so `invalid_to_trip` of them trip the candidate whatever the traffic split.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

# Below this many requests in the window the traffic share is not known well enough to weigh a failure.
MIN_REQUESTS = 10


class SplitGuard:
    """One candidate version's relative fast guard on one gateway replica.

    :param ratio: the failure-rate ratio (candidate / stable) the test is tuned to detect.
    :param alpha: the chance that this replica's guard ever trips an A/A candidate (independent failures).
    :param window_s: how far back the arms' request counts give the traffic share π.
    :param burst_failures: the longest run of back-to-back failures a healthy version shows on one replica.
    :param clock: monotonic clock (injectable for tests and the simulator).
    """

    def __init__(
        self,
        *,
        ratio: float,
        alpha: float,
        window_s: float,
        invalid_to_trip: int = 3,
        burst_failures: int = 5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ratio <= 1 or not 0 < alpha < 1 or window_s <= 0 or burst_failures < 1:
            raise ValueError(
                "SplitGuard needs ratio > 1, 0 < alpha < 1, window_s > 0, burst_failures ≥ 1 "
                f"(got {ratio}, {alpha}, {window_s}, {burst_failures})"
            )
        self.ratio = ratio
        self.alpha = alpha
        self.window_s = window_s
        self._clock = clock
        self._seconds: deque[list[float]] = deque()  # [second, candidate requests, stable requests]
        self._candidate = 0.0
        self._stable = 0.0
        self.evidence = 0.0  # the CUSUM of log likelihood ratios
        self.failures = 0  # runs weighed so far (j)
        self.burst_failures = burst_failures
        self.runs = {"candidate": 0, "stable": 0}  # each arm's back-to-back failures on this replica, now
        self._last_call: dict[str, object] = {}  # each arm's last failed model call (rows of one batch share it)
        self._clean_run = 0  # the candidate's back-to-back failures since stable last failed …
        self._stable_answered = False  # … and whether stable succeeded during them
        self._candidate_seen = False  # whether the candidate made any call on this replica yet
        self.pooled = 0  # the last pooled run the replicas reported
        self.reason = ""  # what tripped it: "invalid", "run", "pooled" or "evidence"
        self.invalid_to_trip = invalid_to_trip
        self.invalid = 0  # the candidate's NaN/inf or out-of-range answers
        self.tripped = False

    def share(self) -> float | None:
        """The candidate's share of this replica's recent requests (None while too few were seen)."""
        self._expire(self._clock())
        total = self._candidate + self._stable
        return self._candidate / total if total >= MIN_REQUESTS else None

    @property
    def run_to_trip(self) -> int:
        """Back-to-back candidate failures (while stable answers) that no healthy version shows: they trip it."""
        return self.burst_failures + 2

    @property
    def clean_run(self) -> tuple[int, bool]:
        """The candidate's back-to-back failures on this replica since its last success and stable's last failure,
        and whether stable answered here during them: what this replica puts into the pool (gateway/run_pool.py).
        -1 while no candidate call was made here (so none succeeded either)."""
        if not self._candidate_seen:
            return -1, False
        return self._clean_run, self._clean_run > 0 and self._stable_answered

    def pooled_trip(self, pooled: int) -> bool:
        """The replicas' runs add up to `pooled` back-to-back candidate failures while stable answered (the pool's
        answer): True when that trips the guard by the run rule (this replica still in its run)."""
        if self.tripped:
            return False
        self.pooled = pooled
        return self._trip("pooled", pooled >= self.run_to_trip and self._clean_run > 0)

    def threshold(self, failures: int) -> float:
        """The log-evidence the `failures`-th failure must reach to trip (log 1/α_j)."""
        return math.log(math.pi**2 * failures**2 / (6.0 * self.alpha))

    def observe(self, arm: str, failed: bool, count: int = 1, call: object | None = None) -> bool:
        """One request of `arm` ('candidate' or 'stable'), failed or not; True when this one trips the guard.

        `count` requests at once (successes only: the simulator's bulk); a failure is weighed against the share seen
        before it, so the share never depends on the outcome it judges. `call`: the failed model call (rows of one
        batch share it; a row after the first adds a request, not evidence).
        """
        if failed and count != 1:
            raise ValueError(f"a failure is one request (got count={count})")
        if self.tripped:
            return False
        now = self._clock()
        tripped = False
        self._candidate_seen = self._candidate_seen or (arm == "candidate" and (failed or count > 0))
        if failed:
            if call is None or self._last_call.get(arm) is not call:  # another row of a weighed call adds nothing
                self._last_call[arm] = call
                tripped = self._failed(arm)
        elif count:
            self._answered(arm)
        self._count(now, arm, count)
        return tripped

    def invalid_answer(self) -> bool:
        """The candidate answered NaN/inf or out of range; True when this one trips the guard (a zero limit)."""
        if self.tripped:
            return False
        self.invalid += 1
        self._trip("invalid", self.invalid >= self.invalid_to_trip)
        return self.tripped

    def _failed(self, arm: str) -> bool:
        """One failure: it extends its arm's run; the run's 1st, (m+1)-th, … failure is weighed (m = burst_failures)."""
        run = self.runs[arm] = self.runs[arm] + 1
        if arm == "candidate":
            if self._clean_run == 0:
                self._stable_answered = False
            self._clean_run += 1
        else:
            self._clean_run = 0  # stable fails too: the candidate's run so far may be a shared outage
        if (run - 1) % self.burst_failures == 0 and self._trip("evidence", self._weigh(arm, self.share())):
            return True
        self._trip("run", self._clean_run >= self.run_to_trip and self._stable_answered)
        return self.tripped

    def _answered(self, arm: str) -> None:
        """Successes of `arm`: its run of failures ends; stable's count as stable answering beside the candidate's."""
        self.runs[arm] = 0
        if arm == "stable":
            self._stable_answered = True
        else:
            self._clean_run = 0

    def _trip(self, reason: str, trips: bool) -> bool:
        if trips and not self.tripped:
            self.tripped, self.reason = True, reason
        return trips

    def _weigh(self, arm: str, share: float | None) -> bool:
        if share is None or not 0.0 < share < 1.0:
            return False  # one arm alone in the window: a failure cannot tell the arms apart
        theta = self.ratio * share / (self.ratio * share + 1.0 - share)
        step = math.log(theta / share) if arm == "candidate" else math.log((1.0 - theta) / (1.0 - share))
        self.evidence = max(self.evidence, 0.0) + step
        self.failures += 1
        return self.evidence >= self.threshold(self.failures)

    def _count(self, now: float, arm: str, count: int) -> None:
        second = math.floor(now)
        if not self._seconds or self._seconds[-1][0] != second:
            self._seconds.append([second, 0.0, 0.0])
        slot = self._seconds[-1]
        if arm == "candidate":
            slot[1] += count
            self._candidate += count
        else:
            slot[2] += count
            self._stable += count

    def _expire(self, now: float) -> None:
        while self._seconds and self._seconds[0][0] <= now - self.window_s:
            _, candidate, stable = self._seconds.popleft()
            self._candidate -= candidate
            self._stable -= stable

    def describe(self) -> str:
        """Why it tripped, for the trip record and the alert."""
        if self.reason == "invalid":
            return f"the candidate answered NaN/inf or out of range {self.invalid} times (a zero limit)"
        if self.reason == "run":
            return (
                f"the candidate failed {self._clean_run} calls in a row while stable answered (no healthy "
                f"version fails more than {self.burst_failures} in a row)"
            )
        if self.reason == "pooled":
            return (
                f"the candidate failed {self.pooled} calls in a row across the gateway's replicas while stable "
                f"answered (no healthy version fails more than {self.burst_failures} in a row)"
            )
        return (
            f"hard failures fell on the candidate beyond its traffic share: log-evidence {self.evidence:.1f} ≥ "
            f"{self.threshold(self.failures):.1f} at run {self.failures} (ratio {self.ratio:g} vs stable, "
            f"α={self.alpha:g} per replica)"
        )
