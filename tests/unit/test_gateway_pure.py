"""The gateway's pure parts: cohorts, routing choice, breaker, output guard, fallback rule, auth, parsing helpers."""

from __future__ import annotations

import hashlib
import math
import stat
from collections import Counter
from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from mlrelease.cohort_rules import CohortConfig
from mlrelease.errors import StepError
from mlrelease.gateway import traffic
from mlrelease.gateway.auth import (
    Authenticator,
    KeysFile,
    TokenBucket,
    add_client,
    hash_key,
    read_keys,
)
from mlrelease.gateway.cli import parse_percents
from mlrelease.gateway.cohorts import BUCKETS, assign_cohort, bucket
from mlrelease.gateway.config import DEFAULT_CONFIG, RateLimit, load_config
from mlrelease.gateway.fallback import eta_rule
from mlrelease.gateway.guard import BreakerState, CircuitBreaker, output_problem
from mlrelease.gateway.routing_state import GuardTrip, RoutingState, choose
from mlrelease.model.features import FEATURES, encode, encode_row

COHORT_NAMES = ("high_value", "long_tail", "core")


class FakeClock:
    """A settable monotonic clock."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def cohorts() -> CohortConfig:
    return load_config(DEFAULT_CONFIG).cohorts


# --- cohorts -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attributes", "expected"),
    [
        ({"tier": "premium", "is_remote": True, "is_bulky": True}, "high_value"),  # first match wins
        ({"tier": "standard", "declared_value": 1000.0, "is_remote": True}, "high_value"),  # ge boundary
        ({"tier": "standard", "declared_value": 999.99, "is_remote": True}, "long_tail"),
        ({"tier": "plus", "is_bulky": True}, "long_tail"),
        ({"tier": "plus", "category": "perishables"}, "long_tail"),
        ({"tier": "plus", "category": "documents", "declared_value": 50, "is_remote": False}, "core"),
        ({}, "core"),
    ],
)
def test_assign_cohort_first_match_wins(cohorts, attributes, expected):
    assert assign_cohort(cohorts, attributes) == expected


def test_missing_attributes_never_match_even_for_negative_ops():
    config = CohortConfig.model_validate(
        {
            "bucket_key": "user_id",
            "rules": [
                {"name": "not_premium", "any_of": [{"field": "tier", "op": "ne", "value": "premium"}]},
                {"name": "not_furniture", "any_of": [{"field": "category", "op": "not_in", "value": ["furniture"]}]},
                {"name": "rest"},
            ],
        }
    )
    assert assign_cohort(config, {}) == "rest"
    assert assign_cohort(config, {"tier": None, "category": None}) == "rest"
    assert assign_cohort(config, {"tier": "plus"}) == "not_premium"
    assert assign_cohort(config, {"tier": "premium", "category": "home"}) == "not_furniture"


def test_uncomparable_types_do_not_raise_and_do_not_match(cohorts):
    # "lots" >= 1000 raises TypeError in Python; the rule must simply not match.
    assert assign_cohort(cohorts, {"tier": "standard", "declared_value": "lots"}) == "core"
    # a list compared with the membership list and an object ordered against a number: no error either
    assert assign_cohort(cohorts, {"category": ["furniture"], "declared_value": object()}) == "core"


def test_bucket_is_stable_and_in_range():
    ids = [0, 1, 42, 10**18, "user-7", -5]
    first = [bucket(i) for i in ids]
    assert first == [bucket(i) for i in ids]
    assert all(isinstance(b, int) and 0 <= b < BUCKETS for b in first)
    assert bucket(42) == bucket("42")  # the key is hashed as text: int and str ids agree across replicas
    assert len(set(first)) > 1


def test_bucket_is_roughly_uniform():
    n = 20_000
    deciles = Counter(bucket(user_id) * 10 // BUCKETS for user_id in range(1, n + 1))
    assert set(deciles) == set(range(10))
    shares = {d: count / n for d, count in deciles.items()}
    assert all(0.08 <= s <= 0.12 for s in shares.values()), shares


# --- routing state -----------------------------------------------------------------------------------------------


def _state(**fields) -> RoutingState:
    return RoutingState(model="parcel_eta", **({"stable_version": 1} | fields))


def _trip(version: int, reason: str = "nan") -> GuardTrip:
    return GuardTrip(version=version, reason=reason, at=datetime(2026, 11, 29, tzinfo=UTC), replica="r1")


def test_routing_state_refuses_candidate_equal_to_stable():
    with pytest.raises(ValidationError, match=r"candidate_version and stable_version are both 3"):
        _state(stable_version=3, candidate_version=3)


@pytest.mark.parametrize("percent", [-0.01, 100.01, 250])
def test_routing_state_refuses_percent_outside_0_100(percent):
    with pytest.raises(ValidationError, match=r"within 0\.\.100"):
        _state(candidate_version=2, candidate_percent={"core": percent})


def test_routing_state_accepts_percent_bounds():
    state = _state(candidate_version=2, candidate_percent={"core": 0, "high_value": 100})
    assert state.percent_for("core") == 0 and state.percent_for("high_value") == 100


def test_routing_state_refuses_percent_without_candidate():
    with pytest.raises(ValidationError, match=r"candidate_version is not set"):
        _state(candidate_percent={"core": 5})
    assert _state(candidate_percent={"core": 0}).candidate_version is None  # zero shares are harmless


def test_routing_state_refuses_extra_keys():
    with pytest.raises(ValidationError, match=r"extra"):
        RoutingState.model_validate({"model": "m", "stable_version": 1, "canary": 5})
    with pytest.raises(ValidationError):
        GuardTrip.model_validate({"version": 2, "reason": "x", "at": "2026-11-29T00:00:00Z", "replica": "r", "n": 1})


def test_choose_without_candidate_is_stable():
    state = _state(stable_version=4)
    assert choose(state, "core", 0, frozenset()) == (4, "stable")


def test_choose_percent_100_and_0():
    state = _state(candidate_version=2, candidate_percent={"high_value": 100, "core": 0})
    for b in (0, 5_000, BUCKETS - 1):
        assert choose(state, "high_value", b, frozenset()) == (2, "candidate")
        assert choose(state, "core", b, frozenset()) == (1, "stable")
        assert choose(state, "long_tail", b, frozenset()) == (1, "stable")  # unlisted, no "*": 0 %


def test_choose_star_default_applies_to_unlisted_cohorts_only():
    state = _state(candidate_version=2, candidate_percent={"*": 100, "core": 0})
    assert state.percent_for("long_tail") == 100
    assert choose(state, "long_tail", BUCKETS - 1, frozenset()) == (2, "candidate")
    assert choose(state, "high_value", 0, frozenset()) == (2, "candidate")
    assert choose(state, "core", 0, frozenset()) == (1, "stable")  # an explicit 0 beats "*"


def test_choose_tripped_candidate_goes_to_stable():
    state = _state(candidate_version=2, candidate_percent={"*": 100})
    assert choose(state, "core", 0, frozenset({2})) == (1, "stable")  # tripped on this replica
    assert choose(state, "core", 0, frozenset({7})) == (2, "candidate")  # another version tripped locally
    tripped = state.with_trip(_trip(2))
    assert tripped.is_tripped(2) and not state.is_tripped(2)
    assert choose(tripped, "core", 0, frozenset()) == (1, "stable")  # tripped on some replica, recorded
    other = state.with_trip(_trip(9))
    assert choose(other, "core", 0, frozenset()) == (2, "candidate")


@pytest.mark.parametrize(
    ("percent", "bucket_value", "expected"),
    [
        (5, 499, (2, "candidate")),
        (5, 500, (1, "stable")),
        (0.01, 0, (2, "candidate")),
        (0.01, 1, (1, "stable")),
        (50, 4_999, (2, "candidate")),
        (50, 5_000, (1, "stable")),
    ],
)
def test_choose_bucket_threshold_boundary(percent, bucket_value, expected):
    state = _state(candidate_version=2, candidate_percent={"core": percent})
    assert choose(state, "core", bucket_value, frozenset()) == expected


def test_choose_share_matches_percent_over_all_buckets():
    state = _state(candidate_version=2, candidate_percent={"core": 12.5})
    on_candidate = sum(choose(state, "core", b, frozenset())[1] == "candidate" for b in range(BUCKETS))
    assert on_candidate == 1_250


def test_with_trip_is_idempotent():
    state = _state(candidate_version=2)
    once = state.with_trip(_trip(2, "nan"))
    twice = once.with_trip(_trip(2, "timeout"))
    assert twice is once
    assert [t.reason for t in twice.guard_trips] == ["nan"]
    both = twice.with_trip(_trip(3))
    assert [t.version for t in both.guard_trips] == [2, 3]
    assert state.guard_trips == ()  # frozen: the original is untouched


# --- circuit breaker ---------------------------------------------------------------------------------------------


def _breaker(clock: FakeClock) -> CircuitBreaker:
    return CircuitBreaker(failures_to_trip=3, window_s=10.0, open_for_s=5.0, clock=clock)


def test_breaker_opens_after_n_failures_within_window():
    clock = FakeClock()
    breaker = _breaker(clock)
    assert breaker.allow() and breaker.state is BreakerState.CLOSED
    assert breaker.record_failure() is False
    clock.now = 1.0
    assert breaker.record_failure() is False
    assert breaker.state is BreakerState.CLOSED and breaker.allow()
    clock.now = 2.0
    assert breaker.record_failure() is True
    assert breaker.state is BreakerState.OPEN
    assert breaker.allow() is False
    assert breaker.record_failure() is False  # already open: not a new trip


def test_breaker_forgets_failures_older_than_window():
    clock = FakeClock()
    breaker = _breaker(clock)
    breaker.record_failure()  # t=0
    clock.now = 1.0
    breaker.record_failure()  # t=1
    clock.now = 10.5  # t=0 falls out of the window
    assert breaker.record_failure() is False
    assert breaker.state is BreakerState.CLOSED
    clock.now = 11.0  # 1, 10.5, 11 are within 10 s
    assert breaker.record_failure() is True
    assert breaker.state is BreakerState.OPEN


def test_breaker_spread_out_failures_never_open():
    clock = FakeClock()
    breaker = _breaker(clock)
    for i in range(20):
        clock.now = i * 6.0  # at most two failures in any 10 s
        assert breaker.record_failure() is False
    assert breaker.state is BreakerState.CLOSED


def test_breaker_rests_then_half_opens():
    clock = FakeClock(100.0)
    breaker = _breaker(clock)
    for _ in range(3):
        breaker.record_failure()
    assert breaker.state is BreakerState.OPEN
    clock.now = 104.999
    assert breaker.allow() is False
    assert breaker.state is BreakerState.OPEN
    clock.now = 105.0
    assert breaker.allow() is True
    assert breaker.state is BreakerState.HALF_OPEN


def test_breaker_success_in_half_open_closes_and_clears_failures():
    clock = FakeClock()
    breaker = _breaker(clock)
    for _ in range(3):
        breaker.record_failure()
    clock.now = 6.0
    assert breaker.allow()
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED
    assert breaker.record_failure() is False  # the count starts afresh
    assert breaker.record_failure() is False
    assert breaker.state is BreakerState.CLOSED


def test_breaker_failure_in_half_open_reopens():
    clock = FakeClock()
    breaker = _breaker(clock)
    for _ in range(3):
        breaker.record_failure()
    clock.now = 6.0
    assert breaker.allow() and breaker.state is BreakerState.HALF_OPEN
    assert breaker.record_failure() is True
    assert breaker.state is BreakerState.OPEN
    clock.now = 10.9  # the rest restarts from the probe's failure at t=6
    assert breaker.allow() is False
    clock.now = 11.0
    assert breaker.allow() is True


def test_breaker_success_while_closed_keeps_failure_count():
    clock = FakeClock()
    breaker = _breaker(clock)
    breaker.record_failure()
    breaker.record_failure()
    breaker.record_success()
    assert breaker.record_failure() is True  # successes do not forgive failures inside the window


def test_breaker_reset():
    clock = FakeClock()
    breaker = _breaker(clock)
    for _ in range(3):
        breaker.record_failure()
    assert breaker.allow() is False
    breaker.reset()
    assert breaker.state is BreakerState.CLOSED and breaker.allow() is True
    assert breaker.record_failure() is False
    assert breaker.record_failure() is False
    assert breaker.record_failure() is True


# --- output guard ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("eta", "confidence", "expected"),
    [
        (math.nan, 0.5, "nan"),
        (10.0, math.nan, "nan"),
        (math.inf, 0.5, "nan"),
        (-math.inf, 0.5, "nan"),
        (10.0, math.inf, "nan"),
        (-0.1, 0.5, "out_of_range"),
        (500.1, 0.5, "out_of_range"),
        (10.0, 1.01, "out_of_range"),
        (10.0, -0.01, "out_of_range"),
        (10.0, 0.5, None),
        (0.0, 0.0, None),
        (500.0, 1.0, None),
    ],
)
def test_output_problem(eta, confidence, expected):
    assert output_problem(eta, confidence, ((0.0, 500.0), (0.0, 1.0))) == expected


def test_the_valid_answers_are_the_release_specs():
    from mlrelease.gateway.guard import output_ranges
    from mlrelease.release_spec import load_specs

    specs = load_specs()
    assert output_ranges(specs["parcel_eta"]) == ((0.0, 500.0), (0.0, 1.0))
    assert output_ranges(specs["late_delivery"]) == ((0.0, 1.0), (0.0, 1.0))
    assert output_problem(2.0, 0.9, output_ranges(specs["late_delivery"])) == "out_of_range"  # a 0/1 decision
    assert output_problem(2.0, 0.9, output_ranges(specs["parcel_eta"])) is None  # two hours


# --- fallback rule -----------------------------------------------------------------------------------------------


def test_rule_eta_remote_bulky_vs_plain():
    # 8 + 110 km / 55 km/h * (1 + 0.8 * 0.5) + 20 remote + 6 bulky = 8 + 2 * 1.4 + 26 = 36.8
    remote_bulky = {"distance_km": 110.0, "congestion_index": 0.5, "is_remote": True, "is_bulky": True}
    assert eta_rule(remote_bulky) == pytest.approx(36.8)
    # 8 + 220 / 55 * (1 + 0) = 12
    plain = {"distance_km": 220.0, "congestion_index": 0.0, "is_remote": False, "is_bulky": False}
    assert eta_rule(plain) == pytest.approx(12.0)
    assert eta_rule(remote_bulky) - eta_rule({**remote_bulky, "is_remote": False}) == pytest.approx(20)


def test_rule_eta_missing_features_count_as_zero():
    assert eta_rule({}) == 8.0
    assert eta_rule({"distance_km": None, "congestion_index": None, "is_remote": None}) == 8.0
    custom = {"base_hours": 1, "km_per_hour": 100, "congestion_slowdown": 1, "remote_hours": 0, "bulky_hours": 2}
    # 1 + 50/100 * (1 + 1 * 1) + 2 = 4
    assert eta_rule({"distance_km": 50, "congestion_index": 1, "is_bulky": 1}, **custom) == pytest.approx(4.0)


def test_each_models_fallback_answers_in_its_own_outputs():
    from mlrelease.release_spec import load_specs

    specs = load_specs()
    remote = {"distance_km": 110.0, "congestion_index": 0.5, "is_remote": True, "is_bulky": True}
    # the parcel spec names the rule with the network's terms, and a low confidence
    assert specs["parcel_eta"].fallback_answer()(remote) == {"eta_prediction": 36.8, "confidence_score": 0.3}
    assert specs["late_delivery"].fallback_answer()(remote) == {"is_late": 0.0, "late_probability": 0.24}


# --- auth --------------------------------------------------------------------------------------------------------


def test_hash_key():
    assert hash_key("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert hash_key("secret") == hashlib.sha256(b"secret").hexdigest()
    assert hash_key("a") != hash_key("b")


def test_add_client_and_read_keys_round_trip(tmp_path):
    path = tmp_path / "gw" / "api_keys.yaml"
    assert read_keys(path).clients == []  # a missing file is an empty one
    key_a = add_client(path, "alice")
    key_b = add_client(path, "bob", RateLimit(per_second=5, burst=10))
    assert key_a != key_b and len(key_a) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text(encoding="utf-8")
    assert key_a not in text and key_b not in text
    keys = read_keys(path)
    assert [c.name for c in keys.clients] == ["alice", "bob"]
    assert keys.clients[0].key_sha256 == hash_key(key_a) and keys.clients[0].rate is None
    assert keys.clients[1].key_sha256 == hash_key(key_b)
    assert keys.clients[1].rate == RateLimit(per_second=5, burst=10)


def test_add_client_refuses_duplicate_name(tmp_path):
    path = tmp_path / "api_keys.yaml"
    add_client(path, "alice")
    before = path.read_text(encoding="utf-8")
    with pytest.raises(StepError, match=r"'alice' already exists"):
        add_client(path, "alice")
    assert path.read_text(encoding="utf-8") == before


@pytest.mark.parametrize(
    "text",
    [
        "clients: [unclosed\n",
        "clients:\n  - name: alice\n",  # no key_sha256
        "clients:\n  - name: alice\n    key_sha256: not-a-hash\n",
        "clients: []\nadmins: []\n",  # unknown key
        "- alice\n",  # not a mapping
    ],
)
def test_malformed_keys_file_is_a_step_error(tmp_path, text):
    path = tmp_path / "api_keys.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(StepError, match=r"API keys file .*api_keys\.yaml is invalid"):
        read_keys(path)


def test_authenticator_client_for(tmp_path):
    path = tmp_path / "api_keys.yaml"
    key = add_client(path, "alice")
    other = add_client(path, "bob")
    auth = Authenticator(read_keys(path), RateLimit())
    assert auth.client_count == 2
    assert auth.client_for(key) == "alice"
    assert auth.client_for(other) == "bob"
    assert auth.client_for(key + "x") is None
    assert auth.client_for(hash_key(key)) is None  # the stored hash is not a key
    assert auth.client_for("") is None
    assert auth.client_for(None) is None


def test_token_bucket_burst_then_refusal_then_refill():
    clock = FakeClock(50.0)
    bucket_ = TokenBucket(per_second=2.0, burst=3, clock=clock)
    assert [bucket_.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = bucket_.take()
    assert wait == pytest.approx(0.5)  # one token at 2/s
    assert bucket_.take() == pytest.approx(0.5)  # a refusal takes nothing
    clock.now += 0.25
    assert bucket_.take() == pytest.approx(0.25)
    clock.now += 0.25
    assert bucket_.take() == 0.0
    assert bucket_.take() > 0
    clock.now += 1_000  # refill is capped at the burst
    assert [bucket_.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket_.take() > 0


def test_authenticator_rate_limit_per_client(tmp_path):
    path = tmp_path / "api_keys.yaml"
    add_client(path, "slow", RateLimit(per_second=1, burst=1))
    add_client(path, "fast")
    clock = FakeClock()
    auth = Authenticator(read_keys(path), RateLimit(per_second=100, burst=5), clock=clock)
    assert auth.retry_after("slow") == 0.0
    assert auth.retry_after("slow") == pytest.approx(1.0)
    assert [auth.retry_after("fast") for _ in range(5)] == [0.0] * 5  # the default rate, its own bucket
    assert auth.retry_after("fast") == pytest.approx(0.01)
    clock.now = 1.0
    assert auth.retry_after("slow") == 0.0


def test_authenticator_without_clients():
    auth = Authenticator(KeysFile(), RateLimit())
    assert auth.client_count == 0 and auth.client_for("anything") is None


# --- encode_row --------------------------------------------------------------------------------------------------


def test_encode_row_equals_encode():
    base = {
        "tier": "premium",
        "account_age_days": 400,
        "orders_30d": 12,
        "avg_declared_value_30d": 150.5,
        "weight_kg": 2.25,
        "volume_l": 10.0,
        "declared_value": 99.99,
        "category": "electronics",
        "is_bulky": False,
        "region": "islands",
        "distance_km": 321.7,
        "is_remote": True,
        "congestion_index": 0.35,
        "avg_transit_hours_7d": 30.1,
    }
    rows = [
        base,
        {**base, "tier": "standard", "category": "spaceship", "is_bulky": True, "is_remote": False},  # unknown
        {**base, "tier": "plus", "category": "furniture", "region": "atlantis", "declared_value": 1e6 / 3},
    ]
    frame = pd.DataFrame(rows)
    expected = encode(frame)
    got = np.vstack([encode_row(r) for r in rows])
    assert got.dtype == np.float32 and got.shape == (3, len(FEATURES))
    np.testing.assert_array_equal(got, expected)
    assert got[1, FEATURES.index("category")] == -1.0
    assert got[2, FEATURES.index("region")] == -1.0
    assert got[1, FEATURES.index("is_bulky")] == 1.0 and got[1, FEATURES.index("is_remote")] == 0.0
    # the records pandas gives back (numpy scalars) encode the same way too
    np.testing.assert_array_equal(np.vstack([encode_row(r) for r in frame.to_dict("records")]), expected)


def test_encode_row_missing_values_match_encode():
    row = {name: 1.0 for name in FEATURES} | {"tier": None, "category": "home", "region": "north"}
    del row["distance_km"]
    encoded = encode_row(row)
    frame = pd.DataFrame([{**row, "distance_km": None}])
    np.testing.assert_array_equal(encoded, encode(frame))
    assert encoded[0, FEATURES.index("tier")] == -1.0 and np.isnan(encoded[0, FEATURES.index("distance_km")])


# --- traffic and cli parsing -------------------------------------------------------------------------------------


def test_parse_mix_valid():
    assert traffic.parse_mix("high_value=0.2,core=0.5,long_tail=0.3", COHORT_NAMES) == {
        "high_value": 0.2,
        "core": 0.5,
        "long_tail": 0.3,
    }
    assert traffic.parse_mix("core=1,long_tail=0", COHORT_NAMES) == {"core": 1.0, "long_tail": 0.0}
    assert traffic.parse_mix(None, COHORT_NAMES) is None
    assert traffic.parse_mix("", COHORT_NAMES) is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("vip=1", r"unknown cohort 'vip'"),
        ("core=lots", r"weight for core must be a number, got 'lots'"),
        ("core", r"weight for core must be a number, got ''"),
        ("core=0,long_tail=0", r"not all zero"),
        ("core=-1,long_tail=2", r"non-negative"),
    ],
)
def test_parse_mix_refuses(text, message):
    with pytest.raises(StepError, match=message):
        traffic.parse_mix(text, COHORT_NAMES)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080", "http://localhost:1", "http://[::1]:8080/v1"])
def test_require_loopback_accepts_loopback(url):
    traffic.require_loopback(url)


@pytest.mark.parametrize("url", ["http://8.8.8.8:80", "http://10.0.0.1:8080", "http://[2001:db8::1]:80"])
def test_require_loopback_refuses_other_hosts(url):
    with pytest.raises(StepError, match=r"only targets loopback"):
        traffic.require_loopback(url)


@pytest.mark.parametrize("url", ["http://", "/v1/predict", ""])
def test_require_loopback_refuses_missing_host(url):
    with pytest.raises(StepError, match=r"has no host"):
        traffic.require_loopback(url)


def test_parse_percents_valid():
    assert parse_percents(["high_value=5", "core=0.5", "*=100"], COHORT_NAMES) == {
        "high_value": 5.0,
        "core": 0.5,
        "*": 100.0,
    }
    assert parse_percents([], COHORT_NAMES) == {}


def test_parse_percents_refuses_unknown_cohort():
    with pytest.raises(StepError, match=r"unknown cohort 'vip'"):
        parse_percents(["vip=5"], COHORT_NAMES)


@pytest.mark.parametrize("item", ["core=five", "core=", "core"])
def test_parse_percents_refuses_non_numbers(item):
    with pytest.raises(StepError, match=r"is not COHORT=NUMBER"):
        parse_percents([item], COHORT_NAMES)
