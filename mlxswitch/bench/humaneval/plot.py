"""The HumanEval picture: pass@1 against top-tier share and against seconds per problem."""

from __future__ import annotations

from pathlib import Path

from ...routing.registry import POLICIES
from ..plot import _pyplot, save_figure

POINT_KINDS = (
    "tier",
    "profile",
    "calibrated",
    "verify",
    "mlx-lm",
    "mlx-lm-fp32",
    "speculative",
    "speculative-ours",
    "speculative-fp32",
)
MARKERS = {"profile": "*", "calibrated": "*", "verify": "D"}


def _xy(arms: list[dict], x: str) -> tuple[list, list, list]:
    points = sorted(
        ((a[x], a["pass@1"], a) for a in arms if a.get(x) is not None and a["pass@1"] is not None),
        key=lambda p: p[:2],
    )
    return [p[0] for p in points], [p[1] for p in points], [p[2] for p in points]


def _label(arm: dict) -> str:
    verified = arm.get("verified") and arm["kind"] == "profile"  # a profile that decodes verified
    return arm["name"] + (" · verified" if verified else "")


def save_humaneval_plot(summary: dict, title: str, path: Path) -> None:
    """Two panels, pass@1 with 95% intervals: swept policies and the random control as lines,
    tiers, profile and mlx-lm as points, the oracle as a line at its pass@1 (no speed: a control)."""
    plt = _pyplot()
    fig, (by_share, by_time) = plt.subplots(1, 2, figsize=(12, 5), dpi=110)
    # Every figure over the problems every arm answered (as the title says), so points compare.
    arms = [{**arm, **(arm.get("side_by_side") or {})} for arm in summary["arms"]]
    for axis, x in ((by_share, "top_share"), (by_time, "seconds_per_problem")):
        for policy in POLICIES:
            xs, ys, _ = _xy([a for a in arms if a["kind"] == "sweep" and a["policy"] == policy.name], x)
            if xs:
                axis.plot(xs, ys, marker=".", color=policy.colour, label=f"{policy.name} (threshold sweep)")
        xs, ys, _ = _xy([a for a in arms if a["kind"] == "random"], x)
        if xs:
            axis.plot(xs, ys, ls="--", color="grey", marker=".", label="random routing (matched share)")
        oracle = next((a for a in arms if a["kind"] == "oracle" and a["pass@1"] is not None), None)
        if oracle is not None:
            axis.axhline(oracle["pass@1"], color="black", lw=1, ls=":", label="oracle (control)")
            if x == "top_share" and oracle["top_share"] is not None:
                axis.scatter([oracle["top_share"]], [oracle["pass@1"]], color="black", marker="x", zorder=5)
        for arm in arms:
            if arm["kind"] in POINT_KINDS and arm.get(x) is not None and arm["pass@1"] is not None:
                low, high = arm["pass@1_95"]
                axis.errorbar(
                    [arm[x]],
                    [arm["pass@1"]],
                    yerr=[[arm["pass@1"] - low], [high - arm["pass@1"]]],
                    fmt=MARKERS.get(arm["kind"], "s"),
                    ms=7,
                    capsize=3,
                    label=_label(arm),
                )
        axis.set_ylabel("pass@1 (greedy; bars: 95% Wilson interval)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7, loc="best")
    by_share.set_xlabel("top-tier share of tokens")
    by_time.set_xlabel("seconds per problem (this machine)")
    save_figure(plt, fig, title, path)
