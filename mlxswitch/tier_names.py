"""What a ladder's tiers are called, bottom first: one rule for profiles, ladders and estimates."""

from __future__ import annotations

from collections.abc import Sequence

CLOUD_TIER = "cloud"  # on top of the local tiers when the cloud takes spans


def local_tier_names(models: int, gears: Sequence[int] = ()) -> tuple[str, ...]:
    """The local tiers of `models` models (1 or 2) or of one model's gears: g<bits> a gear,
    small and large for a pair, model for one."""
    if gears:
        return tuple(f"g{bits}" for bits in gears)
    return ("small", "large") if models == 2 else ("model",)
