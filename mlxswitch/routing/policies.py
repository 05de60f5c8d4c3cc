"""Routing policies (pure Python): the token loop asks one of these which tier makes each token.

The seam, per position t of the answer:
- `start(H0)` once, with the bottom tier's entropy at the end of the prompt: the rung that
  computes position 0 first.
- `may_review(rung)`: whether `review` can escalate there (if not, the loop keeps its pipeline).
- `review(rung, H)` after a rung computed position t with entropy H: None keeps its token, a
  higher rung recomputes the same position t (and is reviewed in turn).
- `commit(rung, H)` once the token of position t is taken from `rung`: the decision for t + 1.

`ead` (the router contract in router.py) never reviews: the entropy of token t chooses the
tier of t + 1. A policy that decides on the same position escalates in `review`.
"""

from __future__ import annotations

from typing import Protocol

from .router import Decision, Router, RouterConfig


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


POLICIES = {"ead": EadPolicy}


def make_policy(name: str, config: RouterConfig, num_tiers: int) -> Policy:
    """A fresh policy instance for one answer."""
    return POLICIES[name](config, num_tiers)
