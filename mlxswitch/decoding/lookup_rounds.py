"""Prompt lookup inside the token loop: which draft a rung checks with its next position, and
what a walked row of that pass means.

The token loop runs the passes (loop.py, rung_passes.py); this module keeps the sequence's n-gram
index (lookup.py) and each rung's DraftPlanner (drafting.py: priced from that rung's measured pass
costs and kept share, its memory the ladder's), offers drafts and books each round when its rows
stop standing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Generic, TypeVar

from .drafting import MAX_DRAFT, DraftPlanner
from .lookup import LookupIndex
from .tiers import Ladder

Row = TypeVar("Row")  # a position the loop computed lazily (positions.Pending)


@dataclass
class LookupRows(Generic[Row]):
    """One rung's pass over the next position and a lookup draft's: the rows not yet walked."""

    rung: int
    draft: list[int]
    rows: list[Row]  # row j: the position after the draft's first j ids (row 0 is walked first)
    pass_rows: int  # ids the pass was fed
    used: int = 0  # rows walked so far
    # The rung's own seconds in the round: its pass (timed where passes compute as they are built;
    # nan elsewhere: the planner does not learn from it) and the laps of rows it made after the
    # first. A row another rung reviewed is not the round's cost: it is paid with or without lookup.
    seconds: float = math.nan


@dataclass(frozen=True)
class Walked:
    """What one walked row of a lookup pass says: the token's source, whether the next row stands,
    and (where it does not) how many ids the rung's cache may keep."""

    source: str | None  # "lookup" where the draft proposed the token taken
    stands: bool
    keep: int | None = None  # None while the rows go on


class RungLookup:
    """Lookup drafts checked by the rung that makes the token: one answer's n-gram index and a
    planner per rung (its bound on a copy is the answer's own, its memory the ladder's)."""

    def __init__(self, ladder: Ladder, skip: set[int]):
        self.ladder = ladder
        self.skip = skip  # rungs that check no draft (gears sharing a cache, the cloud's)
        self.index = LookupIndex()
        self._planners: dict[int, DraftPlanner] = {}

    def planner(self, rung: int) -> DraftPlanner | None:
        """The planner of the drafts `rung` checks; None where it checks none."""
        if rung in self.skip or rung >= len(self.ladder.tiers):
            return None
        if rung not in self._planners:
            memory = self.ladder.lookup_memory(rung)
            self._planners[rung] = DraftPlanner(
                MAX_DRAFT, memory=memory, with_lookup=True, model_drafts=False
            )
        return self._planners[rung]

    def draft(self, ids: list[int], prompt_tokens: int, rung: int, room: int) -> list[int]:
        """The draft `rung` checks with the next position ([]: none), as its planner prices the
        n-gram continuation on offer; `room`: the tokens still wanted, that position's included."""
        planner = self.planner(rung)
        if planner is None or not self.ladder.tiers[rung].group.trimmable:
            return []
        offered = self.index.draft(ids, min(room - 1, MAX_DRAFT))
        in_answer = self.index.found_at >= prompt_tokens
        plan = planner.plan(room - 1, len(offered), 0, in_answer)
        if plan.source != "lookup":
            planner.record_round("none", 0, 0)
            return []
        return offered[: plan.length]

    def walked(self, rows: LookupRows, token: int, next_rung: int, more: bool, taken: int) -> Walked:
        """A row of a lookup pass walked, `token` taken (`taken`: the sequence's length with it):
        the next row stands while the token was the drafted one, the policy stays on the rung and
        `more` tokens are wanted. Where it does not, the planner learns what the round kept."""
        j = rows.used
        rows.used += 1
        drafted = len(rows.draft)
        matched = j < drafted and token == rows.draft[j]
        if matched and more and next_rung == rows.rung:
            return Walked("lookup", True)
        # Stopped while the copy held (a move, the end): the round counts as kept whole so far.
        planner = self.planner(rows.rung)
        assert planner is not None
        planner.record_round("lookup", j if matched else drafted, j, seconds=rows.seconds, tokens=rows.used)
        return Walked("lookup" if matched else None, False, taken if matched else taken - 1)
