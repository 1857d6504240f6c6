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


def _edge_positions(n: int, bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """numpy's linear method: each edge's lower and upper 0-based rank in the sorted sample and its weight."""
    virtual = (n - 1) * np.linspace(0, 1, bins + 1)
    lower = np.floor(virtual).astype("int64")
    return lower, np.minimum(lower + 1, n - 1), virtual - lower


def edge_ranks(n: int, bins: int = 10) -> list[int]:
    """The ranks of a sorted sample of `n` values that its quantile edges are read from (for an engine that
    cannot sort on one machine: it fetches just these order statistics)."""
    lower, upper, _ = _edge_positions(n, bins)
    return sorted({int(r) for r in (*lower, *upper)})


def edges_from_order_statistics(n: int, at_rank: dict[int, float], bins: int = 10) -> np.ndarray:
    """`quantile_edges` of a sample of `n` values from its order statistics at `edge_ranks(n)`, bit for bit: the
    same positions, weights and interpolation (numpy's `_lerp`) as np.quantile's default method.

    Spark's exact `percentile` interpolates as (1 - w)·a + w·b, which can round an edge to the next double; a value
    lying between the two (decimal data does) then counts in another bin, and PSI differs between the engines.
    """
    lower, upper, weight = _edge_positions(n, bins)
    a = np.array([at_rank[int(r)] for r in lower], dtype="float64")
    b = np.array([at_rank[int(r)] for r in upper], dtype="float64")
    diff = b - a
    edges = np.where(weight >= 0.5, b - diff * (1 - weight), a + diff * weight)
    return np.unique(edges)


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
