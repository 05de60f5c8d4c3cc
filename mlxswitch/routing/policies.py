"""Routing policies (pure Python): the token loop asks one of these which tier makes each token.

The seam, per position t of the answer:
- `start(H0)` once, with the bottom tier's entropy at the end of the prompt: the rung that
  computes position 0 first.
- `may_review(rung)`: whether `review` can escalate there (if not, the loop keeps its pipeline).
- `review(rung, H)` after a rung computed position t with entropy H: None keeps its token, a
  higher rung recomputes the same position t (and is reviewed in turn).
- `commit(rung, H)` once the token of position t is taken from `rung`: the decision for t + 1.
walk.py runs this seam over positions, once for the token loop, the bench and the telemetry.

`ead` (the router contract in router.py) never reviews: the entropy of token t chooses the
tier of t + 1. `peek` decides on the same position, as Big Little Decoder does:

- State: a base rung b (the rung that computes a position first), a window W of the last
  `window` entropies of the tokens taken, a count c of tokens taken since b last changed.
- start(H0): b = 0, W empty, c = 0. H0 is position 0's cheap entropy and is reviewed as such.
- review(r, H) at r < top_local: H > up[r] (in the compared units) → r + 1 recomputes this
  position (and is reviewed in turn); a non-finite H → top_local (the catastrophic guard).
- commit(r, H): H enters W (if finite); if r > b the strong rung holds: b = r, c = 1 (the
  escalated token is the first of its run); else c += 1. Then, if c ≥ min_run and b > 0 and
  mean(W) < down[b − 1]: b −= 1, c = 0. The decision is b for the next position.
  With window 1 and min run 1 every position is decided on its own; larger values hold the
  strong tier after an escalation while the mean stays high (hysteresis, no flapping).
An escalated token costs the cheap step and the strong one: its record lists every tier tried.

A signal measured on the bottom rung only (the probe, BOTTOM_ONLY_SIGNALS) changes `peek`:
every position is computed by rung 0 first, so the signal exists at every position.
- State: a held rung L (0 at start), the window W of the bottom rung's values, the count c.
- review(0, S): the rung asked for is max(L, the highest i + 1 with S > up[i]) (a non-finite S
  → top_local); rung 0 keeps its token when that is 0. Rungs above 0 measure nothing and are
  never reviewed.
- commit(r, ·): W gets the bottom value S of this position (the one review saw when r > 0);
  if r > L: L = r, c = 1; else c += 1. Then, if c ≥ min_run and L > 0 and mean(W) < down[L − 1]:
  L −= 1, c = 0. The next position starts on rung 0 again.
So once the probe has sent a position up, the next positions go up too while the mean of their
cheap scores stays above down (each still costs the cheap step: the probe needs it).

A cloud rung above top_local (a cascade) is never reviewed into: a network round trip that
returns a re-tokenized continuation is no same-position choice. Both policies climb to it from
top_local on the window: `ead` by its contract, `peek` in commit when b = top_local, c ≥ min_run
and mean(W) > up[top_local]. After the span the loop calls `resume(top_local)` (b = top_local,
c = 0, W kept): the cloud tokens carry no entropy and never enter W.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Protocol

from .router import BOTTOM_ONLY_SIGNALS, POLICY_NAMES, Decision, Router, RouterConfig


class Policy(Protocol):
    """What the token loop needs from a routing policy (one instance per answer)."""

    name: str

    def start(self, initial_entropy: float | None) -> Decision:
        """The rung that computes position 0 first."""

    def may_review(self, rung: int) -> bool:
        """Whether review() can escalate at this rung (else the loop need not wait to read H)."""

    def review(self, rung: int, entropy: float | None) -> int | None:
        """None: keep the token `rung` made here; else the higher rung that recomputes this position."""

    def commit(self, rung: int, entropy: float | None) -> Decision:
        """The token was taken from `rung` with entropy H; the decision for the next position."""

    def certain_next(self, rung: int) -> int | None:
        """The rung commit(rung, H) will name for every finite H; None where H decides it."""

    def resume(self, rung: int) -> Decision:
        """A cloud span ended: local decoding goes on at `rung`."""


class EadPolicy:
    """Entropy Adaptive Decoding: the router contract, deciding token t + 1 from token t."""

    name = "ead"

    def __init__(self, config: RouterConfig, num_tiers: int):
        self.router = Router(config, num_tiers)

    def start(self, initial_entropy: float | None) -> Decision:
        """Seed the router with the prompt's entropy (see Router.start)."""
        return self.router.start(initial_entropy)

    def may_review(self, rung: int) -> bool:
        """Never: the one-token lag is part of this contract."""
        return False

    def review(self, rung: int, entropy: float | None) -> int | None:
        """Never recomputes a position."""
        return None

    def commit(self, rung: int, entropy: float | None) -> Decision:
        """Observe the token's entropy (see Router.observe)."""
        return self.router.observe(entropy)

    def certain_next(self, rung: int) -> int | None:
        """The router's next tier where no finite entropy can move it (see Router.certain_next)."""
        return self.router.certain_next()

    def resume(self, rung: int) -> Decision:
        """Go on at `rung` after a cloud span (see Router.resume)."""
        return self.router.resume(rung)


class PeekPolicy:
    """Same-position escalation: the cheap tier computes a position, a stronger one redoes it if unsure."""

    name = "peek"

    def __init__(self, config: RouterConfig, num_tiers: int):
        Router(config, num_tiers)  # the same checks as any router of this ladder
        self.config = config
        self.top_local = num_tiers - 1 if config.top_local is None else config.top_local
        self._top = num_tiers - 1
        self._up, self._down = config.up, config.downs()
        self._base, self._count = 0, 0
        self._window: deque[float] = deque(maxlen=config.window)
        # A bottom-only signal: _base is the held rung L, every position starts on rung 0, and
        # _bottom is the value rung 0 measured at the current position.
        self.bottom_only = config.signal in BOTTOM_ONLY_SIGNALS
        self._bottom: float | None = None

    @property
    def mean(self) -> float:
        """Rolling mean of the taken tokens' entropies in the compared units (NaN when empty)."""
        return math.fsum(self._window) / len(self._window) if self._window else math.nan

    def start(self, initial_entropy: float | None) -> Decision:
        """Position 0 starts on the bottom rung; H0 is its cheap entropy, reviewed like any other."""
        self._base, self._count = 0, 0
        self._window.clear()
        return Decision(0, 0, False, self.mean)

    def may_review(self, rung: int) -> bool:
        """Below the top local rung a position can still be handed up (from rung 0 only, bottom-only)."""
        return rung < self.top_local and (rung == 0 or not self.bottom_only)

    def review(self, rung: int, entropy: float | None) -> int | None:
        """Hand this position one rung up when its entropy crosses up[rung]; the guard jumps to the top."""
        if self.bottom_only:
            return self._review_bottom(rung, entropy)
        if entropy is None or rung >= self.top_local:
            return None
        if not math.isfinite(entropy):
            return self.top_local
        return rung + 1 if self.config.units(entropy) > self._up[rung] else None

    def _review_bottom(self, rung: int, value: float | None) -> int | None:
        if rung != 0 or value is None:
            return None
        self._bottom = value
        if not math.isfinite(value):
            return self.top_local
        crossed = [i + 1 for i, up in enumerate(self._up[: self.top_local]) if value > up]
        asked = max([self._base, *crossed])
        return asked if asked > 0 else None

    def commit(self, rung: int, entropy: float | None) -> Decision:
        """Record the taken token; hold an escalated rung, step down once the mean falls below down."""
        if self.bottom_only:
            # The window holds the bottom rung's values: a higher rung measured nothing here.
            entropy = entropy if rung == 0 else self._bottom
            self._bottom = None
        if entropy is not None and math.isfinite(entropy):
            self._window.append(self.config.units(entropy))
        before = self._base
        if rung > self._base:
            self._base, self._count = rung, 1
        else:
            self._count += 1
        if self._count >= self.config.min_run and self._base > 0 and self.mean < self._down[self._base - 1]:
            self._base, self._count = self._base - 1, 0
        elif (
            self._base == self.top_local < self._top
            and self._count >= self.config.min_run
            and self.mean > self._up[self._base]
        ):
            self._base, self._count = self._base + 1, 0  # to the cloud, on the window (see above)
        return Decision(self._next_rung(), self._base - before, False, self.mean)

    def certain_next(self, rung: int) -> int | None:
        """The next position's rung, unless the mean this token enters may step down or climb to the cloud."""
        base, count = (rung, 1) if rung > self._base else (self._base, self._count + 1)
        ripe = count >= self.config.min_run
        may_descend = ripe and base > 0 and self._down[base - 1] > -math.inf
        may_climb = ripe and base == self.top_local < self._top and self._up[base] < math.inf
        if may_climb or (may_descend and not self.bottom_only):
            return None
        # Bottom-only, a step down changes the held rung but every position still starts on rung 0.
        return 0 if self.bottom_only else base

    def resume(self, rung: int) -> Decision:
        """Go on at `rung` after a cloud span, with a fresh count and the window kept."""
        self._base, self._count = rung, 0
        return Decision(self._next_rung(), 0, False, self.mean)

    def _next_rung(self) -> int:
        # With a bottom-only signal the held rung is asked for in review, after rung 0 has run;
        # only the cloud (above top_local) is reached directly.
        if self.bottom_only and self._base <= self.top_local:
            return 0
        return self._base


# The classes of the policies described in registry.py (router.py checks names against it).
POLICY_CLASSES: dict[str, Callable[[RouterConfig, int], Policy]] = {"ead": EadPolicy, "peek": PeekPolicy}
assert tuple(POLICY_CLASSES) == POLICY_NAMES


def make_policy(config: RouterConfig, num_tiers: int) -> Policy:
    """A fresh instance of the config's policy, for one answer."""
    return POLICY_CLASSES[config.policy](config, num_tiers)
