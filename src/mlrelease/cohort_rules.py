"""Cohorts as rules over request attributes: the schema a model's release spec declares its cohorts with.

Rules are checked in order, the first match names the cohort, and the last rule (no conditions) catches the rest;
`bucket_key` is the request attribute the canary percentages hash, so one user stays on one version. Which fields a
rule may use is the spec's business (its entity keys and input columns): `ReleaseSpec` checks that.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from mlrelease.yamlconfig import StrictModel

Op = Literal["eq", "ne", "in", "not_in", "gt", "ge", "lt", "le"]


class Condition(StrictModel):
    """One test of a request attribute, e.g. `{field: tier, op: eq, value: premium}`."""

    field: str = Field(min_length=1)
    op: Op
    value: Any

    @model_validator(mode="after")
    def _check(self) -> Condition:
        if self.op in ("in", "not_in") and not isinstance(self.value, list | tuple):
            raise ValueError(f"op {self.op!r} needs a list value, got {self.value!r}")
        numeric = isinstance(self.value, int | float) and not isinstance(self.value, bool)
        if self.op in ("gt", "ge", "lt", "le") and not numeric:
            raise ValueError(f"op {self.op!r} needs a number, got {self.value!r}")
        return self


class CohortRule(StrictModel):
    """A cohort and the conditions that put a request in it (any one suffices; none means catch-all)."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,39}$")
    any_of: tuple[Condition, ...] = ()


class CohortConfig(StrictModel):
    """Ordered cohort rules (first match wins; the last is the catch-all) and the canary bucket key."""

    rules: tuple[CohortRule, ...] = Field(min_length=1)
    bucket_key: str = Field(min_length=1, description="the request attribute canary percentages hash (sticky users)")

    @model_validator(mode="after")
    def _check(self) -> CohortConfig:
        names = [r.name for r in self.rules]
        if len(set(names)) != len(names):
            raise ValueError(f"cohort names must be unique, got {names}")
        catch_all = [r.name for r in self.rules if not r.any_of]
        if catch_all != [self.rules[-1].name]:
            raise ValueError(
                f"exactly one rule, the last, must have no conditions (the catch-all); rules without: {catch_all}"
            )
        return self

    @property
    def names(self) -> tuple[str, ...]:
        """Cohort names in rule order."""
        return tuple(r.name for r in self.rules)

    def fields(self) -> set[str]:
        """Every attribute a rule looks at."""
        return {c.field for r in self.rules for c in r.any_of}
