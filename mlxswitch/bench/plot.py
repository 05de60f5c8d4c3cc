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
    """Write a two-panel PNG readable without the table; atomically (temporary name, rename)."""
    plt = _pyplot()
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
