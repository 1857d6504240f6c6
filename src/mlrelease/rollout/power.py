"""The power check: can each stage contract reach a verdict within its stage's maximum exposure at the traffic the
plan declares? (pure arithmetic on the plan)

A contract passes only when its confidence sequence lies within the tolerance. For a candidate exactly as good as
stable that happens once the band's half-width drops below the tolerance, so the check computes the half-width the
contract's own boundary (`mlrelease.verdicts.sequential.mixture_radius`, at its allocated α and tuning) would have at
the maximum exposure, from the declared requests per second of each cohort, the stage's split, and a per-request
variance for the metric times a design effect (what heavy users add that their own history does not explain). A
contract whose half-width stays above its tolerance would only ever be inconclusive: the plan is refused, naming the
contract, the requests per arm it would need and the smallest tolerance it can resolve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mlrelease.rollout.plan import ALL, RELATIVE, ExpectedTraffic, Guardrail, Profile, RolloutPlan, Stage
from mlrelease.verdicts.sequential import mixture_radius

ANSWERS = ("low_confidence_share", "prediction_shift", "confidence_shift")


@dataclass(frozen=True)
class Power:
    """One contract × cohort × stage under one profile: the half-width it reaches, and what it needs."""

    stage: str
    cohort: str
    contract: str
    tolerance: float  # on the band's scale (log for relative shifts)
    radius: float  # the band's half-width at the maximum exposure
    requests: float  # per arm (the smaller) at the maximum exposure
    needed: float  # per arm, for the half-width to reach the tolerance
    relative: bool  # a relative shift (tolerance on the log scale), not a share
    limit: float | None = None  # judged against a fixed level (then `tolerance` is the limit's distance from it)

    @property
    def resolves(self) -> bool:
        """Whether the contract can pass a candidate as good as stable in time."""
        return self.radius < self.tolerance

    def describe(self, profile: Profile, max_exposure_s: float) -> str:
        """One line for the refusal."""
        if self.limit is not None:
            smallest = f"the lowest limit it can resolve there is {self.limit - self.tolerance + self.radius:.3g}"
        elif self.relative:
            smallest = f"the smallest tolerance it can resolve there is {math.expm1(self.radius):.1%}"
        else:
            smallest = f"the smallest tolerance it can resolve there is {self.radius * 100:.2g} pp"
        return (
            f"stage {self.stage}, {self.cohort}: {self.contract} cannot reach a verdict within max_exposure_s "
            f"{max_exposure_s:g} s ({profile}): ~{self.requests:,.0f} requests per arm at the declared traffic, it "
            f"needs ~{self.needed:,.0f}; {smallest}"
        )


def _per_request_variance(guardrail: Guardrail, traffic: ExpectedTraffic, requests: float) -> float:
    """The variance one request adds to the metric's estimate (before the design effect)."""
    metric = guardrail.metric
    if metric in RELATIVE:
        sd = {"latency": traffic.log_latency_sd, "prediction_shift": traffic.log_eta_sd}.get(
            metric, traffic.log_confidence_sd
        )
        return sd**2
    rate = {
        "error_rate": traffic.error_rate,
        "nan_rate": traffic.error_rate,
        "low_confidence_share": traffic.low_confidence_share,
        "latency_tail": 1.0 - guardrail.quantile,
    }[metric]
    # as `mlrelease.verdicts.sequential`: a share's variance never goes below the smoothed binomial one
    rate = max(rate, 1.0 / max(requests, 1.0))
    return rate * (1.0 - rate)


def _arms(stage: Stage, cohort: str, traffic: ExpectedTraffic, seconds: float) -> tuple[float, float]:
    """Requests per arm (candidate, stable) of the judged cohort (or every opened cohort, for '*') in `seconds`."""
    pool = [c for c in traffic.requests_per_s if stage.share(c) > 0] if cohort == ALL else [cohort]
    candidate = sum(traffic.requests_per_s[c] * stage.share(c) / 100 for c in pool) * seconds
    stable = sum(traffic.requests_per_s[c] * (1 - stage.share(c) / 100) for c in pool) * seconds
    return candidate, stable


# A candidate exactly as good as stable passes once its band lies within the tolerance: the band's centre wanders
# with sd σ around 0, so "half-width < tolerance" alone passes it about half the time at the maximum exposure. The
# check asks for half-width + POWER_Z·σ ≤ tolerance: such a candidate passes in time with ~84 % chance (one-sided).
POWER_Z = 1.0


def _radius(guardrail: Guardrail, traffic: ExpectedTraffic, candidate: float, stable: float) -> float:
    """How far the band of a candidate as good as stable reaches after `candidate` and `stable` requests: the
    half-width the contract's boundary computes plus POWER_Z of the estimate's sd."""
    half_width, sd = spread(guardrail, traffic, candidate, stable)
    return half_width + POWER_Z * sd


def spread(guardrail: Guardrail, traffic: ExpectedTraffic, candidate: float, stable: float) -> tuple[float, float]:
    """The band's half-width (the contract's own boundary at its α and tuning) and the estimate's sd after
    `candidate` and `stable` requests of the declared traffic."""
    n = candidate if guardrail.limit is not None else min(candidate, stable)
    if n <= 0:
        return math.inf, math.inf
    if guardrail.limit is not None:  # one arm against a fixed level
        variance = _per_request_variance(guardrail, traffic, candidate) * traffic.design_effect / candidate
    else:
        variance = traffic.design_effect * (
            _per_request_variance(guardrail, traffic, candidate) / candidate
            + _per_request_variance(guardrail, traffic, stable) / stable
        )
    alpha = guardrail.alpha or 0.01
    rho = guardrail.min_samples / (n * variance)  # the contract's tuning, as `sequential._band` sets it
    return mixture_radius(1.0 / variance, alpha, rho), math.sqrt(variance)


def _room(guardrail: Guardrail, traffic: ExpectedTraffic) -> float:
    """How far the band may reach and still pass: the tolerance, or a limit's distance from the expected level."""
    if guardrail.limit is not None:
        expected = traffic.low_confidence_share if guardrail.metric == "low_confidence_share" else traffic.error_rate
        return guardrail.limit - expected
    return guardrail.log_tolerance


def contract_power(
    stage: Stage, guardrail: Guardrail, cohort: str, traffic: ExpectedTraffic, profile: Profile
) -> Power:
    """The power of one (allocated) contract on one judged cohort of a stage under `profile`."""
    seconds = stage.max_exposure_s[profile]
    candidate, stable = _arms(stage, cohort, traffic, seconds)
    if guardrail.metric in ANSWERS:  # counted once per distinct request
        candidate, stable = candidate * traffic.distinct_share, stable * traffic.distinct_share
    radius, room = _radius(guardrail, traffic, candidate, stable), _room(guardrail, traffic)
    needed = candidate if guardrail.limit is not None else min(candidate, stable)
    requests = needed
    if radius >= room and needed > 0:
        low, high = 1.0, 2.0
        while _radius(guardrail, traffic, candidate * high, stable * high) >= room and high < 1e7:
            low, high = high, high * 2
        for _ in range(40):  # bisect the traffic multiple at which the half-width reaches the room
            scale = math.sqrt(low * high)
            if _radius(guardrail, traffic, candidate * scale, stable * scale) >= room:
                low = scale
            else:
                high = scale
        needed *= high
    relative = guardrail.metric in RELATIVE
    return Power(stage.name, cohort, guardrail.describe(), room, radius, requests, needed, relative, guardrail.limit)


def underpowered(plan: RolloutPlan, profile: Profile) -> list[str]:
    """One line per contract of the (allocated) plan that cannot reach a verdict in time under `profile`."""
    traffic = plan.traffic.get(profile)
    if traffic is None:
        return []
    lines = []
    for stage in plan.under(profile).stages:
        for guardrail in stage.guardrails:
            if guardrail.exact:
                continue  # a zero limit is decided by one event, or by none in `min_samples` requests
            for cohort in guardrail.cohorts or stage.judged:
                if cohort != ALL and stage.share(cohort) <= 0:
                    continue  # a cohort the stage does not open is not judged there (as the analysis skips it)
                power = contract_power(stage, guardrail, cohort, traffic, profile)
                if not power.resolves:
                    lines.append(power.describe(profile, stage.max_exposure_s[profile]))
    return lines
