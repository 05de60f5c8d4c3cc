"""How an answer is decoded, beside the router's thresholds: routed or verified, and how it drafts.

- Routed (the default): each token is made by the tier the router's policy chose.
- Verified (`verify`): the bottom tier drafts while its signal stays at or under the router's first
  up threshold, and the top tier checks each draft in one pass (decoding/verify.py): every token
  is the top tier's own. The router's policy, window and min run do not apply.
- `draft`: with verify, how long each draft is ("adaptive": what pays, from measured pass costs and
  the kept share, decoding/drafting.py; "fixed": up to the longest draft, while the drafter is sure).
- `lookup`: whether drafts may also come from the sequence itself (prompt lookup), checked by the
  top tier with verify, else by the rung the policy chose (decoding/lookup_rounds.py).

Pure Python: models.toml, the flags and the bench build one of these and check it here, once.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SettingError
from ..routing.registry import SIGNAL_BY_NAME
from ..routing.router import RouterConfig

DRAFT_RULES = ("adaptive", "fixed")
# The settings models.toml and the flags of `chat` and `serve` set by these names.
MODE_SETTINGS = ("verify", "draft", "lookup")


@dataclass(frozen=True)
class DecodingMode:
    """Routed or verified decoding, the draft rule, and prompt lookup (checked when built)."""

    verify: bool = False
    draft: str = "adaptive"
    lookup: bool = True

    def __post_init__(self) -> None:
        if self.draft not in DRAFT_RULES:
            raise SettingError(
                "draft", f"the draft rule must be one of {', '.join(DRAFT_RULES)} (got {self.draft!r})"
            )

    def validate(self, router: RouterConfig, num_tiers: int) -> None:
        """Refuse a mode the router's settings or a ladder of `num_tiers` cannot run, in one line."""
        if not self.verify:
            return
        if num_tiers != 2:
            raise SettingError(
                "verify",
                f"verify needs two local tiers, a drafter and a checker (this ladder has {num_tiers})",
            )
        if SIGNAL_BY_NAME[router.signal].bottom_only:
            raise SettingError(
                "verify", f"verify ends drafts on a signal of the logits, not the {router.signal}"
            )
        if router.normalize:
            # VerifyLoop compares the drafter's signal in its own units (bits for entropy).
            raise SettingError(
                "normalize", "verify compares the drafter's signal in its own units: drop normalize"
            )

    def describe(self, router: RouterConfig, local_tiers: int, one_cache: bool = False) -> str:
        """How a ladder of `local_tiers` decodes, in a few words (`mlxswitch models`). Routed, lookup
        is off where the tiers share one cache (gears) or the probe routes (loop.py says why)."""
        if self.verify:
            return f"verified ({self.draft} drafts{', lookup' if self.lookup else ''})"
        if local_tiers < 2:
            return "one tier"
        lookup = self.lookup and not one_cache and not SIGNAL_BY_NAME[router.signal].bottom_only
        return f"routed ({router.policy} on {router.signal}{', lookup' if lookup else ''})"

    def settings(self) -> dict:
        """The settings a record or a profile rebuilds this mode from (the draft rule with verify)."""
        return {
            "verify": self.verify,
            **({"draft": self.draft} if self.verify else {}),
            "lookup": self.lookup,
        }

    @classmethod
    def of_record(cls, arm_or_settings: dict) -> DecodingMode:
        """The mode a record names: its "decoding" entry, or in records made before the mode was
        its own setting, the same keys in its "router" entry."""
        kept = arm_or_settings.get("decoding") or arm_or_settings.get("router") or {}
        return cls(**{key: kept[key] for key in MODE_SETTINGS if key in kept})
