"""Entropy router (pure Python): picks the tier of the next token from recent entropies.

Contract (the telemetry is re-derivable from it):
- State: rung r (0 = bottom), a window W of the last `window` entropies, a count c of tokens
  emitted since the last move. Boundary i has up[i] and down[i] <= up[i] (hysteresis).
- Start: r = 0, W = [H0] (H0: bottom tier's entropy at the end of the prompt); while
  r < top and mean(W) > up[r]: r += 1. c = 0.
- After each token with entropy H: append H to W, c += 1; if c >= min_run: if r < top and
  mean(W) > up[r]: r += 1, c = 0; elif r > 0 and mean(W) < down[r-1]: r -= 1, c = 0.
- normalize: H / log2(V) is compared instead of H.
- Guard: NaN, or H above guard_fraction * log2(V) for guard_count tokens in a row, jumps to
  the top local rung at once (c = 0); such a move is marked guard=True.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from .errors import UsageError


@dataclass(frozen=True)
class RouterConfig:
    """Thresholds and timing of the router."""

    up: tuple[float, ...]
    down: tuple[float, ...] | None = None
    window: int = 5
    min_run: int = 10
    normalize: bool = False
    vocab_size: int | None = None
    guard_fraction: float = 0.9
    guard_count: int = 2
    top_local: int | None = None

    def downs(self) -> tuple[float, ...]:
        """Down thresholds; without explicit ones, equal to up (no hysteresis band)."""
        return tuple(self.down) if self.down is not None else tuple(self.up)

    def validate(self, num_tiers: int) -> None:
        """Refuse settings the router cannot honour, with a user-facing message."""
        if num_tiers == 1 and self.up:
            raise UsageError("this ladder has a single tier: there are no thresholds to set")
        if len(self.up) != num_tiers - 1:
            raise UsageError(f"{num_tiers} tiers need {num_tiers - 1} up threshold(s), got {len(self.up)}")
        if len(self.downs()) != len(self.up):
            raise UsageError(f"need {len(self.up)} down threshold(s), got {len(self.downs())}")
        for i, (u, d) in enumerate(zip(self.up, self.downs())):
            if d > u:
                raise UsageError(f"down threshold {d} exceeds up threshold {u} at boundary {i}")
        if self.window < 1 or self.min_run < 1:
            raise UsageError("window and min run must be at least 1")


@dataclass(frozen=True)
class Decision:
    """The router's choice after an observation."""

    rung: int
    moved: int
    guard: bool
    mean: float


class Router:
    """Stateful router for one answer."""

    def __init__(self, config: RouterConfig, num_tiers: int):
        config.validate(num_tiers)
        self.config = config
        self.top = num_tiers - 1
        self.top_local = self.top if config.top_local is None else config.top_local
        self._scale = math.log2(config.vocab_size) if config.vocab_size else None
        self.rung, self.count, self._hot = 0, 0, 0
        self._window: deque[float] = deque(maxlen=config.window)

    @property
    def mean(self) -> float:
        """Rolling mean of the window (NaN when empty)."""
        return sum(self._window) / len(self._window) if self._window else math.nan

    def _units(self, h: float) -> float:
        return h / self._scale if self.config.normalize and self._scale else h

    def start(self, initial_entropy: float) -> Decision:
        """Seed the window with the prompt's entropy and climb while it exceeds the up thresholds."""
        self._window.clear()
        if not math.isnan(initial_entropy):
            self._window.append(self._units(initial_entropy))
        self.rung, self.count = 0, 0
        while self.rung < self.top and self._window and self.mean > self.config.up[self.rung]:
            self.rung += 1
        return Decision(self.rung, self.rung, False, self.mean)

    def observe(self, entropy: float | None) -> Decision:
        """Record the entropy of the token just emitted; return the rung of the next token."""
        self.count += 1
        if entropy is None:
            return Decision(self.rung, 0, False, self.mean)
        if math.isnan(entropy) or (self._scale and entropy > self.config.guard_fraction * self._scale):
            self._hot += 1
        else:
            self._hot = 0
        if not math.isnan(entropy):
            self._window.append(self._units(entropy))
        if (math.isnan(entropy) or self._hot >= self.config.guard_count) and self.rung < self.top_local:
            jump = self.top_local - self.rung
            self.rung, self.count, self._hot = self.top_local, 0, 0
            return Decision(self.rung, jump, True, self.mean)
        moved = 0
        if self.count >= self.config.min_run:
            if self.rung < self.top and self.mean > self.config.up[self.rung]:
                moved = 1
            elif self.rung > 0 and self.mean < self.config.downs()[self.rung - 1]:
                moved = -1
            if moved:
                self.rung += moved
                self.count = 0
        return Decision(self.rung, moved, False, self.mean)


def derive_tiers(initial_entropy: float, entropies: list[float | None], config: RouterConfig,
                 num_tiers: int) -> list[int]:
    """Re-derive the tier of every token from recorded entropies (the telemetry check)."""
    router = Router(config, num_tiers)
    tiers = [router.start(initial_entropy).rung]
    for h in entropies:
        tiers.append(router.observe(h).rung)
    return tiers


def parse_thresholds(text: str) -> tuple[float, ...]:
    """Parse '0.5,1.2' / 'inf' / '-inf' into floats."""
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UsageError(f"thresholds must be comma-separated numbers, inf or -inf (got '{text}')") from None
    if any(math.isnan(v) for v in values):
        raise UsageError(f"thresholds cannot be NaN (got '{text}')")
    return values
