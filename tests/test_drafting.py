"""The draft planner and the prompt lookup (decoding/drafting.py): decisions on hand-made costs."""

from __future__ import annotations

import math
import random

import pytest

from mlxswitch.decoding.drafting import (
    MAX_PROBE_GAP,
    PROBE_GAP,
    PROBE_LENGTH,
    Acceptance,
    DraftMemory,
    DraftPlanner,
    LookupIndex,
    PassCosts,
    expected_tokens,
    lookup_draft,
)


def _planner(check: dict[int, float], draft_s: float | None, max_draft: int = 32) -> DraftPlanner:
    planner = DraftPlanner(max_draft)
    for rows, seconds in check.items():
        planner.check.record(rows, seconds)
    if draft_s is not None:
        planner.draft.record(1, draft_s)
    return planner


def test_expected_tokens_matches_a_simulation_of_the_check():
    rng = random.Random(0)
    for p, k in ((0.5, 3), (0.9, 8), (0.3, 1)):
        rounds = 20000
        total = 0
        for _ in range(rounds):
            kept = 0
            while kept < k and rng.random() < p:
                kept += 1
            total += kept + 1  # the kept draft and the top tier's own token
        assert total / rounds == pytest.approx(expected_tokens(p, k), rel=0.02)
    assert expected_tokens(1.0, 5) == 6


def test_costs_take_the_next_timed_row_count_and_extend_a_line_beyond():
    costs = PassCosts()
    costs.record(1, 1.0)
    costs.record(9, 3.0)
    assert costs.estimate(5) == pytest.approx(3.0)  # no cheaper than the next timed count
    assert costs.estimate(17) == pytest.approx(5.0)  # 0.25 s a row, fitted
    costs.record(12, 2.5)  # a CPU's matrix product can cost less at more rows
    assert costs.estimate(30) >= 3.0
    only = PassCosts()
    only.record(1, 2.0)
    assert only.estimate(11) > 2.0  # one timing: the prior prices extra rows above zero
    assert math.isnan(PassCosts().estimate(3))


def test_first_the_top_tier_alone_is_timed():
    assert DraftPlanner(32).plan(room=50).length == 0


def test_a_mac_like_machine_drafts_long_when_drafts_are_kept():
    # A check of k rows costs about one row; the drafter is 1/10 of the top tier.
    planner = _planner({1: 1.0, 33: 1.2}, draft_s=0.1)
    for _ in range(10):
        planner.record_round("model", 16, 16)
    plan = planner.plan(room=100)
    assert plan.source == "model" and plan.length >= 16
    assert plan.tokens_per_s > 1.0  # faster than the top tier alone, as planned


def test_this_cpu_with_an_expensive_drafter_falls_back_to_the_top_tier_alone():
    # The 0.5B costs 0.47 of the 1.5B here and a 16-row check 4.2 rows: with half of each draft
    # thrown away, no draft length pays.
    planner = _planner({1: 1.0, 2: 2.0, 3: 2.7, 16: 4.2}, draft_s=0.47)
    for _ in range(10):
        planner.record_round("model", 8, 2)
    assert planner.plan(room=100).length == 0


def test_a_drafter_as_costly_as_the_checker_never_drafts():
    planner = _planner({1: 1.0, 8: 1.0}, draft_s=1.0)
    for _ in range(10):
        planner.record_round("model", 8, 8)
    assert planner.plan(room=100).length == 0


def test_rejections_shorten_drafts_and_a_probe_comes_back_less_often_while_it_does_not_pay():
    # A drafter at 0.4 of the checker: drafting pays only where nearly every token is kept.
    planner = _planner({1: 1.0, 2: 1.6, 33: 4.0}, draft_s=0.4)
    assert planner.plan(room=100).length == 0  # at the prior's kept share, it does not
    for _ in range(6):
        planner.record_round("model", 16, 16)
    before = planner.plan(room=100).length
    assert before > 1
    for _ in range(8):
        planner.record_round("model", 8, 0)
    assert planner.plan(room=100).length < before
    assert planner.plan(room=100).length == 0

    def rounds_until_a_probe() -> int:
        rounds = 0
        while (plan := planner.plan(room=100)).length == 0:
            planner.record_round("none", 0, 0)
            planner.observe_top(0.1)  # the top tier is sure of its own tokens
            rounds += 1
            assert rounds <= MAX_PROBE_GAP, "the planner never tried drafting again"
        assert plan.source == "model" and plan.length == PROBE_LENGTH
        return rounds

    first = rounds_until_a_probe()
    assert first == PROBE_GAP
    planner.record_round("model", PROBE_LENGTH, 0)  # a probe that did not pay
    assert rounds_until_a_probe() == 2 * PROBE_GAP
    for _ in range(6):
        planner.record_round("model", PROBE_LENGTH, PROBE_LENGTH)  # the text changed: kept whole
    assert planner.plan(room=100).length > 0
    assert planner.memory.probe_gap == PROBE_GAP


def test_costs_and_acceptance_carry_across_answers_through_the_memory():
    memory = DraftMemory()
    first = DraftPlanner(32, memory=memory)
    first.check.record(1, 1.0)
    first.record_round("model", 10, 10)
    second = DraftPlanner(32, memory=memory)
    assert second.check.estimate(1) == 1.0 and second.model.p > Acceptance().p


def test_free_lookup_drafts_win_where_the_drafter_does_not_pay():
    planner = _planner({1: 1.0, 2: 2.0, 16: 4.2}, draft_s=0.47)
    for _ in range(6):
        planner.record_round("lookup", 12, 12)
    plan = planner.plan(room=100, lookup_available=12)
    assert plan.source == "lookup" and plan.length >= 8
    assert planner.plan(room=100, lookup_available=0).source != "lookup"


def test_the_fixed_rule_drafts_up_to_the_longest_draft():
    planner = DraftPlanner(32, adaptive=False)
    assert planner.plan(room=100).length == 32
    assert planner.plan(room=5).length == 5
    assert planner.plan(room=0).length == 0


def test_acceptance_starts_at_the_prior_and_follows_the_checks():
    counts = Acceptance()
    assert counts.p == pytest.approx(0.75)
    for _ in range(20):
        counts.record(10, 10)
    assert counts.p > 0.95
    for _ in range(20):
        counts.record(10, 1)
    assert counts.p < 0.6  # one kept, then a miss: p = 1/2 by the counts, pulled up by the prior


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        ([1, 2, 3, 4, 5, 9, 9, 2, 3, 4], [5, 9, 9]),  # the 3-gram 2 3 4 seen before
        ([7, 8, 1, 2, 9, 1, 2], [9, 1, 2]),  # no 3-gram: the 2-gram 1 2 (its echo runs into the tail)
        ([1, 2, 3, 4], []),  # nothing repeats
        ([5, 6, 1, 5, 6, 2, 5, 6], [2, 5, 6]),  # the latest earlier occurrence wins
    ],
)
def test_lookup_drafts_what_followed_the_tail_earlier(ids, expected):
    assert lookup_draft(ids, 0, max_tokens=3) == expected[:3]


def test_lookup_respects_its_bounds():
    ids = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]
    assert lookup_draft(ids, 0, max_tokens=2) == [4, 5]
    assert lookup_draft(ids, 0, max_tokens=0) == []
    assert lookup_draft(ids, 2, max_tokens=4) == []  # the only matches start before `start`


def test_a_probe_waits_until_the_top_tier_is_sure_of_its_own_tokens():
    planner = _planner({1: 1.0, 2: 1.6, 33: 4.0}, draft_s=0.4)
    for _ in range(3 * PROBE_GAP):
        planner.record_round("none", 0, 0)
        planner.observe_top(2.0)  # prose: the top tier is unsure, the small one would disagree
    assert planner.plan(room=100).length == 0
    for _ in range(8):
        planner.observe_top(0.05)
    plan = planner.plan(room=100)
    assert plan.source == "model" and plan.length == PROBE_LENGTH


def test_the_lookup_index_finds_what_the_naive_scan_finds_as_the_sequence_grows():
    rng = random.Random(3)
    for _ in range(20):
        ids = [rng.randrange(6) for _ in range(rng.randrange(1, 12))]  # a small vocabulary repeats
        index = LookupIndex()
        for _ in range(60):
            room = rng.randrange(0, 6)
            assert index.draft(ids, room) == lookup_draft(ids, 0, room), ids
            ids.extend(rng.randrange(6) for _ in range(rng.randrange(1, 4)))
