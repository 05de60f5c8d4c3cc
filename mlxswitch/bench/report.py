"""Figures per arm from a BenchRun's raw records: speed (median, min–max over repeats), cost,
Apple-silicon projections (labelled as such), and teacher-forced quality with its controls."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from ..decoding.tiers import Ladder
from ..json_numbers import finite
from ..profiles import Profile
from ..routing.router import POLICY_NAMES
from . import metrics, seconds, simulate
from .runner import Arm, BenchRun, sweep_config

GAIN_NATS = 0.1  # a position "needs" the top tier when it lowers the NLL by more than this
PLOT_POINTS = 25  # thresholds in the dense teacher-forced sweep drawn as each policy's line


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else math.nan


def _speed_of(
    records: list[dict], alone: dict[str, float], top_tokens: dict[str, list[int]], top_name: str
) -> dict[str, float]:
    """One repeat of one arm, pooled over its prompts (token-weighted)."""
    gen = sum(r["generated"] for r in records)
    decoded = sum(max(r["generated"] - 1, 0) for r in records)
    decode_s = sum(r["decode_s"] for r in records)
    firsts = [r["first_token_s"] for r in records if r["first_token_s"] is not None]
    ideal = 0.0
    for r in records:  # every tier that computed a decoded position, at its alone speed
        for token in r["tokens"][1:]:
            ideal += sum(alone.get(t, math.nan) for t in token.get("tried", [token["tier"]]))
    agree = []
    for r in records:
        ref = top_tokens.get(r["prompt_id"], [])
        ids = [t["id"] for t in r["tokens"]]
        longest = max(len(ref), len(ids))
        agree.append(sum(a == b for a, b in zip(ids, ref, strict=False)) / longest if longest else 1.0)
    checked = [r["correct"] for r in records if r["correct"] is not None]
    out = {
        "prompt_tok_per_s": _ratio(sum(r["prefilled"] for r in records if r["first_token_s"]), sum(firsts)),
        "decode_tok_per_s": _ratio(decoded, decode_s),
        "first_token_s": float(np.mean(firsts)) if firsts else math.nan,
        "peak_memory_gb": max(r["peak_memory_gb"] for r in records),
        "switches_per_100": 100 * _ratio(sum(r["switches"] for r in records), gen),
        "catch_up_per_100": 100 * _ratio(sum(r["catch_up_tokens"] for r in records), gen),
        "bytes_per_token": _ratio(sum(r["mean_bytes_per_token"] * r["generated"] for r in records), gen),
        "top_share": _ratio(sum(r["tier_counts"].get(top_name, 0) for r in records), gen),
        "overhead": _ratio(decode_s, ideal),
        "agreement": float(np.mean(agree)) if agree else math.nan,
        "accuracy": float(np.mean(checked)) if checked else math.nan,
    }
    drafts = [r["draft_share"] for r in records if r.get("draft_share") is not None]
    if drafts:
        out["draft_share"] = float(np.mean(drafts))
    return out


def _alone_seconds(runs: list[dict], arms: list[Arm], names: list[str], repeat: int) -> dict[str, float]:
    """Seconds per decoded token of each tier alone in one repeat (the overhead's ideal)."""
    out = {}
    for arm in arms:
        if arm.kind == "tier":
            records = [r for r in runs if r["arm"] == arm.name and r["repeat"] == repeat]
            decoded = sum(max(r["generated"] - 1, 0) for r in records)
            out[names[arm.rung()]] = _ratio(sum(r["decode_s"] for r in records), decoded)
    return out


def _quality(arm: Arm, run: BenchRun, profile: Profile, tier_bytes: list[int]) -> simulate.Quality:
    n = len(tier_bytes)
    if arm.kind in ("tier", "mlx-lm"):
        tried = simulate.forced(run.positions, arm.rung())
    elif arm.kind == "speculative" or arm.decoding.verify:  # lossless: the large model's tokens
        tried = simulate.forced(run.positions, n - 1)
    else:
        tried = [simulate.route(arm.engine_config(), p) for p in run.positions]
    return simulate.quality(run.positions, tried, tier_bytes)


def _pooled(run: BenchRun) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not run.positions:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    bottom = np.concatenate([p.nll[0] for p in run.positions])
    top = np.concatenate([p.nll[-1] for p in run.positions])
    signal = np.concatenate([p.entropy[0] for p in run.positions])
    return bottom, top, signal


def summarize_bench(run: BenchRun, profile: Profile, ladder: Ladder, device_name: str | None = None) -> dict:
    """Per-arm figures, the curves for the plot, and the signals' AUROC."""
    names, n = ladder.tier_names, len(ladder.tiers)
    tier_bytes = [t.bytes_per_token for t in ladder.tiers]
    repeats = sorted({r["repeat"] for r in run.runs})
    top_tokens = {}
    for r in run.runs:  # the top tier's own tokens per prompt and repeat, for greedy agreement
        if r["arm"] == f"{names[-1]} alone":
            top_tokens[(r["repeat"], r["prompt_id"])] = [t["id"] for t in r["tokens"]]
    bottom, top, signal = _pooled(run)
    arms = []
    for arm in run.arms:
        per_repeat = defaultdict(list)
        for repeat in repeats:
            records = [r for r in run.runs if r["arm"] == arm.name and r["repeat"] == repeat]
            if not records:
                continue
            alone = _alone_seconds(run.runs, run.arms, names, repeat)
            tops = {pid: ids for (rep, pid), ids in top_tokens.items() if rep == repeat}
            for key, value in _speed_of(records, alone, tops, names[-1]).items():
                per_repeat[key].append(value)
        speed = {key: metrics.summarize(values) for key, values in per_repeat.items()}
        quality = _quality(arm, run, profile, tier_bytes)
        entry = {**arm.to_dict(), "speed": speed, "quality": quality.to_dict()}
        if n > 1 and bottom.size and math.isfinite(quality.top_share):
            entry["random_control"] = metrics.random_control(bottom, top, quality.top_share).to_dict()
            entry["oracle"] = metrics.oracle(bottom, top, quality.top_share)
        bpt = speed.get("bytes_per_token", {}).get("median", math.nan)
        if bpt and math.isfinite(bpt) and bpt > 0:
            entry["projection"] = {
                "note": "projection, not a measurement: peak bandwidth ÷ weight "
                "bytes read per token; 55–85% of it is attainable",
                "tok_per_s_bound": metrics.apple_bound_tok_s(bpt),
            }
            chip = _chip(device_name)
            tg = speed.get("decode_tok_per_s", {}).get("median", math.nan)
            if chip and math.isfinite(tg):
                entry["projection"]["achieved_share_of_bound"] = {
                    chip: tg / entry["projection"]["tok_per_s_bound"][chip]
                }
        arms.append(entry)
    where = seconds.where_seconds([a.name for a in run.arms], run.runs, names, tier_bytes)
    for entry in arms:
        entry["seconds"] = where["arms"][entry["name"]]
    return {
        "arms": arms,
        "where_seconds": {"models": where["models"], "floor_rates": where["floor_rates"]},
        "curves": _curves(run, bottom, top, signal, tier_bytes),
        "auroc": _auroc(bottom, top, signal),
        "thresholds": run.taus,
    }


def _chip(device_name: str | None) -> str | None:
    # Longest name first: "M3 Max" before "M3".
    for chip in sorted(metrics.APPLE_BANDWIDTH_GBPS, key=len, reverse=True):
        if device_name and chip in device_name:
            return chip
    return None


def _curves(run: BenchRun, bottom, top, signal, tier_bytes) -> dict:
    n = len(tier_bytes)
    if n < 2 or bottom.size == 0:
        return {}
    grid = metrics.share_grid()
    oracle = [metrics.oracle(bottom, top, s) for s in grid]
    randoms = [metrics.random_control(bottom, top, s) for s in grid]
    lines = {}
    taus = simulate.sweep_thresholds(run.positions, PLOT_POINTS)
    for policy in POLICY_NAMES:
        points = []
        for tau in sorted(set(taus)):
            config = sweep_config(policy, tau, n)
            q = simulate.quality(
                run.positions, [simulate.route(config, p) for p in run.positions], tier_bytes
            )
            points.append({"tau": tau, **q.to_dict()})
        lines[policy] = points
    lo, hi = tier_bytes[0], tier_bytes[-1]
    return {
        "share": grid.tolist(),
        "oracle": finite(oracle),
        "random": finite([r.mean for r in randoms]),
        "random_p5": finite([r.p5 for r in randoms]),
        "random_p95": finite([r.p95 for r in randoms]),
        # Controls know where to go without computing the cheap step: their cheapest cost.
        "control_bytes_per_token": [lo + s * (hi - lo) for s in grid.tolist()],
        "policies": lines,
    }


def _auroc(bottom, top, signal) -> dict:
    """How well the bottom tier's entropy at a position predicts that the top tier helps there."""
    if bottom.size == 0:
        return {}
    labels = (bottom - top) > GAIN_NATS
    value = metrics.auroc(signal, labels)
    return {
        "entropy": finite(value),
        "label": f"gain > {GAIN_NATS} nat",
        "positives": int(labels.sum()),
        "positions": int(labels.size),
    }
