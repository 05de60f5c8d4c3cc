"""The cloud tier: Anthropic Messages API calls (a span mid-answer, or a whole answer) with budgets.

Off unless asked for. Build settings with `cloud_settings(...)`, check the key with
`require_key()` before loading any model, then call `CloudClient(settings).continue_span(...)`
or `.answer(...)`; any failure is a CloudFailure carrying the text already shown.
"""

from mlxswitch.cloud.budget import CloudBudget, CloudSettings, Totals, cloud_settings
from mlxswitch.cloud.client import (
    CloudBudgetExhausted,
    CloudClient,
    CloudFailure,
    CloudInterrupted,
    CloudReply,
    require_key,
)
from mlxswitch.cloud.pricing import PRICES, PRICES_TAKEN, Price, cost_usd, price_for, usage_counts
from mlxswitch.cloud.span import join_continuation, span_prompt, strip_repeated_prefix

__all__ = [
    "PRICES",
    "PRICES_TAKEN",
    "CloudBudget",
    "CloudBudgetExhausted",
    "CloudClient",
    "CloudFailure",
    "CloudInterrupted",
    "CloudReply",
    "CloudSettings",
    "Price",
    "Totals",
    "cloud_settings",
    "cost_usd",
    "join_continuation",
    "price_for",
    "require_key",
    "span_prompt",
    "strip_repeated_prefix",
    "usage_counts",
]
