"""The HumanEval picture: pass@1 against top-tier share and against seconds per problem."""

from __future__ import annotations

from pathlib import Path

from ...routing.registry import POLICIES, POLICY_BY_NAME
from ..plot import _pyplot, save_figure
from .arms import matched_arm

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
# Points take colours no policy line uses, so a point never reads as part of a line.
POINT_COLOURS = tuple(
    colour
    for colour in ("tab:blue", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan")
    if colour not in {policy.colour for policy in POLICIES}
)


def _xy(arms: list[dict], x: str) -> tuple[list, list, list]:
    points = sorted(
        ((a[x], a["pass@1"], a) for a in arms if a.get(x) is not None and a["pass@1"] is not None),
        key=lambda p: p[:2],
    )
    return [p[0] for p in points], [p[1] for p in points], [p[2] for p in points]


def _random_lines(arms: list[dict]) -> list[tuple[str | None, str, list[dict]]]:
    """The random controls as lines: one per swept policy (the controls of its points, in its
    colour), and one grey line for the controls of every other routed arm."""
    by_name = {arm["name"]: arm for arm in arms}
    lines: dict[str | None, list[dict]] = {}
    for arm in arms:
        if arm["kind"] == "random":
            matched = by_name.get(matched_arm(arm["name"]), {})
            policy = matched.get("policy") if matched.get("kind") == "sweep" else None
            lines.setdefault(policy, []).append(arm)
    return [
        (policy, POLICY_BY_NAME[policy].colour if policy else "grey", controls)
        for policy, controls in lines.items()
    ]


def _label(arm: dict) -> str:
    verified = arm.get("verified") and arm["kind"] == "profile"  # a profile that decodes verified
    return arm["name"] + (" · verified" if verified else "")


def save_humaneval_plot(summary: dict, title: str, path: Path) -> None:
    """Two panels, pass@1 with 95% intervals: swept policies and their random controls as lines,
    tiers, profile and mlx-lm as points, the oracle as a line at its pass@1 (no speed: a control)."""
    plt = _pyplot()
    fig, (by_share, by_time) = plt.subplots(1, 2, figsize=(12, 5), dpi=110)
    # Every figure over the problems every arm answered (as the title says), so points compare.
    arms = [{**arm, **(arm.get("side_by_side") or {})} for arm in summary["arms"]]
    for axis, x in ((by_share, "top_share"), (by_time, "seconds_per_problem")):
        for spec in POLICIES:
            xs, ys, _ = _xy([a for a in arms if a["kind"] == "sweep" and a["policy"] == spec.name], x)
            if xs:
                axis.plot(xs, ys, marker=".", color=spec.colour, label=f"{spec.name} (threshold sweep)")
        for policy, colour, controls in _random_lines(arms):
            xs, ys, _ = _xy(controls, x)
            if xs:
                matched = f"{policy}'s shares" if policy else "matched share"
                axis.plot(xs, ys, ls="--", color=colour, marker=".", label=f"random routing ({matched})")
        oracle = next((a for a in arms if a["kind"] == "oracle" and a["pass@1"] is not None), None)
        if oracle is not None:
            axis.axhline(oracle["pass@1"], color="black", lw=1, ls=":", label="oracle (control)")
            if x == "top_share" and oracle["top_share"] is not None:
                axis.scatter([oracle["top_share"]], [oracle["pass@1"]], color="black", marker="x", zorder=5)
        colours = iter(POINT_COLOURS)
        for arm in arms:
            if arm["kind"] in POINT_KINDS and arm.get(x) is not None and arm["pass@1"] is not None:
                low, high = arm["pass@1_95"]
                axis.errorbar(
                    [arm[x]],
                    [arm["pass@1"]],
                    yerr=[[arm["pass@1"] - low], [high - arm["pass@1"]]],
                    fmt=MARKERS.get(arm["kind"], "s"),
                    color=next(colours, "black"),
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
