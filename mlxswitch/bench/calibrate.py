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
from ..routing.probe import probe_path
from ..routing.registry import POLICY_BY_NAME, SIGNAL_BY_NAME
from ..routing.router import (
    BOTTOM_ONLY_SIGNALS,
    POLICY_NAMES,
    SIGNAL_NAMES,
    RouterConfig,
)
from . import metrics, probe, simulate
from .prompts import BenchPrompt
from .report import GAIN_NATS
from .runner import PLAIN, Progress, collect_positions, forced_config, sweep_config

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


def _sweep(
    positions: list[simulate.Positions], tier_bytes: list[int], signals: tuple[str, ...]
) -> list[Candidate]:
    n = len(tier_bytes)
    out = []
    for policy in POLICY_NAMES:
        for signal in signals:
            if SIGNAL_BY_NAME[signal].bottom_only and not POLICY_BY_NAME[policy].reads_bottom_only:
                continue  # the probe exists at every position only when the cheap tier runs first
            for tau in sorted(set(simulate.sweep_thresholds(positions, GRID, signal, 0.02, 0.98))):
                config = dataclasses.replace(sweep_config(policy, tau, n), signal=signal)
                tried = [simulate.route(config, p) for p in positions]
                out.append(
                    Candidate(policy, signal, tau, config, simulate.quality(positions, tried, tier_bytes))
                )
    return out


def choose(
    candidates: list[Candidate], target_share: float | None, target_retained: float | None
) -> Candidate:
    """The best setting for the target on calibration text."""
    usable = [c for c in candidates if math.isfinite(c.quality.retained)]
    if not usable:
        raise UsageError(
            "calibration text gives no NLL gap between the bottom and top tiers: nothing to calibrate"
        )
    if target_share is not None:
        # Closest to the share first; among those within the tolerance, the most retained.
        best_gap = min(abs(c.quality.top_share - target_share) for c in usable)
        near = [
            c for c in usable if abs(c.quality.top_share - target_share) <= max(best_gap, SHARE_TOLERANCE)
        ]
        return max(near, key=lambda c: (c.quality.retained, -c.quality.bytes_per_token))
    if target_retained is None:
        raise UsageError("calibrate needs a target: a share of the top tier or a retained fraction")
    reaching = [c for c in usable if c.quality.retained >= target_retained]
    if not reaching:
        best = max(c.quality.retained for c in usable)
        raise UsageError(
            f"no setting retains {target_retained:g} on calibration text "
            f"(the best retains {best:.2f}); ask for less"
        )
    return min(reaching, key=lambda c: (c.quality.bytes_per_token, -c.quality.retained))


def _pooled(positions, signal: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    bottom = np.concatenate([p.nll[0] for p in positions])
    top = np.concatenate([p.nll[-1] for p in positions])
    return bottom, top, np.concatenate([p.signal(signal)[0] for p in positions])


def aurocs(positions: list[simulate.Positions]) -> dict[str, float]:
    """AUROC of each bottom-tier signal for 'the top tier lowers the NLL by more than 0.1 nat here'."""
    out = {}
    for signal in SIGNALS:
        if signal in BOTTOM_ONLY_SIGNALS and any(p.probe is None for p in positions):
            continue
        bottom, top, values = _pooled(positions, signal)
        out[signal] = metrics.auroc(values, (bottom - top) > GAIN_NATS)
    return out


def train_probe(
    profile: Profile, ladder: Ladder, session, cal: list[simulate.Positions], held: list[simulate.Positions]
) -> tuple[dict, list[simulate.Positions], list[simulate.Positions]]:
    """Fit the probe on calibration text and save it; a summary, and the positions with its scores.

    Calibration positions get their out-of-fold scores (what the sweep may read without fooling
    itself), held-out ones the final probe's.
    """
    x_cal, x_held = probe.features(cal), probe.features(held)
    if x_cal is None or x_held is None:
        return {"status": "no hidden states from this model's layout: no probe"}, cal, held
    y_cal, y_held = probe.labels(cal, GAIN_NATS), probe.labels(held, GAIN_NATS)
    if y_cal.all() or not y_cal.any():
        return {"status": "calibration text has one class only: no probe"}, cal, held
    groups = np.concatenate([[i] * p.entropy.shape[1] for i, p in enumerate(cal)])
    learned, choice, cv, oof = probe.fit_cross_validated(x_cal, y_cal, groups)
    in_sample = learned.score(x_cal)
    oof = np.where(np.isfinite(oof), oof, in_sample)  # a fold with one class: no out-of-fold score
    held_scores = learned.score(x_held)
    # What the probe adds to a token, against a step of the cheap tier alone (measured here).
    cost = probe.per_token_cost_s(learned)
    session.decode_with(forced_config(len(ladder.tiers), 0), PLAIN)
    session.reset()
    step = session.ask("Say one short sentence about the sea.", 8)
    cheap_s = 1 / step.tok_per_s if step.tok_per_s else math.nan
    auroc = metrics.auroc(held_scores, y_held)
    path = probe_path(*profile.probe_key())
    learned.save(
        path,
        {
            "profile": profile.name,
            "models": list(profile.models),
            "tiers": ladder.tier_names,
            "auroc_heldout": auroc,
            "positions": int(len(y_cal)),
            "label": f"gain > {GAIN_NATS} nat",
            **choice,
        },
    )
    summary = {
        "status": "trained",
        "path": str(path),
        "features": int(x_cal.shape[1]),
        **choice,
        "cv_auroc": cv,
        "auroc_heldout": auroc,
        "auroc_calibration_in_sample": metrics.auroc(in_sample, y_cal),
        "auroc_calibration_out_of_fold": metrics.auroc(oof, y_cal),
        "cost_s_per_token": cost,
        "cheap_step_s": cheap_s,
        "cost_share_of_cheap_step": cost / cheap_s,
    }
    return summary, _with_scores(cal, oof), _with_scores(held, held_scores)


def _with_scores(positions: list[simulate.Positions], scores: np.ndarray) -> list[simulate.Positions]:
    out, start = [], 0
    for p in positions:
        n = p.entropy.shape[1]
        out.append(dataclasses.replace(p, probe=scores[start : start + n]))
        start += n
    return out


def _heldout(
    candidate: Candidate,
    held: list[simulate.Positions],
    tier_bytes: list[int],
    bottom: np.ndarray,
    top: np.ndarray,
):
    """A setting replayed on held-out text, and the random control at the share it reached."""
    quality = simulate.quality(held, [simulate.route(candidate.config, p) for p in held], tier_bytes)
    return quality, metrics.random_control(bottom, top, quality.top_share)


def calibrate(
    profile: Profile,
    ladder: Ladder,
    calibration: list[BenchPrompt],
    heldout: list[BenchPrompt],
    target_share: float | None,
    target_retained: float | None,
    max_tokens: int,
    progress: Progress | None = None,
    signals: tuple[str, ...] = SIGNALS,
) -> dict:
    """Sweep on calibration prompts, choose, and report the choice measured on held-out prompts."""
    if len(ladder.tiers) < 2:
        raise UsageError(f"profile '{profile.name}' has a single tier: there is nothing to calibrate")
    tier_bytes = [t.bytes_per_token for t in ladder.tiers]
    session, *_, cal = collect_positions(
        ladder, calibration, max_tokens, progress, "calibration prompts", hidden=True
    )
    *_, held = collect_positions(ladder, heldout, max_tokens, progress, "held-out prompts", hidden=True)
    learned, cal, held = train_probe(profile, ladder, session, cal, held)
    if learned["status"] != "trained":
        signals = tuple(s for s in signals if s not in BOTTOM_ONLY_SIGNALS)
    candidates = _sweep(cal, tier_bytes, signals)
    chosen = choose(candidates, target_share, target_retained)
    bottom, top, _ = _pooled(held, "entropy")
    held_quality, random = _heldout(chosen, held, tier_bytes, bottom, top)
    # The best setting of each signal for the same target, on the same held-out text: how the
    # signals compare where it matters (share and retained), not only by AUROC.
    per_signal: dict[str, dict] = {}
    for signal in signals:
        try:
            best = choose([c for c in candidates if c.signal == signal], target_share, target_retained)
        except UsageError as exc:
            per_signal[signal] = {"status": str(exc)}
            continue
        quality, control = _heldout(best, held, tier_bytes, bottom, top)
        per_signal[signal] = {
            "policy": best.policy,
            "tau": best.tau,
            **quality.to_dict(),
            "random_retained": control.mean,
        }
    return {
        "probe": learned,
        "target": {"share": target_share, "retained": target_retained},
        "chosen": {
            "policy": chosen.policy,
            "signal": chosen.signal,
            "tau": chosen.tau,
            "window": chosen.config.window,
            "min_run": chosen.config.min_run,
            "down": chosen.config.downs()[0],
            "calibration": chosen.quality.to_dict(),
        },
        "heldout": {
            **held_quality.to_dict(),
            "random_retained": random.mean,
            "oracle_retained": metrics.oracle(bottom, top, held_quality.top_share),
            "vs_random": held_quality.retained / random.mean if random.mean else math.nan,
        },
        "per_signal_heldout": per_signal,
        "auroc_heldout": aurocs(held),
        "auroc_calibration": aurocs(cal),
        "prompts": {"calibration": [p.id for p in calibration], "heldout": [p.id for p in heldout]},
        "tiers": ladder.tier_names,
        "bytes_per_token": dict(zip(ladder.tier_names, tier_bytes, strict=True)),
        "candidates": len(candidates),
    }
