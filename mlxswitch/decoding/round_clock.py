"""The seconds of verified drafting's passes (verified_round.py): each booked to the answer's ledger
at the sync that read it, taught to the planner where it says what a draft or a check costs, and
each round's own seconds, which the planner weighs its rounds by.

The live loop's clock reads the wall time; the replay's (bench/replay_drafting.py), a PricedClock,
prices each pass from a table instead, and so teaches the planner by the same rule.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from .drafting import DraftPlanner
from .ledger import PassLedger
from .loop_state import PassMode


class RoundClock:
    """One answer's pass times under verified drafting, round by round."""

    def __init__(self, ledger: PassLedger, planner: DraftPlanner, pass_mode: PassMode):
        self.ledger, self.planner, self.pass_mode = ledger, planner, pass_mode
        self._round_started = time.perf_counter()
        self._prompt_read_s = 0.0  # this round's seconds in the drafter's prompt pass
        self._round_shared = False  # a pass of this round was shared with other answers

    def pass_seconds(self, model: str, rows: int) -> float:
        """The seconds of the pass just read: since the last sync."""
        return self.ledger.lap()

    def elapsed(self) -> float:
        """The seconds since the round started."""
        return time.perf_counter() - self._round_started

    def start_round(self) -> None:
        self._round_started = time.perf_counter()
        self._prompt_read_s, self._round_shared = 0.0, False

    def book(self, model: str, rows: int, prefill: bool, check: bool = False, teach: bool = True) -> None:
        """Book the pass just read, `model` over `rows` rows, to the ledger (and, where `teach`,
        teach the planner what a draft step or a check of that many rows costs)."""
        seconds = self.pass_seconds(model, rows)
        self.ledger.add(model, rows, seconds, prefill=prefill)
        if self.pass_mode.shared_pass:  # packed with other answers' rows: not this answer's pass alone
            self._round_shared, teach = True, False
        if prefill:  # a prompt's pass says nothing about a round's cost
            if not check:
                self._prompt_read_s += seconds
            return
        if teach:
            (self.planner.check if check else self.planner.draft).record(rows, seconds)

    def round_seconds(self) -> float:
        """The round's seconds so far, less the drafter's first read of the prompt: paid once an
        answer (nan where a pass of the round was shared with other answers)."""
        return math.nan if self._round_shared else self.elapsed() - self._prompt_read_s


class PricedClock(RoundClock):
    """A modelled run's clock: each pass priced by `price(model, rows)` instead of timed, the
    round's seconds the sum of its prices. It books and teaches the planner as the live clock does."""

    def __init__(self, planner: DraftPlanner, price: Callable[[str, int], float]):
        super().__init__(PassLedger(), planner, PassMode(pipelined=False))
        self.price = price
        self.spent = 0.0  # this round's priced seconds, the drafter's prompt read included

    def pass_seconds(self, model: str, rows: int) -> float:
        seconds = self.price(model, rows)
        self.spent += seconds
        return seconds

    def elapsed(self) -> float:
        return self.spent

    def start_round(self) -> None:
        super().start_round()
        self.spent = 0.0
