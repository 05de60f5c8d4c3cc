"""Verified drafting's round (decoding/verified_round.py) on hand-made models: what it drafts, what
the check keeps, what the models are told to keep, and what the planner and the clock learn."""

from __future__ import annotations

import math

import pytest

from mlxswitch.decoding.drafting import DraftPlanner
from mlxswitch.decoding.lookup import LookupIndex
from mlxswitch.decoding.round_clock import PricedClock, RoundClock
from mlxswitch.decoding.verified_round import verified_round

PROMPT = [1, 2, 3, 4]
EOS = 99


def _priced(planner: DraftPlanner) -> PricedClock:
    """Each pass priced by rows: a draft step 1 s a row, a check 10 s + 1 s a row."""
    return PricedClock(planner, lambda model, rows: rows if model == "drafter" else 10.0 + rows)


class HandModels:
    """A drafter that proposes `proposals` (token, signal) in turn, and a top tier whose samples are
    `answer`: no pass runs; each one is booked to the clock."""

    def __init__(
        self, clock: RoundClock, proposals: list[tuple[int, float]], answer: list[int], opening: bool = False
    ):
        self.clock, self.proposals, self.answer = clock, proposals, answer
        self.prompt_tokens = len(PROMPT)
        # After the opening round the top tier has read the prompt and made the answer's first token.
        self.ids = list(PROMPT) if opening else [*PROMPT, answer[0]]
        self.top_seen = 0 if opening else len(PROMPT)
        self.threshold, self.eos = 1.0, {EOS}
        self.lookup_index: LookupIndex | None = None
        self.drafter_seen = 0
        self.checked: list[list[int]] = []  # each check's draft
        self.kept: list[int] = []

    def draft(self, made, planner):
        if made.room == 0:
            return
        self.clock.book("drafter", len(self.ids) - self.drafter_seen, self.drafter_seen < self.prompt_tokens)
        self.drafter_seen = len(self.ids)
        for token, signal in self.proposals:
            if not made.take(token, signal / 2, signal, planner):
                return
            self.clock.book("drafter", 1, False)
            self.drafter_seen += 1
        yield  # a generator, as the live models' draft is

    def check(self, draft, room):
        self.checked.append(list(draft))
        self.clock.book(
            "top", len(self.ids) - self.top_seen + len(draft), self.top_seen < self.prompt_tokens, check=True
        )
        at = len(self.ids) - self.prompt_tokens
        return self.answer[at : at + len(draft) + 1]
        yield  # a generator, as the live models' check is

    def keep(self, kept: int) -> None:
        self.kept.append(kept)


class Recording(DraftPlanner):
    def __init__(self, max_draft: int, adaptive: bool = False):
        super().__init__(max_draft, adaptive=adaptive)
        self.rounds: list[tuple[str, int, int, float]] = []

    def record_round(self, source, drafted, kept, entropies=(), seconds=math.nan, tokens=None):
        self.rounds.append((source, drafted, kept, seconds))
        super().record_round(source, drafted, kept, entropies, seconds, tokens)


def _run(round_generator):
    with pytest.raises(StopIteration) as finished:
        next(round_generator)
    return finished.value.value


def test_the_opening_round_is_the_top_tier_alone_after_its_prefill():
    planner = Recording(4)
    clock = _priced(planner)
    models = HandModels(clock, [(7, 0.1)], answer=[7, 8, 9], opening=True)
    done = _run(verified_round(models, planner, clock, room=3, opening=True))
    assert (done.source, done.draft, done.samples, done.kept) == ("none", [], [7], 0)
    assert (
        models.checked == [[]] and models.kept == [0] and models.drafter_seen == 0
    )  # the drafter read nothing
    assert planner.rounds == [("none", 0, 0, 14.0)]  # the prompt's check (4 rows) is the round's seconds
    assert not planner.check.known  # a prefill says nothing about a check's cost


def test_a_model_draft_ends_at_an_unsure_position_and_is_kept_up_to_the_first_difference():
    planner = Recording(4)
    clock = _priced(planner)
    # The drafter proposes 5, 6, then is unsure (signal 2.0 > threshold 1.0) of 7: a draft of [5, 6].
    models = HandModels(clock, [(5, 0.2), (6, 0.4), (7, 2.0)], answer=[8, 5, 9, 4])
    done = _run(verified_round(models, planner, clock, room=4, opening=False))
    assert done.source == "model" and done.draft == [5, 6] and done.made.ended_unsure
    assert done.samples == [5, 9, 4] and done.kept == 1  # the top tier samples 9 where 6 was drafted
    assert models.checked == [[5, 6]] and models.kept == [1]
    # Seconds: the drafter's read of the prompt and the first token (5 rows) is not the round's; two
    # draft steps (1 s each) and a check of the first token and the draft (3 rows: 13 s) are.
    assert planner.rounds == [("model", 2, 1, 15.0)]
    assert planner.draft.known and planner.check.known


def test_an_end_of_sequence_token_ends_the_draft_with_it_and_room_bounds_the_draft():
    planner = Recording(4)
    clock = _priced(planner)
    models = HandModels(clock, [(5, 0.1), (EOS, 0.1), (6, 0.1)], answer=[8, 5, EOS, 1])
    assert _run(verified_round(models, planner, clock, room=4, opening=False)).draft == [5, EOS]
    short = HandModels(_priced(planner), [(5, 0.1), (6, 0.1), (7, 0.1)], answer=[8, 5, 6, 7])
    done = _run(verified_round(short, planner, short.clock, room=2, opening=False))
    assert done.draft == [5, 6] and done.kept == 2 and done.samples == [5, 6, 7]


def test_a_lookup_round_checks_what_followed_the_tail_and_the_drafter_reads_nothing():
    planner = DraftPlanner(4, with_lookup=True)
    planner.check.record(1, 10.0)  # the top tier alone's cost known, so every plan is priced
    planner.memory.lookup_rounds.record(20, 1.0)  # lookup rounds have paid
    clock = _priced(planner)
    models = HandModels(clock, [], answer=[0])
    models.lookup_index = LookupIndex()
    # The tail 1 2 3 4 occurred before in the prompt, followed by 5 6.
    models.ids = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4]
    models.prompt_tokens = models.top_seen = len(models.ids) - 1
    models.answer = [4, 5, 6, 8]
    done = _run(verified_round(models, planner, clock, room=4, opening=False))
    assert done.source == "lookup" and done.draft[:2] == [5, 6] and done.kept == 2
    assert models.drafter_seen == 0
