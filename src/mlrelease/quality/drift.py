"""Population Stability Index between a reference sample and a current sample of one numeric feature.

Written here rather than taken from a library: PSI is a dozen lines of numpy, and the drift
libraries that offer it (evidently, nannyml) would pull in hundreds of MB for one statistic.
"""

from __future__ import annotations

import numpy as np

# Industry rule of thumb: < 0.1 stable, 0.1-0.25 moderate shift, > 0.25 significant shift.
DEFAULT_PSI_THRESHOLD = 0.25


def quantile_edges(reference: np.ndarray, bins: int = 10) -> np.ndarray:
    """The distinct quantile edges of the reference (numpy's linear interpolation), outer edges left as found."""
    return np.unique(np.quantile(reference, np.linspace(0, 1, bins + 1)))


def psi_from_counts(ref_counts: np.ndarray, cur_counts: np.ndarray, eps: float = 1e-4) -> float:
    """PSI of two histograms over the same bins (any engine may count them)."""
    ref_share = np.clip(ref_counts / ref_counts.sum(), eps, None)
    cur_share = np.clip(cur_counts / cur_counts.sum(), eps, None)
    return float(np.sum((cur_share - ref_share) * np.log(cur_share / ref_share)))


def psi(reference: np.ndarray, current: np.ndarray, bins: int = 10, eps: float = 1e-4) -> float:
    """PSI over quantile bins of the reference; NaNs are dropped, empty samples raise ValueError."""
    ref = np.asarray(reference, dtype="float64")
    cur = np.asarray(current, dtype="float64")
    ref, cur = ref[np.isfinite(ref)], cur[np.isfinite(cur)]
    if ref.size == 0 or cur.size == 0:
        raise ValueError("PSI needs non-empty reference and current samples")
    edges = quantile_edges(ref, bins)
    if edges.size < 2:  # a constant reference: any change of value is a full shift
        return 0.0 if np.all(cur == ref[0]) else float("inf")
    edges[0], edges[-1] = -np.inf, np.inf
    return psi_from_counts(np.histogram(ref, edges)[0], np.histogram(cur, edges)[0], eps)
