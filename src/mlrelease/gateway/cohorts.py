"""Value-density cohorts: ordered rules over request and feature attributes, and a stable canary bucket."""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Callable, Mapping
from typing import Any

from mlrelease.cohort_rules import CohortConfig, Condition

BUCKETS = 10_000  # canary percentages resolve to 0.01 %

_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "eq": operator.eq,
    "ne": operator.ne,
    "gt": operator.gt,
    "ge": operator.ge,
    "lt": operator.lt,
    "le": operator.le,
    "in": lambda a, b: a in b,
    "not_in": lambda a, b: a not in b,
}


def matches(condition: Condition, attributes: Mapping[str, Any]) -> bool:
    """Whether one condition holds; a missing attribute or an uncomparable value never matches."""
    value = attributes.get(condition.field)
    if value is None:
        return False
    try:
        return bool(_COMPARE[condition.op](value, condition.value))
    except TypeError:
        return False


def assign_cohort(config: CohortConfig, attributes: Mapping[str, Any]) -> str:
    """The first cohort whose rule matches (the last rule matches everything)."""
    for rule in config.rules:
        if not rule.any_of or any(matches(c, attributes) for c in rule.any_of):
            return rule.name
    raise AssertionError("the catch-all rule is validated to exist")  # pragma: no cover


def bucket(key: object) -> int:
    """A stable bucket in [0, BUCKETS) for an id: the same id lands in the same bucket on every replica."""
    digest = hashlib.blake2b(str(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % BUCKETS
