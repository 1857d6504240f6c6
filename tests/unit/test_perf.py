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
    same = compare([_round(1000, 1050)], champion, max_p99_ratio=1.1, min_throughput_ratio=0.9)
    assert same.passed and same.worst_p99_ratio == pytest.approx(1.05)
    slow = compare([_round(1000, 3000)], champion, max_p99_ratio=1.1, min_throughput_ratio=0.9)
    assert not slow.passed and "concurrency 1: p99 latency ratio 3.00 > 1.10" in slow.reason
    weak = compare([_round(500, 1000)], champion, max_p99_ratio=1.1, min_throughput_ratio=0.9)
    assert not weak.passed and "concurrency 1: throughput ratio 0.50 < 0.90" in weak.reason


def test_measurement_noise_widens_the_allowance_but_not_for_a_real_regression():
    noisy_champion = [_round(1000, 1000), _round(800, 1400)]  # its own p99 varies by 1.4x
    within_noise = compare([_round(950, 1300)], noisy_champion, max_p99_ratio=1.1, min_throughput_ratio=0.9)
    assert within_noise.passed and within_noise.p99_noise == pytest.approx(1.4)
    three_x = compare([_round(900, 3600)], noisy_champion, max_p99_ratio=1.1, min_throughput_ratio=0.9)
    assert not three_x.passed


def test_one_wild_champion_round_cannot_let_a_regression_through():
    # The champion's p99 once spiked 3x; without a cap that spike would excuse a 2.9x slower candidate.
    champion = [_round(1000, 1000), _round(1000, 1000), _round(1000, 3000)]
    verdict = compare([_round(400, 2900)], champion, max_p99_ratio=1.1, min_throughput_ratio=0.9)
    assert not verdict.passed and verdict.p99_noise == pytest.approx(1.5)
    assert "p99 latency ratio 2.90 > 1.50" in verdict.reason and "throughput ratio 0.40 < 0.90" in verdict.reason


def test_median_levels_and_no_common_level():
    assert median_levels([_round(1, 10), _round(3, 30), _round(2, 20)])[0] == Level(1, 2, 10, 20)
    with pytest.raises(StepError, match="no common concurrency"):
        compare([[Level(8, 1, 1, 1)]], [[Level(1, 1, 1, 1)]], max_p99_ratio=1.1, min_throughput_ratio=0.9)


def test_missing_perf_analyzer_is_named(tmp_path):
    with pytest.raises(StepError, match="perf_analyzer not found"):
        run_perf_analyzer(
            tmp_path / "perf_analyzer", {}, "http://127.0.0.1:1", "m", 1, tmp_path / "x.csv", PerfSettings()
        )
