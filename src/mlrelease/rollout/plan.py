"""The rollout plan: the shadow gate, then ordered stages, each opening cohorts to the candidate with guardrails.

Loaded from YAML (`config/rollout_plan.yaml`) and validated on load, so a bad plan (a tolerance or α out of
range, a guardrail without a direction, a stage without a control slice) fails naming the field before any
traffic moves. Every guardrail is a statistical contract (see `mlrelease.verdicts`): the metric, the
direction that is bad, a practical tolerance, and a false-verdict rate α. Every judged cohort keeps a
concurrent, sticky control slice on stable (users are bucketed by a hash of their id), so the candidate is
always compared with stable traffic of the same cohort in the same minutes.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from mlrelease.errors import StepError
from mlrelease.release_spec import process_spec
from mlrelease.yamlconfig import StrictModel, load_yaml_model

Metric = Literal[
    "error_rate", "nan_rate", "low_confidence_share", "latency", "latency_tail", "prediction_shift", "confidence_shift"
]
Action = Literal["rollback_cohort", "rollback_all", "pause"]
Profile = Literal["production", "demo"]
Direction = Literal["higher", "lower", "either"]
OnInconclusive = Literal["accept", "pause", "rollback"]  # the shadow gate's one-look tests
# A stage contract never passes without evidence: an open question at the maximum exposure pauses or rolls back, and
# the power check (`mlrelease.rollout.power`, run when a plan with `traffic` loads) refuses a contract that cannot
# reach a verdict in time.
StageOnInconclusive = Literal["pause", "rollback"]

# Metrics whose value is a share of calls (tolerance in absolute share: 0.001 = 0.1 percentage points) and
# metrics compared as a relative shift (tolerance as a fraction: 0.10 = 10 %, judged on the log scale).
# `latency_tail` is the share of requests slower than stable's `quantile` (e.g. its p99): a p99 regression shows as
# that share rising above 1 %, however little the mean moves.
SHARES = ("error_rate", "nan_rate", "low_confidence_share", "latency_tail")
RELATIVE = ("latency", "prediction_shift", "confidence_shift")
MAX_ALPHA = 0.2
# Metrics that only mean something for a regression model with a confidence score: the share of answers below a
# confidence of 0.6, and the shift of the mean log prediction (a classifier's prediction is 0 or 1).
REGRESSION_ONLY = {
    "low_confidence_share": "the share of answers whose confidence is below 0.6",
    "prediction_shift": "the shift of the mean log prediction",
}
ALL = "*"  # a judged "cohort" that pools every cohort the stage opened
MAX_CANDIDATE_PERCENT = 99.0  # at least 1 % of every judged cohort stays on stable as the concurrent control


class Guardrail(StrictModel):
    """One statistical contract: is the candidate worse than stable (or than a fixed `limit`) beyond `tolerance`?

    The verdict is `fail` when the (1 − α) confidence sequence shows the candidate worse by more than the
    tolerance, `pass` when it shows it within the tolerance, otherwise `continue`; at the stage's maximum
    exposure a question still open is inconclusive and `on_inconclusive` says what that means.
    """

    metric: Metric
    bad: Direction = Field(description="the direction in which the candidate's value is worse")
    tolerance: float = Field(
        ge=0, description="how much worse than stable is still acceptable (share, or relative shift)"
    )
    demo_tolerance: float | None = Field(
        None,
        ge=0,
        description="the tolerance under the demo profile, whose stages last seconds (unset: `tolerance`)",
    )
    limit: float | None = Field(
        None, ge=0, le=1, description="compare the candidate's share with this level instead of with stable"
    )
    demo_limit: float | None = Field(None, ge=0, le=1, description="the level under the demo profile (unset: `limit`)")
    alpha: float | None = Field(
        None, gt=0, le=MAX_ALPHA, description="this contract's false-fail rate; unset: its share of the plan's budget"
    )
    min_samples: int = Field(200, ge=20, description="per arm, before a verdict may be reached")
    min_users: int = Field(
        10,
        ge=2,
        description="effective users per arm (Kish, weighting each by their requests) before a comparison with "
        "stable may decide: a variance clustered by user needs enough users, not only enough requests",
    )
    on_inconclusive: StageOnInconclusive = "pause"
    cohorts: tuple[str, ...] = Field(default=(), description="empty: the stage's judged cohorts")
    quantile: float = Field(0.99, gt=0.5, lt=1, description="latency_tail: stable's quantile the tail starts at")
    profiles: tuple[Profile, ...] = Field(
        default=("production", "demo"), min_length=1, description="the profiles this contract is judged under"
    )

    @model_validator(mode="after")
    def _check(self) -> Guardrail:
        for name in ("tolerance", "demo_tolerance"):
            value = getattr(self, name)
            if value is None:
                continue
            if self.metric in SHARES and value > 1:
                raise ValueError(f"{name} of a share ({self.metric}) must be within [0, 1], got {value}")
            if self.metric in RELATIVE and not 0 < value <= 10:
                raise ValueError(f"{name} of a relative shift ({self.metric}) must be in (0, 10], got {value}")
        if self.demo_limit is not None and self.limit is None:
            raise ValueError("demo_limit needs a limit (it is the limit under the demo profile)")
        if self.limit is not None and self.metric not in SHARES:
            raise ValueError(f"limit applies to shares ({', '.join(SHARES)}), not to {self.metric}")
        if self.metric == "latency_tail" and (self.bad != "higher" or self.limit is not None):
            raise ValueError("latency_tail compares with stable's own tail: use bad: higher and no limit")
        if self.limit is not None and self.bad != "higher":
            raise ValueError("a limit is a ceiling: use bad: higher")
        return self

    def under(self, profile: Profile) -> Guardrail:
        """This contract with the tolerance of `profile` (the demo's shorter stages may declare a looser one)."""
        if profile != "demo":
            return self
        update: dict[str, float | None] = {"demo_tolerance": None, "demo_limit": None}
        if self.demo_tolerance is not None:
            update["tolerance"] = self.demo_tolerance
        if self.demo_limit is not None:
            update["limit"] = self.demo_limit
        return self.model_copy(update=update)

    @property
    def exact(self) -> bool:
        """A zero limit: one event proves the rate above zero, no statistics and no α."""
        return self.limit == 0 and self.tolerance == 0

    @property
    def log_tolerance(self) -> float:
        """The tolerance on the scale the band is computed on (log for relative shifts)."""
        return math.log1p(self.tolerance) if self.metric in RELATIVE else self.tolerance

    def describe(self) -> str:
        """One phrase for alerts and the report, e.g. 'latency +10 % vs stable at α=0.01'."""
        at = "exact" if self.exact else (f"at α={self.alpha:.2g}" if self.alpha else "at α from the budget")
        if self.limit is not None:
            return f"{self.metric} ≤ {self.limit:g} {at}"
        if self.metric == "latency_tail":
            q = f"p{self.quantile * 100:g}"
            return f"share slower than stable's {q} +{self.tolerance * 100:g} pp vs stable {at}"
        amount = f"{self.tolerance:.0%}" if self.metric in RELATIVE else f"{self.tolerance * 100:g} pp"
        sign = {"higher": "+", "lower": "−", "either": "±"}[self.bad]
        return f"{self.metric} {sign}{amount} vs stable {at}"


class Stage(StrictModel):
    """One stage: the candidate's share per cohort (the rest is the control), its exposure bounds, guardrails."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,39}$")
    candidate_percent: dict[str, float] = Field(min_length=1)
    judge: tuple[str, ...] = Field(
        default=(), description="cohorts judged ('*' = all non-excluded traffic pooled); default: those opened"
    )
    min_exposure_s: dict[Profile, float] = Field(description="no pass before this long (a fail acts at once)")
    max_exposure_s: dict[Profile, float] = Field(description="at this age a still-open question is inconclusive")
    check_every_s: dict[Profile, float] = Field(
        default_factory=lambda: {"production": 300.0, "demo": 3.0},  # type: ignore[arg-type]
        description="how long the DAG defers between two analysis ticks",
    )
    guardrails: tuple[Guardrail, ...] = Field(min_length=1)
    on_breach: Action = "rollback_all"
    diagnose: bool = False

    @model_validator(mode="after")
    def _check(self) -> Stage:
        no_control = {c: p for c, p in self.candidate_percent.items() if p > MAX_CANDIDATE_PERCENT}
        if no_control:
            raise ValueError(
                f"candidate_percent {no_control} leaves no concurrent control slice on stable: at most "
                f"{MAX_CANDIDATE_PERCENT:g} (the rest of the cohort is what the candidate is compared with)"
            )
        bad = {c: p for c, p in self.candidate_percent.items() if p <= 0}
        if bad:
            raise ValueError(f"candidate_percent must be above 0, got {bad}")
        for field in ("min_exposure_s", "max_exposure_s", "check_every_s"):
            spans = getattr(self, field)
            if set(spans) != {"production", "demo"} or min(spans.values()) <= 0:
                raise ValueError(f"{field} needs positive 'production' and 'demo' seconds")
        longer = [p for p in ("production", "demo") if self.max_exposure_s[p] < self.min_exposure_s[p]]
        if longer:
            raise ValueError(f"max_exposure_s is shorter than min_exposure_s for {longer}")
        return self

    def share(self, cohort: str) -> float:
        """The candidate's percentage of `cohort` in this stage ('*' gives the default for unnamed cohorts)."""
        return self.candidate_percent.get(cohort, self.candidate_percent.get(ALL, 0.0))

    @property
    def judged(self) -> tuple[str, ...]:
        """The cohorts this stage's guardrails judge by default."""
        return self.judge or tuple(self.candidate_percent)


class ShadowSpec(StrictModel):
    """The shadow gate: the same requests through candidate and stable on Triton, before any real traffic.

    Agreement (ETA disagreement, per-cohort shifts), latency (geometric mean and tail), and the served quality on the
    replayed orders' actual ETAs (MAE, P90 error, confidence calibration, per-cohort low-confidence shares).
    """

    samples: int = Field(1000, ge=50, description="orders replayed through both versions")
    max_relative_diff: float = Field(0.15, gt=0, description="a row disagrees when |Δeta| / stable eta is above this")
    max_disagreement_share: float = Field(0.10, ge=0, le=1)
    # The shadow tests' α: each spends its own share of the plan's budget (one per cohort for the per-cohort tests).
    latency_tolerance: float = Field(
        0.10, gt=0, le=10, description="the candidate may be this much slower (relative) than stable"
    )
    latency_alpha: float = Field(0.001, gt=0, le=MAX_ALPHA, description="α of the mean test, and of the tail test")
    latency_tail_quantile: float = Field(
        0.95,
        gt=0.5,
        lt=1,
        description="the tail starts at stable's quantile (× 1 + latency_tolerance for candidate calls)",
    )
    latency_tail_tolerance: float = Field(
        0.05, gt=0, le=1, description="the candidate's share beyond it may exceed stable's by this much (absolute)"
    )
    latency_min_pairs: int = Field(100, ge=20, description="interleaved call pairs before a latency verdict")
    latency_max_pairs: int = Field(2000, ge=20, description="at most this many pairs; then inconclusive")
    latency_on_inconclusive: OnInconclusive = "pause"
    shift_tolerance: float = Field(
        0.05, gt=0, le=10, description="per cohort, on the same orders: the mean ETA ratio may move this much"
    )
    shift_alpha: float = Field(0.001, gt=0, le=MAX_ALPHA)
    # Served quality: the replayed orders' actual ETAs are known, so both versions' served answers are scored
    # against them on the same orders (see mlrelease.verdicts.served_quality).
    quality_alpha: float = Field(0.001, gt=0, le=MAX_ALPHA, description="false-verdict rate of the quality contracts")
    quality_mae_tolerance: float = Field(
        0.05, gt=0, le=1, description="the candidate's served MAE may be this much (relative) above the champion's"
    )
    quality_p90_tolerance: float = Field(
        0.10, gt=0, le=1, description="the candidate's P90 absolute error may be this much (relative) above"
    )
    quality_on_inconclusive: OnInconclusive = Field(
        "accept", description="MAE or P90 neither shown worse nor shown within: train judged both on the holdout"
    )
    quality_min_confidence_ratio: float = Field(
        1.2, ge=1, le=10, description="fail when the least/most confident fifth error ratio is shown below this"
    )
    quality_low_confidence_tolerance: float = Field(
        0.05, gt=0, le=1, description="per cohort, the low-confidence share may move this much (absolute) either way"
    )
    quality_bootstrap: int = Field(
        10_000, ge=200, le=50_000, description="paired bootstrap resamples behind the P90 and calibration bands"
    )

    @model_validator(mode="after")
    def _check(self) -> ShadowSpec:
        if self.latency_max_pairs < self.latency_min_pairs:
            raise ValueError("latency_max_pairs must be at least latency_min_pairs")
        if self.quality_bootstrap * self.quality_alpha / 2 < 5:
            # a percentile band's ends at α/2 and 1 − α/2 need a few resamples beyond each, or they are noise
            raise ValueError(
                f"quality_bootstrap {self.quality_bootstrap} is too few for quality_alpha {self.quality_alpha:g}: "
                f"need at least {math.ceil(10 / self.quality_alpha)}"
            )
        return self


class Budget(StrictModel):
    """The whole rollout's error budget: the chance that a candidate as good as stable is stopped.

    The engine splits `false_rollback` (Bonferroni: the chances add up) across every test that can stop such a
    candidate: the shadow gate's tests at their declared α, the gateway's fast guard (`fast_guard`: its per-replica
    `false_trip_rate` times the replicas), and every stage contract that may fail it (each contract × judged cohort
    × stage gets an equal share of what is left, unless it declares its own α). A zero limit spends nothing (one
    event is proof). The split is stored with the rollout record and shown with each verdict.
    """

    false_rollback: float = Field(0.02, gt=0, le=MAX_ALPHA, description="chance a good candidate is stopped at all")
    fast_guard: float = Field(
        0.0005, ge=0, le=MAX_ALPHA, description="the gateway's guards: false_trip_rate × replicas (gateway.yaml)"
    )


class ExpectedTraffic(StrictModel):
    """What the power check assumes about one profile's traffic (see `mlrelease.rollout.power`)."""

    requests_per_s: dict[str, float] = Field(min_length=1, description="per cohort, at the quiet hour of a stage")
    error_rate: float = Field(1e-4, ge=0, lt=1, description="stable's hard failures per request")
    low_confidence_share: float = Field(0.05, ge=0, lt=1, description="stable's share of low-confidence answers")
    log_latency_sd: float = Field(0.35, gt=0, description="per request, once each user's own history is out")
    log_eta_sd: float = Field(0.10, gt=0, description="of a request's log ETA, once each user's history is out")
    log_confidence_sd: float = Field(0.10, gt=0, description="of a request's log confidence, likewise")
    distinct_share: float = Field(
        0.9, gt=0, le=1, description="share of requests that are distinct (answer contracts count each once)"
    )
    design_effect: float = Field(
        2.0, ge=1, description="variance inflation from heavy users that their own history does not explain"
    )

    @model_validator(mode="after")
    def _check(self) -> ExpectedTraffic:
        bad = {c: r for c, r in self.requests_per_s.items() if r <= 0}
        if bad:
            raise ValueError(f"requests_per_s must be above 0, got {bad}")
        return self


ApprovalChoice = Literal["promote", "rollback", "extend"]


class Approval(StrictModel):
    """How a human answers a paused rollout inside the nightly run (the DAG's `approve_N` task after each stage).

    A stage that pauses (inconclusive at its maximum exposure, a breach with `on_breach: pause`, a cohort held back
    at the last stage) asks: promote (past this stage: the next stage, or champion after the last), roll back, or
    extend the stage by another maximum exposure (the bands are anytime-valid: looking longer costs no α). An
    unanswered question takes `default` after `timeout_s`. `confirm_promotion` asks even when the last stage passed.
    """

    timeout_s: dict[Profile, float] = Field(
        default_factory=lambda: {"production": 14400.0, "demo": 600.0},  # type: ignore[arg-type]
        description="how long the question waits for an answer before `default` is taken",
    )
    default: Literal["rollback", "extend"] = Field(
        "rollback", description="the answer when nobody answers in time (never promote: no promotion goes unseen)"
    )
    confirm_promotion: bool = Field(False, description="ask before promoting, even when every stage passed")
    assigned_users: tuple[str, ...] = Field(
        default=(), description="Airflow user ids allowed to answer (empty: anyone who may edit the DAG's runs)"
    )

    @model_validator(mode="after")
    def _check(self) -> Approval:
        if set(self.timeout_s) != {"production", "demo"} or min(self.timeout_s.values()) <= 0:
            raise ValueError("timeout_s needs positive 'production' and 'demo' seconds")
        return self


class RolloutPlan(StrictModel):
    """The shadow gate and the ordered stages; the last stage decides promotion."""

    budget: Budget = Budget()
    shadow: ShadowSpec = ShadowSpec()
    stages: tuple[Stage, ...] = Field(min_length=1)
    keep_previous_s: dict[Profile, float] = Field(
        default_factory=lambda: {"production": 86400.0, "demo": 10.0},  # type: ignore[arg-type]
        description="how long the previous champion stays loaded after a promotion, for instant rollback",
    )
    max_gap_s: dict[Profile, float] = Field(
        default_factory=lambda: {"production": 30.0, "demo": 5.0},  # type: ignore[arg-type]
        description="a stage window with no model call for longer than this contains an outage: it cannot pass",
    )
    traffic: dict[Profile, ExpectedTraffic] = Field(
        default_factory=dict,
        description="the traffic each profile expects: every stage contract must be able to reach a verdict in it",
    )
    baseline_s: dict[Profile, float] = Field(
        default_factory=lambda: {"production": 7200.0, "demo": 60.0},  # type: ignore[arg-type]
        description="each user's traffic this long before the rollout started is their covariate (CUPED); 0: none",
    )
    approval: Approval = Field(default_factory=Approval, description="a human's answer to a paused rollout")

    @model_validator(mode="before")
    @classmethod
    def _drop_extensions(cls, raw: object) -> object:
        # Top-level `x-…` keys hold YAML anchors shared by the stages (as in Compose files); nothing else.
        if isinstance(raw, dict):
            return {k: v for k, v in raw.items() if not str(k).startswith("x-")}
        return raw

    @model_validator(mode="after")
    def _check(self) -> RolloutPlan:
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"stage names must be unique, got {names}")
        if set(self.max_gap_s) != {"production", "demo"} or min(self.max_gap_s.values()) <= 0:
            raise ValueError("max_gap_s needs positive 'production' and 'demo' seconds")
        if set(self.baseline_s) != {"production", "demo"} or min(self.baseline_s.values()) < 0:
            raise ValueError("baseline_s needs 'production' and 'demo' seconds (0 or more)")
        if self.traffic:
            self._check_power()
        return self

    def _check_power(self) -> None:
        """Refuse a plan with a contract that cannot reach a verdict at its declared traffic (one line each)."""
        cohorts = {tuple(t.requests_per_s) for t in self.traffic.values()}
        if len(cohorts) > 1:
            raise ValueError(f"traffic names different cohorts per profile: {sorted(cohorts)}")
        known = cohorts.pop()
        try:
            self._refuse_underpowered(known)
        except StepError as refused:  # a plan that cannot be allocated or resolved is a validation error here
            raise ValueError(str(refused)) from None

    def _refuse_underpowered(self, known: tuple[str, ...]) -> None:
        """The power check proper: every cohort declared, every contract resolvable under every declared profile."""
        from mlrelease.rollout.power import underpowered  # the power module reads this one

        missing = self.unknown_cohorts(known)
        if missing:
            raise ValueError(f"traffic.*.requests_per_s does not declare cohort(s) {missing} that the stages name")
        unset = any(g.alpha is None and not g.exact for s in self.stages for g in s.guardrails)
        plan = self.allocated(known) if unset else self  # a stored plan was allocated when its rollout began
        lines = [line for profile in self.traffic for line in underpowered(plan, profile)]
        if lines:
            raise ValueError("contracts that would only ever be inconclusive:\n" + "\n".join(lines))

    def stage(self, number: int) -> Stage:
        """Stage `number`, counted from 1 as everywhere a stage is numbered (records, events, steps, screens)."""
        if not 1 <= number <= len(self.stages):
            raise IndexError(f"stage {number} is not in the plan (it has {len(self.stages)} stages, from 1)")
        return self.stages[number - 1]

    def unknown_cohorts(self, known: tuple[str, ...]) -> list[str]:
        """The cohorts the plan names (shares, judged cohorts, contracts) that are not in `known` ('*' is always)."""
        named = {c for s in self.stages for c in (*s.candidate_percent, *s.judge)} | {
            c for s in self.stages for g in s.guardrails for c in g.cohorts
        }
        return sorted(named - {*known, ALL})

    def check_cohorts(self, known: tuple[str, ...]) -> None:
        """Refuse a plan naming cohorts the gateway does not define ('*' means all of them)."""
        unknown = self.unknown_cohorts(known)
        if unknown:
            raise StepError(f"rollout plan names unknown cohort(s) {unknown}; the gateway defines {list(known)}")

    def check_task(self, task: str) -> None:
        """Refuse a plan judging a model by a metric that means nothing for its task (e.g. a classifier's ETA)."""
        if task == "regression":
            return
        wrong = sorted({g.metric for s in self.stages for g in s.guardrails} & set(REGRESSION_ONLY))
        if wrong:
            meanings = "; ".join(f"{m} is {REGRESSION_ONLY[m]}" for m in wrong)
            raise StepError(f"rollout plan judges a {task} model by {', '.join(wrong)}: {meanings} (regression only)")

    def shadow_spend(self, cohorts: int) -> float:
        """What the shadow gate's tests spend of the budget with `cohorts` cohorts (its per-cohort tests add up)."""
        spec = self.shadow
        return (
            spec.latency_alpha
            + spec.latency_alpha  # the tail test beside the mean
            + cohorts * spec.shift_alpha
            + (3 + cohorts) * spec.quality_alpha  # MAE, P90, calibration, and the low-confidence share per cohort
        )

    def allocated(self, known: tuple[str, ...]) -> RolloutPlan:
        """This plan with every stage contract's α drawn from the budget (see `Budget`), for the gateway's cohorts.

        Refused, naming the numbers, when the declared parts (shadow, fast guard, contracts with their own α) leave
        nothing for the rest.
        """
        self.check_cohorts(known)
        budget = self.budget
        shares = [
            (i, j, len(g.cohorts or s.judged))
            for i, s in enumerate(self.stages)
            for j, g in enumerate(s.guardrails)
            if not g.exact
        ]
        own = [(n, self.stages[i].guardrails[j].alpha) for i, j, n in shares]
        declared = sum(n * alpha for n, alpha in own if alpha is not None)
        spent = self.shadow_spend(len(known)) + budget.fast_guard + declared
        open_tests = sum(n for n, alpha in own if alpha is None)
        left = budget.false_rollback - spent
        if left <= 0 or (open_tests and left / open_tests < 1e-6):
            raise StepError(
                f"rollout plan budget false_rollback {budget.false_rollback:g} is spent before the stages: shadow "
                f"{self.shadow_spend(len(known)):g}, fast_guard {budget.fast_guard:g}, contracts with their own α "
                f"{declared:g}; raise the budget or lower those"
            )
        each = left / open_tests if open_tests else 0.0
        stages = []
        for stage in self.stages:
            rails = tuple(
                g if g.alpha is not None or g.exact else g.model_copy(update={"alpha": each}) for g in stage.guardrails
            )
            stages.append(stage.model_copy(update={"guardrails": rails}))
        return self.model_copy(update={"stages": tuple(stages)})

    def under(self, profile: Profile) -> RolloutPlan:
        """This plan with every contract's tolerance for `profile` (what a rollout stores and judges with)."""
        stages = []
        for stage in self.stages:
            rails = tuple(g.under(profile) for g in stage.guardrails if profile in g.profiles)
            if not rails:
                raise StepError(f"rollout plan stage {stage.name} has no guardrail under the {profile} profile")
            stages.append(stage.model_copy(update={"guardrails": rails}))
        return self.model_copy(update={"stages": tuple(stages)})

    def spending(self, known: tuple[str, ...]) -> dict[str, float]:
        """How the budget is split (for the record, the report and the alert)."""
        alphas = [g.alpha for s in self.stages for g in s.guardrails for _ in (g.cohorts or s.judged) if g.alpha]
        return {
            "false_rollback": self.budget.false_rollback,
            "shadow": round(self.shadow_spend(len(known)), 6),
            "fast_guard": self.budget.fast_guard,
            "stage_contracts": round(sum(alphas), 6),
            "per_stage_contract": round(min(alphas), 8) if alphas else 0.0,
        }


def load_plan(path: Path | None = None) -> RolloutPlan:
    """Read and validate a plan YAML (default: the one the release spec of this process's model names)."""
    return load_yaml_model(Path(path or process_spec().rollout_plan_path), RolloutPlan, "rollout plan")
