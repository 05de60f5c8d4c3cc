"""Anthropic model prices and the dollar cost of one response, from its usage fields."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mlxswitch.errors import CloudError

# As published on Anthropic's pricing page (platform.claude.com/docs/en/about-claude/pricing)
# then; prices change, so a user can always pass their own (CloudSettings.prices).
PRICES_TAKEN = "2026-02"

USAGE_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)


@dataclass(frozen=True)
class Price:
    """USD per million tokens: input, output, cache write (5-minute TTL), cache read."""

    input: float
    output: float
    cache_write: float
    cache_read: float

    @classmethod
    def of(cls, input: float, output: float) -> Price:
        """A price with the standard cache multipliers: writes 1.25× input, reads 0.1× input."""
        return cls(input, output, input * 1.25, input * 0.1)


# Keyed by the alias ids; dated ids (claude-haiku-4-5-20251001) resolve through `price_for`.
# Cache writes are the 5-minute rate: we never ask for 1-hour caching.
PRICES: dict[str, Price] = {
    "claude-opus-4-6": Price(5.0, 25.0, 6.25, 0.50),
    "claude-opus-4-5": Price(5.0, 25.0, 6.25, 0.50),
    "claude-opus-4-1": Price(15.0, 75.0, 18.75, 1.50),
    "claude-opus-4-0": Price(15.0, 75.0, 18.75, 1.50),
    "claude-sonnet-4-6": Price(3.0, 15.0, 3.75, 0.30),
    "claude-sonnet-4-5": Price(3.0, 15.0, 3.75, 0.30),
    "claude-sonnet-4-0": Price(3.0, 15.0, 3.75, 0.30),
    "claude-haiku-4-5": Price(1.0, 5.0, 1.25, 0.10),
    "claude-3-5-haiku": Price(0.80, 4.0, 1.0, 0.08),
    "claude-3-haiku": Price(0.25, 1.25, 0.30, 0.03),
}

# Older dated ids put the date where newer ones put nothing: claude-opus-4-20250514 is 4-0.
_ALIASES = {"claude-opus-4": "claude-opus-4-0", "claude-sonnet-4": "claude-sonnet-4-0"}
_DATED = re.compile(r"^(?P<base>.+?)-(?:\d{8}|latest)$")


def price_for(model: str) -> Price | None:
    """The table price of a model id (alias or dated), or None when we do not know it."""
    if model in PRICES:
        return PRICES[model]
    match = _DATED.match(model)
    if match is None:
        return None
    base = _ALIASES.get(match["base"], match["base"])
    return PRICES.get(base)


def require_price(model: str, price: Price | None = None) -> Price:
    """The given price, else the table's; CloudError when neither exists."""
    found = price or price_for(model)
    if found is None:
        raise CloudError(
            f"no price known for cloud model '{model}' (table as of {PRICES_TAKEN}): "
            "set the cloud prices (USD per million input and output tokens) to use it"
        )
    return found


def usage_counts(usage: Any) -> dict[str, int]:
    """The four billed token counts of an SDK Usage object or a dict; missing or None → 0."""
    counts = {}
    for field in USAGE_FIELDS:
        if isinstance(usage, Mapping):
            value = usage.get(field)
        else:
            value = getattr(usage, field, None)
        counts[field] = int(value) if isinstance(value, (int, float)) and value > 0 else 0
    return counts


def cost_usd(model: str, usage: Any, price: Price | None = None) -> float:
    """Dollars billed for one response's usage (input_tokens excludes cached tokens)."""
    p = require_price(model, price)
    n = usage_counts(usage)
    # The API counts cache writes and reads apart from input_tokens: each has its own rate.
    per_million = (
        n["input_tokens"] * p.input
        + n["output_tokens"] * p.output
        + n["cache_creation_input_tokens"] * p.cache_write
        + n["cache_read_input_tokens"] * p.cache_read
    )
    return per_million / 1_000_000


def estimate_usd(price: Price, prompt_chars: int, max_tokens: int) -> float:
    """Worst-case dollars of a call before it is made: every output token, ~3 chars per input token."""
    # Three characters a token over-counts English prose a little: the estimate errs high.
    return (prompt_chars / 3 * price.input + max_tokens * price.output) / 1_000_000
