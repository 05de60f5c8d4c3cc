"""Routing policies replayed on teacher-forced positions (pure Python + NumPy, no MLX).

Along the top tier's greedy answer to a prompt, every tier's entropy and NLL are known at every
position (teacher forcing). A policy is run on them exactly as the token loop runs it: the rung
it asks for computes the position, `review` may hand the position up, the taken rung's NLL
counts, and `commit` sees the taken rung's entropy. This measures where a policy puts the strong
tier at no generation cost, deterministically: the quality a policy would reach, separated from
the speed of the run that measures it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..json_numbers import finite
from ..routing.policies import make_policy
from ..routing.registry import MEASURED, SIGNAL_BY_NAME, uncertainty
from ..routing.router import RouterConfig
from ..routing.walk import ColumnPosition, replay
from . import metrics


@dataclass(frozen=True)
class Positions:
    """One prompt's teacher-forced arrays: entropy (bits) and NLL (nats) per tier and position."""

    prompt_id: str
    entropy: np.ndarray  # (tiers, positions), bits
    nll: np.ndarray  # (tiers, positions), nats
    varentropy: np.ndarray | None = None  # (tiers, positions), bits²
    margin: np.ndarray | None = None  # (tiers, positions), p1 − p2
    hidden: np.ndarray | None = None  # (positions, dims): the bottom tier's last hidden state (not saved)
    probe: np.ndarray | None = None  # (positions,): the probe's score from the bottom tier

    def signal(self, name: str) -> np.ndarray:
        """A signal as an uncertainty (higher = less sure): entropy, varentropy, 1 − margin, or the
        probe's score (measured on the bottom tier only: NaN on the others)."""
        if SIGNAL_BY_NAME[name].bottom_only:
            if self.probe is None:
                raise ValueError(f"{self.prompt_id}: no probe scores")
            out = np.full(self.entropy.shape, np.nan)
            out[0] = self.probe
            return out
        return uncertainty(name, self.measured())

    def measured(self) -> tuple[np.ndarray | None, ...]:
        """The logits reduction's outputs per tier and position, in registry.MEASURED order."""
        return tuple(getattr(self, s.name) for s in MEASURED)

    def to_dict(self) -> dict:
        """JSON-ready (the bench's figures re-derive from these)."""
        out = {"prompt_id": self.prompt_id}
        # The key order of the records: the first measured signal (entropy), nll, the others.
        for key in (MEASURED[0].name, "nll", *(s.name for s in MEASURED[1:]), "probe"):
            value = getattr(self, key)
            if value is not None:
                out[key] = np.round(value, 6).tolist()
        return out


def route(config: RouterConfig, positions: Positions) -> list[list[int]]:
    """Run the config's policy over one prompt's positions, reading its signal; the rungs tried at each."""
    values = positions.signal(config.signal)
    if not values.shape[1]:
        return []
    settled = replay(
        make_policy(config, values.shape[0]),
        float(values[0, 0]),
        (ColumnPosition(values[:, t].tolist()) for t in range(values.shape[1])),
    )
    return [list(s.rungs) for s in settled]


@dataclass(frozen=True)
class Quality:
    """A routing's pooled quality and cost over many prompts' positions."""

    positions: int
    top_share: float
    nll: float  # mean NLL of the taken tiers (nats/token)
    retained: float  # (NLL_bottom − NLL) / (NLL_bottom − NLL_top); NaN when the gap is ~0
    bytes_per_token: float  # weights read per position, every tier tried counted

    def to_dict(self) -> dict:
        """JSON-ready figures."""
        return finite(self.__dict__)


def quality(
    all_positions: list[Positions], all_tried: list[list[list[int]]], tier_bytes: list[int]
) -> Quality:
    """Pool a routing over every prompt's positions (token-weighted means)."""
    nll_sum = bottom = top_sum = count = top_count = 0.0
    bytes_sum = 0.0
    top = len(tier_bytes) - 1
    for positions, tried in zip(all_positions, all_tried, strict=True):
        for t, rungs in enumerate(tried):
            nll_sum += positions.nll[rungs[-1], t]
            bottom += positions.nll[0, t]
            top_sum += positions.nll[top, t]
            top_count += rungs[-1] == top
            bytes_sum += sum(tier_bytes[r] for r in rungs)
            count += 1
    if not count:
        return Quality(0, math.nan, math.nan, math.nan, math.nan)
    return Quality(
        int(count),
        top_count / count,
        nll_sum / count,
        metrics.retained(bottom / count, nll_sum / count, top_sum / count),
        bytes_sum / count,
    )


def forced(all_positions: list[Positions], rung: int) -> list[list[list[int]]]:
    """Every position on one rung (a tier alone)."""
    return [[[rung] for _ in range(p.entropy.shape[1])] for p in all_positions]


def sweep_thresholds(
    all_positions: list[Positions], points: int, signal: str = "entropy", low: float = 0.1, high: float = 0.9
) -> list[float]:
    """Up thresholds spread over the bottom tier's signal: its quantiles from `low` to `high`."""
    pooled = np.concatenate([p.signal(signal)[0] for p in all_positions]) if all_positions else np.zeros(1)
    pooled = pooled[np.isfinite(pooled)]
    if pooled.size == 0:
        return [1.0] * points
    qs = np.linspace(low, high, points) if points > 1 else np.array([(low + high) / 2])
    return [round(float(v), 4) for v in np.quantile(pooled, qs)]


def share_by_threshold(config: RouterConfig, all_positions: list[Positions]) -> list[tuple[float, float]]:
    """Each of 50 quantiles (0.5 to 0.99) of the routed signal over `all_positions` as the up
    threshold, and the top-tier share its replay gives, in quantile order; `config` gives policy and
    timing. Empty without a finite signal. One replay per distinct threshold: the search for many
    target shares reads this list rather than replaying for each."""
    if not all_positions:
        return []
    pooled = np.concatenate([p.signal(config.signal)[0] for p in all_positions])
    pooled = pooled[np.isfinite(pooled)]
    if pooled.size == 0:
        return []
    tiers = len(config.up) + 1
    shares: dict[float, float] = {}
    out = []
    for q in np.linspace(0.5, 0.99, 50):
        tau = round(float(np.quantile(pooled, q)), 4)
        if tau not in shares:
            tried = [route(config.with_thresholds((tau,) * (tiers - 1)), p) for p in all_positions]
            shares[tau] = quality(all_positions, tried, [0] * tiers).top_share
        out.append((tau, shares[tau]))
    return out


def threshold_for_share(candidates: list[tuple[float, float]], target: float) -> tuple[float, float]:
    """Among `candidates` (share_by_threshold's), the threshold whose share is nearest `target`
    (the first on a tie), and that share; NaNs when there is none."""
    best = (math.nan, math.nan)
    for tau, share in candidates:
        if math.isnan(best[1]) or abs(share - target) < abs(best[1] - target):
            best = (tau, share)
    return best
