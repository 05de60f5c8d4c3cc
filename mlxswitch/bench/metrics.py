"""Pure metrics for `mlxswitch bench` (NumPy only, no MLX).

Routing quality is measured on per-position arrays collected teacher-forced along the top
tier's greedy answer: for every position t, nll_bottom[t] and nll_top[t] (nats) of the token the
top tier chose, and the bottom tier's signal s[t] (e.g. entropy). A routing policy is a boolean
mask (True = the top tier takes position t); its NLL is nll_top where the mask is set and
nll_bottom elsewhere. Because the context is the same fixed answer for every policy, the
retained fidelity of a mask reduces to (sum of gains on the chosen positions) / (sum of all
gains), with gain[t] = nll_bottom[t] - nll_top[t]; the curves below use that.

Shares are turned into counts as k = floor(share * n + 0.5) (half up, not Python's banker's
rounding). Rankings break ties by position (earlier first), so every result is deterministic.
The oracle bounds every routing at its share, and the random control's band, whenever the total
gain is positive (the top tier is better on average), the only case where retained is meaningful.
Retained can exceed 1 (a policy that skips the positions where the top tier is worse beats
top-only) and be negative; it is not clipped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

GAP_EPS = 1e-9  # |mean NLL gap| at or below this (nats) makes retained fidelity undefined (NaN)
RANDOM_DRAWS = 200

# Apple's published peak memory bandwidth per chip, GB/s (apple.com tech specs); for M3 Max and
# M4 Max the upper configurations (the binned ones have 300 and 410 GB/s). Decode reads every
# weight once per token, so bandwidth / bytes-per-token is an upper bound on tok/s; in practice
# about 55-85% of peak is attainable. These are projections, not measurements.
APPLE_BANDWIDTH_GBPS: dict[str, float] = {
    "M1": 68,
    "M2": 100,
    "M3": 100,
    "M4": 120,
    "M3 Pro": 150,
    "M1 Pro": 200,
    "M2 Pro": 200,
    "M4 Pro": 273,
    "M3 Max": 400,
    "M1 Max": 400,
    "M2 Max": 400,
    "M4 Max": 546,
    "M2 Ultra": 800,
}
ATTAINABLE_FRACTION = (0.55, 0.85)


def _pair(nll_bottom, nll_top) -> tuple[np.ndarray, np.ndarray]:
    b = np.asarray(nll_bottom, dtype=np.float64).reshape(-1)
    t = np.asarray(nll_top, dtype=np.float64).reshape(-1)
    if b.shape != t.shape:
        raise ValueError(f"nll_bottom has {b.size} positions but nll_top has {t.size}")
    return b, t


def _mask(mask, n: int) -> np.ndarray:
    m = np.asarray(mask).reshape(-1)
    if m.size != n:
        raise ValueError(f"mask has {m.size} positions, expected {n}")
    return m.astype(bool)


def count_for_share(share: float, n: int) -> int:
    """Number of positions k = floor(share * n + 0.5) for a share in [0, 1]."""
    if not (0.0 <= share <= 1.0):
        raise ValueError(f"share must be in [0, 1], got {share}")
    return min(n, math.floor(share * n + 0.5))


def _total_gain(b: np.ndarray, t: np.ndarray, eps: float) -> float:
    gain = float(np.sum(b - t))
    return math.nan if b.size == 0 or abs(gain / b.size) <= eps else gain


def retained(nll_bottom: float, nll: float, nll_top: float, eps: float = GAP_EPS) -> float:
    """The share of the bottom → top gap in mean NLL a routing closes (NaN when |gap| <= eps)."""
    gap = float(nll_bottom - nll_top)
    return float(nll_bottom - nll) / gap if abs(gap) > eps else math.nan


def retained_fidelity(nll_bottom, nll_top, chosen_top_mask, eps: float = GAP_EPS) -> float:
    """`retained` of a mask choosing the top tier per position; NaN when n = 0."""
    b, t = _pair(nll_bottom, nll_top)
    m = _mask(chosen_top_mask, b.size)
    if b.size == 0:
        return math.nan
    return retained(b.mean(), np.where(m, t, b).mean(), t.mean(), eps)


def top_k_mask(values, k: int) -> np.ndarray:
    """Mask of the k largest values; ties go to the earlier position."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if not 0 <= k <= v.size:
        raise ValueError(f"k must be in [0, {v.size}], got {k}")
    if np.isnan(v).any():
        raise ValueError("values to rank contain NaN")
    mask = np.zeros(v.size, dtype=bool)
    mask[np.argsort(-v, kind="stable")[:k]] = True
    return mask


@dataclass(frozen=True)
class RandomControl:
    """Retained fidelity of a uniformly random k-subset: exact mean (= k/n), and over seeded draws."""

    mean: float
    p5: float
    p95: float
    draws_mean: float
    k: int
    draws: int

    def to_dict(self) -> dict:
        """Plain dict (for JSON)."""
        return asdict(self)


def random_control(
    nll_bottom, nll_top, share: float, seed: int = 0, draws: int = RANDOM_DRAWS, eps: float = GAP_EPS
) -> RandomControl:
    """Retained when a random k = round(share * n) subset goes to the top.

    The mean is exact (k/n); the 5-95% band comes from seeded draws.
    """
    b, t = _pair(nll_bottom, nll_top)
    n = b.size
    k = count_for_share(share, n) if n else 0
    total = _total_gain(b, t, eps)
    if math.isnan(total):
        return RandomControl(math.nan, math.nan, math.nan, math.nan, k, draws)
    # E[sum of gains over a uniform k-subset] = (k/n) * total gain, so the exact expectation is k/n.
    exact = k / n
    if draws < 1:
        return RandomControl(exact, math.nan, math.nan, math.nan, k, 0)
    gain = b - t
    rng = np.random.default_rng(seed)
    if k == 0 or k == n:
        values = np.full(draws, exact)
    else:
        keys = rng.random((draws, n))
        chosen = np.argpartition(keys, k - 1, axis=1)[:, :k]
        values = gain[chosen].sum(axis=1) / total
    p5, p95 = np.percentile(values, [5.0, 95.0])
    return RandomControl(exact, float(p5), float(p95), float(values.mean()), k, draws)


def oracle(nll_bottom, nll_top, share: float, eps: float = GAP_EPS) -> float:
    """Retained when the top tier takes the k = round(share * n) positions of largest nll_bottom - nll_top."""
    b, t = _pair(nll_bottom, nll_top)
    if b.size == 0:
        return math.nan
    return retained_fidelity(b, t, top_k_mask(b - t, count_for_share(share, b.size)), eps)


def auroc(scores, labels) -> float:
    """P(score of a positive > score of a negative), ties half (Mann-Whitney U); NaN if a class is empty."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    y = np.asarray(labels).reshape(-1).astype(bool)
    if s.size != y.size:
        raise ValueError(f"{s.size} scores but {y.size} labels")
    if np.isnan(s).any():
        raise ValueError("scores contain NaN")
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    # Average ranks (1-based) with ties sharing the mean of their rank range.
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    avg_rank = ends - (counts - 1) / 2.0
    rank_sum = float(avg_rank[inverse][y].sum())
    u = rank_sum - n_pos * (n_pos + 1) / 2.0
    return u / (n_pos * n_neg)


def share_grid(points: int = 21) -> np.ndarray:
    """Evenly spaced shares 0..1 inclusive for plotting."""
    if points < 2:
        raise ValueError("a share grid needs at least 2 points")
    return np.linspace(0.0, 1.0, points)


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Median, min and max over repeats (NaN for no values), plus their count n."""
    v = np.asarray(list(values), dtype=np.float64).reshape(-1)
    if v.size == 0:
        return {"median": math.nan, "min": math.nan, "max": math.nan, "n": 0}
    return {"median": float(np.median(v)), "min": float(v.min()), "max": float(v.max()), "n": int(v.size)}


def apple_bound_tok_s(bytes_per_token: float, efficiency: float = 1.0) -> dict[str, float]:
    """Projected decode tok/s bound per Apple chip: efficiency * peak bandwidth / bytes read per token."""
    if not (bytes_per_token > 0 and math.isfinite(bytes_per_token)):
        raise ValueError(f"bytes_per_token must be a positive number, got {bytes_per_token}")
    if not (0 < efficiency <= 1):
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency}")
    return {chip: efficiency * gbps * 1e9 / bytes_per_token for chip, gbps in APPLE_BANDWIDTH_GBPS.items()}
