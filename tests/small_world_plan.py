"""A rollout plan sized for the test worlds' traffic: a few thousand requests over seconds, ~60 distinct long-tail
orders (600 orders a day), about a thousandth of a production stage. The rollout integration tests and the live
e2e night roll candidates out under it (written to a YAML file and passed as the plan)."""

from __future__ import annotations

SPAN = {"production": 3600, "demo": 2.5}  # no pass before 2.5 s: a killed analysis is caught mid-stage
MAX = {"production": 7200, "demo": 20}
EVERY = {"production": 300, "demo": 0.5}
# Nothing passes without evidence: with no error among a few hundred requests per arm the band shows the error rate
# within 2 pp of stable's (this world's stages hold about a thousandth of a production stage's requests).
ERRORS_RATE = {
    "metric": "error_rate",
    "bad": "higher",
    "tolerance": 0.02,
    "min_samples": 40,
    "min_users": 2,  # this world's high-value cohort holds ~8 users per arm (the shipped plan asks for 10 effective)
}
NAN_RATE = {
    "metric": "nan_rate",
    "bad": "higher",
    "tolerance": 0.0,
    "limit": 0.0,
    "min_samples": 40,
}
# One 2-core machine runs Triton, the gateway, the traffic and the tests (and, under `make test`, another test
# file beside them): the tolerance is wide (+50 %), and the slow candidate (~400x the model's time per call,
# several times the whole request's) is far beyond it. Wider is also faster: a healthy candidate's pass is shown
# with about a third of the samples +30 % needed (the sample size goes with 1/tolerance²).
LATENCY = {
    "metric": "latency",
    "bad": "higher",
    "tolerance": 0.5,
    "cohorts": ["*"],
    "min_samples": 40,
    "min_users": 2,
}
LONG_TAIL_RULE = {
    "metric": "low_confidence_share",
    "bad": "higher",
    "tolerance": 0.0,
    # The drill halves every remote answer's confidence: ~35 % of the long tail's distinct answers, its band's lower
    # end ~25 %, above the shipped 15 % level. A good model's ~4 % has an upper end of ~26 % over this world's ~60
    # distinct long-tail orders (clustered by their few users): no evidence of being below 15 % exists here, so the
    # good candidate's rollout states the level it can show (GOOD_PLAN below).
    "limit": 0.15,
    "cohorts": ["long_tail"],
    "min_samples": 20,  # distinct long-tail requests: the test's traffic repeats ~60 of them
}
PLAN = {
    # This world's traffic is a few thousand requests with ~60 distinct long-tail orders, about a thousandth of a
    # production stage: at the shipped budget (0.02 for the whole rollout) its bands could not decide a drill, so it
    # states the largest budget a plan may (7 stage contracts share ~0.19: ~0.027 each).
    "budget": {"false_rollback": 0.2},
    # 400 interleaved pairs resolve the tail's share difference to about ±7 pp: its tolerance here is 15 pp
    "shadow": {
        "samples": 400,
        "latency_tolerance": 0.5,
        "latency_tail_tolerance": 0.15,
        "latency_min_pairs": 50,
        "latency_max_pairs": 400,
    },
    "keep_previous_s": {"production": 86400, "demo": 1},
    "stages": [
        {
            "name": "high_value",
            "candidate_percent": {"high_value": 50},
            "min_exposure_s": SPAN,
            # the latency contract needs several seconds of this test's high-value traffic to show a pass, and its
            # band is clustered by user: ~8 high-value users per arm here, so a slow candidate's fail can take ~1 min
            "max_exposure_s": {"production": 7200, "demo": 90},
            "check_every_s": EVERY,
            "on_breach": "rollback_all",
            # No pooled low-confidence share here: it counts distinct requests, and this traffic holds ~16 distinct
            # high-value orders (600 orders a day, 5 h of them within the features' freshness budget), ~8 per arm,
            # below the 20 the plan requires at least. Such a contract is never asked: it only held every first
            # stage open to its maximum. The long tail's fixed-level rule below is asked, and the low-confidence
            # drill is caught by it.
            "guardrails": [ERRORS_RATE, NAN_RATE, LATENCY],
        },
        {
            "name": "long_tail",
            # users are bucketed by a hash of their id, and only a handful of the test traffic's orders hit the
            # NaN and low-confidence faults: 99 % puts their users on the candidate (1 % control slice)
            "candidate_percent": {"high_value": 50, "long_tail": 99},
            "min_exposure_s": {"production": 3600, "demo": 6},
            "max_exposure_s": MAX,
            "check_every_s": EVERY,
            "on_breach": "rollback_cohort",
            "diagnose": True,
            # the long tail's 1 % control slice (~40 requests) cannot show an error rate within 2 pp: compared with
            # stable on high value only (the long tail's failures meet the fast guard, then the last stage's pool)
            "guardrails": [LONG_TAIL_RULE, {**ERRORS_RATE, "cohorts": ["high_value"]}, NAN_RATE],
        },
        {
            "name": "everyone",
            "candidate_percent": {"*": 80},
            "judge": ["*"],
            "min_exposure_s": SPAN,
            "max_exposure_s": MAX,
            "check_every_s": EVERY,
            "on_breach": "rollback_all",
            "guardrails": [ERRORS_RATE, NAN_RATE, LATENCY],
        },
    ],
}


# The good candidate's plan: the same, with the long tail's level at 30 % (what ~60 distinct orders can show).
GOOD_PLAN = {
    **PLAN,
    "stages": [
        PLAN["stages"][0],
        {**PLAN["stages"][1], "guardrails": [{**LONG_TAIL_RULE, "limit": 0.3}, *PLAN["stages"][1]["guardrails"][1:]]},
        PLAN["stages"][2],
    ],
}
