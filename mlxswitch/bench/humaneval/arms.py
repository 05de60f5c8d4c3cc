"""Which arms a HumanEval run decodes with: the bench's own (runner.make_arms) and the controls.

Bottom and top alone always run: every other figure is read against them. `--arms` picks among
the groups below; random controls match every routed arm picked (the profile, each swept point).
"""

from __future__ import annotations

from ...decoding.tiers import Ladder
from ...errors import UsageError
from ...profiles import Profile
from ...routing.registry import POLICY_BY_NAME
from ..runner import Arm, forced_config, make_arms

GROUPS = ("profile", *POLICY_BY_NAME, "random", "oracle", "mlx-lm", "speculative")
QUICK_GROUPS = ("profile", "peek", "random", "oracle")
ROUTED_KINDS = ("profile", "sweep")
CONTROL_KINDS = ("random", "oracle")


def parse_groups(text: str | None, quick: bool = False) -> tuple[str, ...]:
    """`--arms a,b,…` (or all; --quick: QUICK_GROUPS) in GROUPS order; a UsageError for an unknown one."""
    if text is None:
        return QUICK_GROUPS if quick else GROUPS
    asked = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [part for part in asked if part not in GROUPS]
    if unknown:
        raise UsageError(
            f"--arms: unknown arm group '{unknown[0]}' (choose among {', '.join(GROUPS)}; "
            "bottom and top alone always run)"
        )
    return tuple(group for group in GROUPS if group in asked)


def _group(arm: Arm) -> str | None:
    if arm.kind == "sweep":
        return arm.policy
    return None if arm.kind == "tier" else arm.kind


def matched_arm(arm: Arm) -> str:
    """The routed arm whose per-problem share a random control spends."""
    return arm.name.split("@", 1)[1]


def humaneval_arms(profile: Profile, ladder: Ladder, taus: list[float], groups: tuple[str, ...]) -> list[Arm]:
    """Tiers alone, the routed arms, their random controls, the oracle, then mlx-lm's arms."""
    n = len(ladder.tiers)
    bench = [
        arm
        for arm in make_arms(profile, ladder, taus)
        if arm.kind == "tier" and arm.tier in (0, n - 1) or _group(arm) in groups
    ]
    own = [arm for arm in bench if arm.kind not in ("mlx-lm", "speculative")]
    stock = [arm for arm in bench if arm.kind in ("mlx-lm", "speculative")]
    controls = []
    if n > 1 and "random" in groups:
        controls += [
            Arm(f"random@{arm.name}", "random", forced_config(n, 0))
            for arm in own
            if arm.kind in ROUTED_KINDS
        ]
    if n > 1 and "oracle" in groups:
        controls.append(Arm("oracle", "oracle", forced_config(n, 0)))
    return own + controls + stock
