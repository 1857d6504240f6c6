import numpy as np
import pytest

from mlrelease.quality.drift import psi
from mlrelease.steps.validate_data import row_bounds


def test_psi_is_near_zero_for_the_same_distribution_and_large_for_a_shift():
    rng = np.random.default_rng(0)
    ref = rng.normal(100, 20, 5000)
    assert psi(ref, rng.normal(100, 20, 5000)) < 0.02
    assert psi(ref, rng.normal(130, 20, 5000)) > 0.5
    moderate = psi(ref, rng.normal(108, 20, 5000))
    assert 0.05 < moderate < 0.5


def test_psi_ignores_nan_and_rejects_empty():
    ref = np.array([1.0, 2.0, 3.0, 4.0] * 50)
    assert psi(ref, np.append(ref, [np.nan] * 10)) == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError):
        psi(np.array([np.nan]), ref)


def test_psi_of_a_constant_reference():
    assert psi(np.ones(100), np.ones(50)) == 0.0
    assert psi(np.ones(100), np.full(50, 2.0)) == float("inf")


def test_row_bounds_scale_the_reference_rate():
    assert row_bounds(7 * 24 * 10, 7 * 24, 24) == (120, 481)
    assert row_bounds(0, 168, 24) == (1, 2**62)
