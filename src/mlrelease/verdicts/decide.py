"""From a confidence band to a verdict: fail, pass (non-inferiority) or continue, for one direction of harm.

The band is on candidate − reference, oriented as the metric is measured; `bad` says which way is worse.
- fail: the whole band lies beyond the tolerance in the bad direction (worse by more than it, at 1 − α);
- pass: the whole band lies within the tolerance (no worse than it, at 1 − α);
- continue: the band still straddles the tolerance: look again later.
Because the band is a confidence sequence, this may be asked after every observation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from enum import StrEnum

from mlrelease.verdicts.sequential import Band


class Verdict(StrEnum):
    """The outcome of one contract, or of many combined (ordered by SEVERITY)."""

    PASS = "pass"
    CONTINUE = "continue"
    INCONCLUSIVE = "inconclusive"
    FAIL = "fail"


SEVERITY: dict[Verdict, int] = {Verdict.PASS: 0, Verdict.CONTINUE: 1, Verdict.INCONCLUSIVE: 2, Verdict.FAIL: 3}
# What a question still open at the end becomes, by the plan's `on_inconclusive`.
ON_INCONCLUSIVE: dict[str, Verdict] = {"accept": Verdict.PASS, "pause": Verdict.INCONCLUSIVE, "rollback": Verdict.FAIL}


def worst(verdicts: Iterable[Verdict]) -> Verdict:
    """The most severe verdict of an iterable of verdicts (pass when there are none)."""
    return max(verdicts, key=SEVERITY.__getitem__, default=Verdict.PASS)


def decide(band: Band, bad: str, tolerance: float) -> Verdict:
    """The verdict a band gives on 'worse than the reference by more than `tolerance` in direction `bad`'."""
    if math.isnan(band.estimate):
        return Verdict.CONTINUE
    if bad == "higher":
        worse_low, worse_high = band.lower, band.upper
    elif bad == "lower":
        worse_low, worse_high = -band.upper, -band.lower
    else:  # either direction is harm: the band must sit inside ±tolerance to pass
        if band.lower > tolerance or band.upper < -tolerance:
            return Verdict.FAIL
        return Verdict.PASS if -tolerance <= band.lower and band.upper <= tolerance else Verdict.CONTINUE
    if worse_low > tolerance:
        return Verdict.FAIL
    return Verdict.PASS if worse_high <= tolerance else Verdict.CONTINUE
