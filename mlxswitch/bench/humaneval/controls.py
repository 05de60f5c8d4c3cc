"""The two controls, as live routing policies (the routing.policies.Policy protocol).

- `RandomPolicy`: each position goes to the top tier with probability p, drawn from its own
  seeded generator before the position is computed (no cheap step: a control knows where to go).
  The bench sets p per problem to the share of top-tier tokens the matched arm spent on that
  problem, so it spends as much, at random places: it isolates *where* an arm escalates.
- `OraclePolicy`: the top tier makes exactly the positions where its greedy token differs from
  the bottom tier's. Those positions come from both tiers' greedy tokens along the top tier's own
  greedy answer (`oracle.disagreements`); decoding with them reproduces that answer while the
  bottom tier keeps every position it would have got right, so its share is the least top-tier
  share that gives the top tier's answer. Each position is computed by the bottom tier first
  (both tiers are needed), so its speed is no figure.
"""

from __future__ import annotations

import math
import random
import zlib

from ...routing.router import Decision


def control_seed(seed: int, task_id: str, arm: str) -> int:
    """A seed fixed by the run's seed, the problem and the arm (stable across processes)."""
    return zlib.crc32(f"{seed}:{task_id}:{arm}".encode())


class RandomPolicy:
    """Escalate each position to the top rung with probability `share`, seeded."""

    name = "random"

    def __init__(self, share: float, top: int, seed: int):
        self.share, self.top = share, top
        self._draw = random.Random(seed).random

    def _next(self) -> Decision:
        rung = self.top if self._draw() < self.share else 0
        return Decision(rung, 0, False, math.nan)

    def start(self, initial_entropy: float | None) -> Decision:
        """Draw position 0's rung."""
        return self._next()

    def may_review(self, rung: int) -> bool:
        """Never: the draw is made before the position is computed."""
        return False

    def review(self, rung: int, entropy: float | None) -> int | None:
        """Never recomputes a position."""
        return None

    def commit(self, rung: int, entropy: float | None) -> Decision:
        """Draw the next position's rung."""
        return self._next()

    def certain_next(self, rung: int) -> int | None:
        """Never known before the draw (which is not made early: the draws stay in order)."""
        return None

    def resume(self, rung: int) -> Decision:
        """After a cloud span (never in the bench): draw again."""
        return self._next()


class OraclePolicy:
    """The top rung recomputes exactly the positions listed (where the bottom tier's token is wrong)."""

    name = "oracle"

    def __init__(self, positions: set[int], top: int):
        self.positions, self.top = positions, top
        self._t = 0

    def start(self, initial_entropy: float | None) -> Decision:
        """Every position is computed by the bottom rung first."""
        self._t = 0
        return Decision(0, 0, False, math.nan)

    def may_review(self, rung: int) -> bool:
        """At the bottom rung: the position may be handed up."""
        return rung == 0

    def review(self, rung: int, entropy: float | None) -> int | None:
        """The top rung where the bottom tier's token differs from the top tier's."""
        return self.top if rung == 0 and self._t in self.positions else None

    def commit(self, rung: int, entropy: float | None) -> Decision:
        """The next position starts on the bottom rung again."""
        self._t += 1
        return Decision(0, 0, False, math.nan)

    def certain_next(self, rung: int) -> int | None:
        """The bottom rung, always."""
        return 0

    def resume(self, rung: int) -> Decision:
        """After a cloud span (never in the bench): the bottom rung."""
        return Decision(0, 0, False, math.nan)
