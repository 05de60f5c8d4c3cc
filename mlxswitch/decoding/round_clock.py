"""The seconds of verified drafting's passes (verify.py): each booked to the answer's ledger at the
sync that read it, taught to the planner where it says what a draft or a check costs, and each
round's own seconds, which the planner weighs its rounds by.
"""

from __future__ import annotations

import math
import time

from .drafting import DraftPlanner
from .ledger import PassLedger
from .loop_state import PassMode


class RoundClock:
    """One answer's pass times under verified drafting, round by round."""

    def __init__(self, ledger: PassLedger, planner: DraftPlanner, pass_mode: PassMode):
        self.ledger, self.planner, self.pass_mode = ledger, planner, pass_mode
        self.check_rows, self.check_prefill = 0, False  # the last check's pass (for its timing)
        self._prompt_read_s = 0.0  # this round's seconds in the drafter's prompt pass
        self._round_shared = False  # a pass of this round was shared with other answers

    def book(self, model: str, rows: int, prefill: bool, check: bool = False, teach: bool = True) -> None:
        """Book the seconds since the last sync to one pass of `model` (and, where `teach`, teach
        the planner)."""
        seconds = self.ledger.lap()
        self.ledger.add(model, rows, seconds, prefill=prefill)
        if self.pass_mode.shared_pass:  # packed with other answers' rows: not this answer's pass alone
            self._round_shared, teach = True, False
        if prefill:  # a prompt's pass says nothing about a round's cost
            if not check:
                self._prompt_read_s += seconds
            return
        if teach:
            (self.planner.check if check else self.planner.draft).record(rows, seconds)

    def book_check(self, model: str, teach: bool) -> None:
        """Book the last check's pass (`check_rows`, `check_prefill`) to the top tier `model`."""
        self.book(model, self.check_rows, self.check_prefill, check=True, teach=teach)

    def round_seconds(self, started: float) -> float:
        """The round's seconds since `started`, less the drafter's first read of the prompt: paid
        once an answer (nan where a pass of the round was shared with other answers). The next
        round counts afresh."""
        seconds = time.perf_counter() - started - self._prompt_read_s
        if self._round_shared:
            seconds = math.nan
        self._prompt_read_s, self._round_shared = 0.0, False
        return seconds
