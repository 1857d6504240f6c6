"""perf_analyzer CSV parsing and the latency/throughput gate."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlrelease.errors import StepError
from mlrelease.serving.perf import Level, PerfSettings, compare, median_levels, parse_csv, run_perf_analyzer

CSV = Path(__file__).resolve().parents[1] / "data" / "perf_analyzer_v1.csv"


def test_parse_real_perf_analyzer_csv():
    levels = parse_csv(CSV)
    assert levels == [Level(1, 806.294, 1206.0, 1826.0), Level(4, 2953.17, 1312.0, 2003.0)]


def test_empty_csv_is_named(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text(CSV.read_text().splitlines()[0] + "\n")
    with pytest.raises(StepError, match="no measurements"):
        parse_csv(path)


def _round(tput: float, p99: float) -> list[Level]:
    return [Level(1, tput, p99 / 2, p99), Level(4, tput * 3, p99, p99 * 1.5)]


def test_equal_models_pass_and_slow_or_weak_ones_fail():
    champion = [_round(1000, 1000), _round(1000, 1000)]
    same = compare([_round(1000, 1050), _round(1000, 1000)], champion, max_p99_ratio=1.1, min_throughput_ratio=0.9)
    assert same.passed and same.worst_p99_ratio == pytest.approx(1.025) and same.pairs == 4
    slow = compare([_round(1000, 3000)] * 2, champion, max_p99_ratio=1.1, min_throughput_ratio=0.9)
    assert not slow.passed and "p99 latency ratio above 1.1 in all 4 paired measurements" in slow.reason
    weak = compare([_round(500, 1000)] * 2, champion, max_p99_ratio=1.1, min_throughput_ratio=0.9)
    assert not weak.passed and "throughput ratio below 0.9 in all 4 paired measurements" in weak.reason
    assert weak.false_fail_rate == pytest.approx(1 / 16)


def test_one_noisy_pair_cannot_refuse_a_candidate_of_the_same_speed():
    # make run, same-quality candidate: concurrency 4's median p99 ratio 1.52 was over 1.5, concurrency 1's not
    champion = [_round(1000, 1000)] * 3
    noisy = [[Level(1, 1000, 500, 1100), Level(4, 3000, 1000, 1600 * 1.5)] for _ in range(3)]
    verdict = compare(noisy, champion, max_p99_ratio=1.5, min_throughput_ratio=0.67)
    assert verdict.passed and verdict.p99_beyond == 3 and verdict.pairs == 6
    assert "p99 beyond 1.5 in 3/6 pairs" in verdict.reason


def test_the_allowance_never_widens_with_the_champions_noise():
    # The champion's p99 once spiked 3x; a 2.9x slower candidate is beyond the configured ratio in every pair
    # (before, the champion's own spread widened the allowance to 1.5x).
    champion = [_round(1000, 1000), _round(1000, 1000), _round(1000, 3000)]
    verdict = compare([_round(400, 3100)] * 3, champion, max_p99_ratio=1.1, min_throughput_ratio=0.9)
    assert not verdict.passed and verdict.pairs == 6 and verdict.p99_beyond == 4
    assert "throughput ratio below 0.9 in all 6" in verdict.reason and "p99 beyond 1.1 in 4/6" in verdict.reason


def test_median_levels_and_no_common_level():
    assert median_levels([_round(1, 10), _round(3, 30), _round(2, 20)])[0] == Level(1, 2, 10, 20)
    with pytest.raises(StepError, match="no common concurrency"):
        compare([[Level(8, 1, 1, 1)]], [[Level(1, 1, 1, 1)]], max_p99_ratio=1.1, min_throughput_ratio=0.9)


def test_missing_perf_analyzer_is_named(tmp_path):
    with pytest.raises(StepError, match="perf_analyzer not found"):
        run_perf_analyzer(
            tmp_path / "perf_analyzer", {}, "http://127.0.0.1:1", "m", 1, tmp_path / "x.csv", PerfSettings()
        )
