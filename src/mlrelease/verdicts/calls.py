"""The vocabulary of one model call, shared by what records calls (the gateway) and what judges them (the rollout).

Outcome codes as the gateway records them (by name) and the simulator generates them (by code), the latency bounds
the tail contract counts calls above, and the reference low-confidence threshold.
"""

from __future__ import annotations

import numpy as np

# Latency bounds (seconds) at which the tail contract counts calls above: Prometheus-style buckets from 1 ms to 10 s,
# about 26 % apart, so a p99 is located in them to within a bucket.
LATENCY_BOUNDS_S = np.round(np.geomspace(0.001, 10.0, 41), 6)
LOW_CONFIDENCE = 0.6  # the reference "low confidence" threshold (mlrelease.model.estimator.LOW_CONFIDENCE)

# Outcome codes of a call, as the gateway records them (by name) and the simulator generates them (by code).
OK, ERROR, TIMEOUT, NAN, OUT_OF_RANGE, UNAVAILABLE = 0, 1, 2, 3, 4, 5
OUTCOME_CODES = {
    "ok": OK,
    "error": ERROR,
    "timeout": TIMEOUT,
    "nan": NAN,
    "out_of_range": OUT_OF_RANGE,
    "unavailable": UNAVAILABLE,
}
HARD_FAILURES = (ERROR, TIMEOUT, OUT_OF_RANGE)  # the call failed or answered outside the declared range
# The call itself failed, or was not made because stable's breaker rested it: evidence about serving, not the answer.
# `unavailable` is no model call: stable's breaker rested it and the rule answered. Its record tells the outage finder
# that serving was down for stable-assigned users (`mlrelease.rollout.outage`); no contract reads it.
SERVING_FAILURES = (ERROR, TIMEOUT, UNAVAILABLE)
