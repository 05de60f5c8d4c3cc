"""The bench's picture: retained fidelity against top-tier share and against bytes per token."""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError
from ..files import atomic_file
from ..routing.registry import POLICY_BY_NAME


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'mlxswitch[plot]'") from None
    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def save_figure(plt, fig, title: str, path: Path) -> None:
    """Title a figure and write it as a PNG, atomically (temporary name, rename); then close it."""
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    try:
        with atomic_file(path, "--plot", binary=True) as handle:
            fig.savefig(handle, format="png")
    finally:
        plt.close(fig)


def save_plot(summary: dict, title: str, path: Path) -> None:
    """Write a two-panel PNG readable without the table; atomically (temporary name, rename).
    One tier has no routing to draw: its speed and where its seconds went instead."""
    plt = _pyplot()
    if len(summary["profile"]["tiers"]) < 2:
        _save_single_tier(plt, summary, title, path)
        return
    curves = summary.get("curves") or {}
    fig, (by_share, by_bytes) = plt.subplots(1, 2, figsize=(12, 5), dpi=110)
    if curves:
        share = curves["share"]
        by_share.plot(share, curves["oracle"], color="black", lw=1.5, label="oracle (ceiling)")
        by_share.plot(share, curves["random"], color="grey", ls="--", label="random routing")
        lo = [v if v is not None else float("nan") for v in curves["random_p5"]]
        hi = [v if v is not None else float("nan") for v in curves["random_p95"]]
        by_share.fill_between(share, lo, hi, color="grey", alpha=0.15, label="random 5–95%")
        mb = [b / 1e6 for b in curves["control_bytes_per_token"]]
        by_bytes.plot(mb, curves["oracle"], color="black", lw=1.5, label="oracle (ceiling)")
        by_bytes.plot(mb, curves["random"], color="grey", ls="--", label="random routing")
        for policy, points in curves["policies"].items():
            xs = [p["top_share"] for p in points]
            ys = [p["retained"] for p in points]
            colour = POLICY_BY_NAME[policy].colour
            by_share.plot(xs, ys, marker=".", color=colour, label=f"{policy} (threshold sweep)")
            by_bytes.plot(
                [p["bytes_per_token"] / 1e6 for p in points],
                ys,
                marker=".",
                color=colour,
                label=f"{policy} (threshold sweep)",
            )
    for arm in summary["arms"]:
        q = arm["quality"]
        if arm["kind"] not in ("tier", "profile") or q["retained"] is None:
            continue
        marker = "s" if arm["kind"] == "tier" else "*"
        by_share.scatter([q["top_share"]], [q["retained"]], marker=marker, s=70, zorder=5, label=arm["name"])
        by_bytes.scatter(
            [q["bytes_per_token"] / 1e6], [q["retained"]], marker=marker, s=70, zorder=5, label=arm["name"]
        )
    by_share.set_xlabel("top-tier share of tokens")
    by_bytes.set_xlabel("weights read per token (MB)")
    for axis in (by_share, by_bytes):
        axis.set_ylabel("retained fidelity (0 = bottom tier, 1 = top tier)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7, loc="lower right")
    save_figure(plt, fig, title, path)


def _save_single_tier(plt, summary: dict, title: str, path: Path) -> None:
    """One tier: each arm's decode and prompt tok/s (median, min–max over repeats), and its seconds
    split into prefill, decode passes and the rest (one bar of total time where it has no ledger)."""
    arms = summary["arms"]
    names = [arm["name"] for arm in arms]
    fig, (speed, seconds) = plt.subplots(1, 2, figsize=(12, 5), dpi=110)
    width = 0.38
    for offset, key, label in (
        (-width / 2, "decode_tok_per_s", "decode"),
        (width / 2, "prompt_tok_per_s", "prompt"),
    ):
        figures = [arm["speed"].get(key) or {} for arm in arms]
        median = [_num(f.get("median")) for f in figures]
        low = [max(0.0, m - _num(f.get("min"), m)) for m, f in zip(median, figures, strict=True)]
        high = [max(0.0, _num(f.get("max"), m) - m) for m, f in zip(median, figures, strict=True)]
        xs = [i + offset for i in range(len(arms))]
        speed.bar(xs, median, width, yerr=[low, high], capsize=3, label=f"{label} tok/s (median, min–max)")
    speed.set_ylabel("tokens per second")
    bottom = [0.0] * len(arms)
    parts = (
        ("prefill_s", "prefill passes"),
        ("decode_s", "decode passes"),
        ("rest_s", "rest (sampling, Python)"),
    )
    for key, label in parts:
        values = []
        for arm in arms:
            w = arm.get("seconds") or {}
            if key == "decode_s":
                values.append(sum((w.get("top_s") or {}).values()) + _num(w.get("bottom_s"), 0.0))
            else:
                values.append(_num(w.get(key), 0.0))
        seconds.bar(range(len(arms)), values, 0.6, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    untimed = [
        (i, _num((arm.get("seconds") or {}).get("total_s"), 0.0))
        for i, arm in enumerate(arms)
        if (arm.get("seconds") or {}).get("passes") is None
    ]
    if untimed:
        seconds.bar(
            [i for i, _ in untimed],
            [t for _, t in untimed],
            0.6,
            color="lightgrey",
            hatch="//",
            label="total (no pass ledger)",
        )
    seconds.set_ylabel("seconds, summed over the arm's answers")
    for axis in (speed, seconds):
        axis.set_xticks(range(len(arms)), names, rotation=15, ha="right", fontsize=8)
        axis.grid(alpha=0.3, axis="y")
        axis.legend(fontsize=7, loc="upper right")
    save_figure(plt, fig, title, path)


def _num(value, default: float = 0.0) -> float:
    return default if value is None or value != value else float(value)
