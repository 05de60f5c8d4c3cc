"""The cloud tier: Anthropic Messages API calls (a span mid-answer, or a whole answer) with budgets.

Off unless asked for. Build settings with `cloud_settings(...)`, check the key with
`require_key()` before loading any model, then call `CloudClient(settings).continue_span(...)`
or `.answer(...)`; any failure is a CloudFailure carrying the text already shown.
"""

from mlxswitch.cloud.budget import (
    CLOUD_MODES,
    CloudBudget,
    CloudSettings,
    Totals,
    cloud_settings,
)
from mlxswitch.cloud.pricing import (
    PRICES,
    PRICES_TAKEN,
    Price,
    cost_usd,
    price_for,
    usage_counts,
)
from mlxswitch.cloud.span import join_continuation, span_prompt, strip_repeated_prefix

# The client imports the anthropic SDK (seconds on a cold start): only a run that calls the
# cloud pays for it, not every profile lookup that reads cloud settings.
_CLIENT_NAMES = (
    "CloudBudgetExhausted",
    "CloudClient",
    "CloudFailure",
    "CloudInterrupted",
    "CloudReply",
    "require_key",
)


def __getattr__(name: str):
    if name in _CLIENT_NAMES:
        from mlxswitch.cloud import client

        return getattr(client, name)
    raise AttributeError(f"module 'mlxswitch.cloud' has no attribute {name!r}")


__all__ = [
    "CLOUD_MODES",
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
