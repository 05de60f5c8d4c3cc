"""Cloud tier settings (validated once, with one user-facing message per rule) and its spending."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from mlxswitch.cloud.pricing import (
    PRICES_TAKEN,
    USAGE_FIELDS,
    Price,
    cost_usd,
    require_price,
    usage_counts,
)
from mlxswitch.errors import SettingError

# span: the cloud is the top rung of the ladder; answer: uncertain whole answers are re-asked.
CLOUD_MODES = ("span", "answer")


@dataclass(frozen=True)
class CloudSettings:
    """What the cloud tier may do: which model, how much per call, per session, how patiently."""

    mode: str = "span"  # span: the top rung of the ladder; answer: re-ask uncertain whole answers
    model: str = "claude-haiku-4-5"
    span_tokens: int = 48  # max_tokens of a span continuation
    answer_tokens: int = 1024  # max_tokens of a whole-answer hand-off
    timeout_s: float = 15.0  # connect/read timeout, and the whole span's deadline
    budget_usd: float = 0.05  # per session
    budget_calls: int = 20  # per session
    max_retries: int = 1  # the SDK's own retries (with its backoff) on 408/409/429/5xx/connection
    prices: Price | None = None  # overrides the table (needed for a model it lacks)
    # Hand-off: an answer whose mean token entropy (bits) exceeds this is asked again in the cloud.
    handoff_threshold: float = 2.0

    @property
    def price(self) -> Price:
        """The price this session is charged at; CloudError for a model without one."""
        return require_price(self.model, self.prices)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _whole(key: str, name: str, value: Any, low: int, high: int | None) -> int:
    if _is_int(value) and value >= low and (high is None or value <= high):
        return value
    rule = f"from {low} to {high}" if high is not None else f"of {low} or more"
    raise SettingError(key, f"{name} must be a whole number {rule}, got {value!r}")


def _parse_prices(value: Any) -> Price | None:
    """A Price from a Price, a mapping, 2 or 4 numbers, or a "1,5[,1.25,0.1]" string."""
    if value is None or isinstance(value, Price):
        return value
    if isinstance(value, str):
        try:
            value = [float(part) for part in value.split(",")]
        except ValueError:
            value = None
    elif isinstance(value, Mapping):
        names = ("input", "output", "cache_write", "cache_read")
        value = [value[n] for n in names if n in value] if set(value) <= set(names) else None
    if (
        isinstance(value, (list, tuple))
        and len(value) in (2, 4)
        and all(_is_number(v) and v >= 0 for v in value)
    ):
        return Price.of(*value) if len(value) == 2 else Price(*value)
    raise SettingError(
        "prices",
        "cloud prices must be 2 or 4 numbers of 0 or more (USD per million tokens: "
        f"input, output[, cache write, cache read]), got {value!r}",
    )


def cloud_settings(**values: Any) -> CloudSettings:
    """Validated CloudSettings from keyword values (unset ones keep their defaults).

    A broken value raises SettingError (a UsageError) whose `key` names the setting.
    """
    known = [f.name for f in fields(CloudSettings)]
    for name in values:
        if name not in known:
            raise SettingError(name, f"unknown cloud setting '{name}' (known: {', '.join(known)})")
    merged = {f.name: values.get(f.name, f.default) for f in fields(CloudSettings)}

    if merged["mode"] not in CLOUD_MODES:
        raise SettingError(
            "mode", f"cloud mode must be one of {', '.join(CLOUD_MODES)}, got {merged['mode']!r}"
        )
    model = merged["model"]
    if not isinstance(model, str) or not model or any(c.isspace() for c in model):
        raise SettingError(
            "model", f"cloud model must be a model id such as 'claude-haiku-4-5', got {model!r}"
        )
    for key, name, low, high in (
        ("span_tokens", "cloud span tokens", 1, 1024),
        ("answer_tokens", "cloud answer tokens", 1, 64000),
        ("budget_calls", "cloud call budget", 0, None),
        ("max_retries", "cloud retries", 0, 5),
    ):
        merged[key] = _whole(key, name, merged[key], low, high)
    timeout = merged["timeout_s"]
    if not (_is_number(timeout) and 0 < timeout <= 600):
        raise SettingError(
            "timeout_s", f"cloud timeout must be a number of seconds above 0 and at most 600, got {timeout!r}"
        )
    dollars = merged["budget_usd"]
    if not (_is_number(dollars) and dollars >= 0):
        raise SettingError(
            "budget_usd", f"cloud budget must be a dollar amount of 0 or more, got {dollars!r}"
        )
    merged["timeout_s"], merged["budget_usd"] = float(timeout), float(dollars)
    threshold = merged["handoff_threshold"]
    if not (_is_number(threshold) and threshold >= 0):
        raise SettingError(
            "handoff_threshold",
            f"cloud hand-off threshold must be a number of bits of 0 or more, got {threshold!r}",
        )
    merged["handoff_threshold"] = float(threshold)
    merged["prices"] = _parse_prices(merged["prices"])

    settings = CloudSettings(**merged)
    settings.price  # noqa: B018 — an unpriced model fails here, before any model loads
    return settings


@dataclass
class Totals:
    """Calls, billed tokens and dollars over some stretch (one answer, one session)."""

    calls: int = 0
    failed_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    usd: float = 0.0

    def add(self, counts: Mapping[str, int], usd: float, failed: bool) -> None:
        """Count one call with its usage."""
        self.calls += 1
        self.failed_calls += int(failed)
        for name in USAGE_FIELDS:
            setattr(self, name, getattr(self, name) + counts.get(name, 0))
        self.usd += usd

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready totals (dollars rounded to a millionth)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["usd"] = round(self.usd, 6)
        return out


@dataclass
class CloudBudget:
    """A session's cloud spending against its caps, with the current answer's share apart."""

    settings: CloudSettings
    session: Totals = field(default_factory=Totals)
    answer: Totals = field(default_factory=Totals)

    def start_answer(self) -> None:
        """Begin a new answer: its totals restart, the session's keep going."""
        self.answer = Totals()

    def refusal(self, estimate_usd: float = 0.0) -> str | None:
        """Why the next call (costing up to estimate_usd) would break a cap, or None if allowed."""
        s = self.settings
        if self.session.calls >= s.budget_calls:
            return f"cloud call budget spent ({self.session.calls} of {s.budget_calls} calls)"
        # Refuse a call that could overshoot: the cap is a promise, not a trigger after the fact.
        if self.session.usd + estimate_usd > s.budget_usd:
            return (
                f"cloud budget spent (${self.session.usd:.4f} of ${s.budget_usd:.4f}; "
                f"the next call could cost up to ${estimate_usd:.4f})"
            )
        return None

    def charge(self, usage: Any, failed: bool = False) -> float:
        """Count one call and its usage (SDK Usage or dict, None when unknown); returns its dollars."""
        counts = usage_counts(usage) if usage is not None else {}
        usd = cost_usd(self.settings.model, counts, self.settings.prices) if counts else 0.0
        self.session.add(counts, usd, failed)
        self.answer.add(counts, usd, failed)
        return usd

    def as_dict(self) -> dict[str, Any]:
        """Caps and totals, JSON-ready."""
        s = self.settings
        return {
            "model": s.model,
            "prices_taken": PRICES_TAKEN if s.prices is None else "given",
            "limits": {"usd": s.budget_usd, "calls": s.budget_calls},
            "session": self.session.as_dict(),
            "answer": self.answer.as_dict(),
        }
