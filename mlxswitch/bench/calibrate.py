"""`mlxswitch calibrate`: choose policy, signal and threshold for a target, on held-out text.

The profile's tiers answer the suite's calibration prompts (the top tier greedily) and every
tier is teacher-forced along those answers. Every policy × signal × threshold is replayed there
(simulate.py); the setting that meets the target best is then measured on the held-out prompts,
which played no part in choosing it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from ..decoding.tiers import Ladder
from ..errors import UsageError
from ..profiles import Profile
from ..routing.router import POLICY_NAMES, SIGNAL_NAMES, RouterConfig
from . import metrics, simulate
from .prompts import BenchPrompt
from .report import GAIN_NATS
from .runner import Progress, collect_positions, sweep_config

SIGNALS = SIGNAL_NAMES
GRID = 41  # thresholds per policy and signal: quantiles of the bottom tier's signal, 2%–98%
SHARE_TOLERANCE = 0.02  # on calibration text, settings this close to the target share compete


@dataclass(frozen=True)
class Candidate:
    """One setting and what it did on calibration text."""

    policy: str
    signal: str
    tau: float
    config: RouterConfig
    quality: simulate.Quality


def _sweep(profile: Profile, positions: list[simulate.Positions], tier_bytes: list[int],
           signals: tuple[str, ...]) -> list[Candidate]:
    n = len(tier_bytes)
    out = []
    for policy in POLICY_NAMES:
        for signal in signals:
            for tau in sorted(set(simulate.sweep_thresholds(positions, GRID, signal, 0.02, 0.98))):
                config = dataclasses.replace(sweep_config(profile, policy, tau, n), signal=signal)
                tried = [simulate.route(config, p) for p in positions]
                out.append(Candidate(policy, signal, tau, config, simulate.quality(positions, tried, tier_bytes)))
    return out


def choose(candidates: list[Candidate], target_share: float | None,
           target_retained: float | None) -> Candidate:
    """The best setting for the target on calibration text."""
    usable = [c for c in candidates if math.isfinite(c.quality.retained)]
    if not usable:
        raise UsageError("calibration text gives no NLL gap between the bottom and top tiers: "
                         "nothing to calibrate")
    if target_share is not None:
        # Closest to the share first; among those within the tolerance, the most retained.
        best_gap = min(abs(c.quality.top_share - target_share) for c in usable)
        near = [c for c in usable if abs(c.quality.top_share - target_share) <= max(best_gap, SHARE_TOLERANCE)]
        return max(near, key=lambda c: (c.quality.retained, -c.quality.bytes_per_token))
    reaching = [c for c in usable if c.quality.retained >= target_retained]
    if not reaching:
        best = max(c.quality.retained for c in usable)
        raise UsageError(f"no setting retains {target_retained:g} on calibration text "
                         f"(the best retains {best:.2f}); ask for less")
    return min(reaching, key=lambda c: (c.quality.bytes_per_token, -c.quality.retained))


def _pooled(positions, signal: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    bottom = np.concatenate([p.nll[0] for p in positions])
    top = np.concatenate([p.nll[-1] for p in positions])
    return bottom, top, np.concatenate([p.signal(signal)[0] for p in positions])


def aurocs(positions: list[simulate.Positions]) -> dict[str, float]:
    """AUROC of each bottom-tier signal for 'the top tier lowers the NLL by more than 0.1 nat here'."""
    out = {}
    for signal in SIGNALS:
        bottom, top, values = _pooled(positions, signal)
        out[signal] = metrics.auroc(values, (bottom - top) > GAIN_NATS)
    return out


def calibrate(profile: Profile, ladder: Ladder, calibration: list[BenchPrompt], heldout: list[BenchPrompt],
              target_share: float | None, target_retained: float | None, max_tokens: int,
              progress: Progress | None = None, signals: tuple[str, ...] = SIGNALS) -> dict:
    """Sweep on calibration prompts, choose, and report the choice measured on held-out prompts."""
    if len(ladder.tiers) < 2:
        raise UsageError(f"profile '{profile.name}' has a single tier: there is nothing to calibrate")
    tier_bytes = [t.bytes_per_token for t in ladder.tiers]
    *_, cal = collect_positions(ladder, calibration, max_tokens, progress, "calibration prompts")
    *_, held = collect_positions(ladder, heldout, max_tokens, progress, "held-out prompts")
    candidates = _sweep(profile, cal, tier_bytes, signals)
    chosen = choose(candidates, target_share, target_retained)
    tried = [simulate.route(chosen.config, p) for p in held]
    held_quality = simulate.quality(held, tried, tier_bytes)
    bottom, top, _ = _pooled(held, "entropy")
    random = metrics.random_control(bottom, top, held_quality.top_share)
    return {
        "target": {"share": target_share, "retained": target_retained},
        "chosen": {"policy": chosen.policy, "signal": chosen.signal, "tau": chosen.tau,
                   "window": chosen.config.window, "min_run": chosen.config.min_run,
                   "down": chosen.config.downs()[0], "calibration": chosen.quality.to_dict()},
        "heldout": {**held_quality.to_dict(), "random_retained": random.mean,
                    "oracle_retained": metrics.oracle(bottom, top, held_quality.top_share),
                    "vs_random": held_quality.retained / random.mean if random.mean else math.nan},
        "auroc_heldout": aurocs(held),
        "auroc_calibration": aurocs(cal),
        "prompts": {"calibration": [p.id for p in calibration], "heldout": [p.id for p in heldout]},
        "tiers": ladder.tier_names, "bytes_per_token": dict(zip(ladder.tier_names, tier_bytes)),
        "candidates": len(candidates),
    }
