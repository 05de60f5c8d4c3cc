"""What the batch engines' tests share: a callback that collects an answer's events, and a loop
that steps an engine until every answer has ended."""

from __future__ import annotations

import pytest

from mlxswitch.decoding.answer import AnswerSummary, TokenEvent


class Collector:
    """An answer's `deliver` callback: its events in order, then its summary (nothing after)."""

    def __init__(self):
        self.events: list[TokenEvent] = []
        self.summary: AnswerSummary | None = None

    def __call__(self, item):
        assert self.summary is None, "nothing may follow the summary"
        if isinstance(item, AnswerSummary):
            self.summary = item
        else:
            self.events.append(item)


def run_batch(engine, steps: int = 2000) -> None:
    """Step `engine` until no answer is active, inside its `running()` as a server's worker steps
    it; fail the test if that takes over `steps` steps."""
    with engine.running():
        for _ in range(steps):
            if not engine.active:
                return
            engine.step()
    pytest.fail("the batch did not finish")
