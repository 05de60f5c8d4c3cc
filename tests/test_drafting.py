"""The draft planner, what it learns and the prompt lookup (decoding/drafting.py, draft_memory.py,
lookup.py): decisions on hand-made costs."""

from __future__ import annotations

import math
import random

import pytest

from mlxswitch.decoding.draft_memory import (
    BIN_PRIORS,
    PRIOR_ROW_SHARE,
    Acceptance,
    BinnedAcceptance,
    DraftMemory,
    PassCosts,
    entropy_bin,
)
from mlxswitch.decoding.drafting import LOOKUP_FIRST, DraftPlanner, expected_tokens
from mlxswitch.decoding.lookup import LookupIndex, lookup_draft

SURE, UNSURE = 0.05, 2.0  # the drafter's (or the top tier's) entropy at a token, bits
# This machine's pair, as a share of the 1.5B's one-row pass: checks of 2, 3, 8 and 16 rows
# (bench/results/threads-qwen.txt, 2 threads) and the 0.5B's step.
CPU_CHECK = {1: 1.0, 2: 1.92, 3: 2.88, 8: 2.71, 16: 3.39}
CPU_DRAFT = 0.41


def _planner(
    check: dict[int, float], draft_s: float | None, max_draft: int = 32, with_lookup: bool = False
) -> DraftPlanner:
    planner = DraftPlanner(max_draft, with_lookup=with_lookup)
    for rows, seconds in check.items():
        planner.check.record(rows, seconds)
    if draft_s is not None:
        planner.draft.record(1, draft_s)
    planner.observe_top(SURE)
    return planner


def _draft(planner: DraftPlanner, entropies: list[float], room: int = 32) -> list[float]:
    """Draft token by token as verify.py does: the entropies drafted before the planner stopped."""
    drafted: list[float] = []
    for entropy in entropies:
        drafted.append(entropy)
        if not planner.keep_drafting(drafted, room):
            break
    return drafted


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
    assert costs.estimate(17) == pytest.approx(3.8)  # one matrix-product count: the prior's slope
    costs.record(17, 5.0)
    assert costs.estimate(25) == pytest.approx(7.0)  # 0.25 s a row, fitted from 9 and 17 rows
    costs.record(12, 2.5)  # a CPU's matrix product can cost less at more rows
    assert costs.estimate(30) >= 5.0
    mat_vec = PassCosts()
    mat_vec.record(1, 1.0)
    mat_vec.record(3, 2.4)  # a mat-vec a row: its slope says nothing of a 16-row product
    assert mat_vec.estimate(16) < 4.0
    only = PassCosts()
    only.record(1, 2.0)
    assert only.estimate(11) > 2.0  # one timing: the prior prices extra rows above zero
    assert math.isnan(PassCosts().estimate(3))


def test_first_the_top_tier_alone_is_timed():
    assert DraftPlanner(32).plan(room=50).length == 0


def test_a_mac_like_machine_drafts_to_the_longest_draft_while_the_drafter_is_sure():
    # A check of k rows costs about one row; the drafter is 1/10 of the top tier.
    planner = _planner({1: 1.0, 33: 1.2}, draft_s=0.1)
    plan = planner.plan(room=100)
    assert plan.source == "model" and plan.length == 32
    assert plan.tokens_per_s > 1.0  # faster than the top tier alone, as planned
    drafted = _draft(planner, [SURE] * 40)
    assert len(drafted) >= 16 and planner.settle(drafted) == len(drafted)
    for _ in range(20):  # every sure token kept: the longest draft pays
        planner.record_round("model", 32, 32, [SURE] * 32)
    assert len(_draft(planner, [SURE] * 40)) == 32


def test_this_cpu_drafts_through_a_sure_stretch_and_stops_at_the_first_doubt():
    planner = _planner(CPU_CHECK, draft_s=CPU_DRAFT)
    assert planner.plan(room=100).source == "model"  # the surest tokens' prior share would pay
    drafted = _draft(planner, [SURE] * 12 + [UNSURE] + [SURE] * 10)
    assert len(drafted) == 13  # the unsure token ends it
    # Checked only where its row is free: 13 and 14 rows cost what 16 do here.
    assert planner.settle(drafted) == 13
    planner.check.record(13, 3.0)
    planner.check.record(14, 3.2)
    assert planner.settle(drafted) == 12  # where its row costs, the unsure token is not checked


def test_this_cpu_drops_a_short_unsure_draft_rather_than_pay_a_two_row_check():
    planner = _planner(CPU_CHECK, draft_s=CPU_DRAFT)
    planner.plan(room=100)
    drafted = _draft(planner, [UNSURE, SURE])
    assert drafted == [UNSURE]
    assert planner.settle(drafted) == 0  # a one-row pass of the top tier does better


def test_where_even_sure_drafts_are_cut_this_cpu_falls_back_to_the_top_tier_alone_then_retries():
    planner = _planner(CPU_CHECK, draft_s=CPU_DRAFT)
    for _ in range(10):  # the drafter is sure and wrong: half of its sure tokens are cut
        planner.record_round("model", 4, 2, [SURE] * 4)
    assert planner.binned.surest < 0.8
    assert planner.plan(room=100).length == 0
    rounds = 0
    while planner.plan(room=100).source != "model":  # the evidence fades toward the prior
        planner.record_round("none", 0, 0)
        rounds += 1
        assert rounds <= 200, "the planner never tried drafting again"
    assert rounds > 5


def test_a_drafter_as_costly_as_the_checker_never_drafts():
    planner = _planner({1: 1.0, 8: 1.0}, draft_s=1.0)
    for _ in range(10):
        planner.record_round("model", 8, 8, [SURE] * 8)
    assert planner.plan(room=100).length == 0


def test_a_model_draft_starts_only_after_the_top_tier_was_sure():
    planner = _planner(CPU_CHECK, draft_s=CPU_DRAFT)
    planner.observe_top(UNSURE)  # prose: the top tier is unsure, the small one would disagree
    assert planner.plan(room=100).length == 0
    planner.observe_top(SURE)
    assert planner.plan(room=100).source == "model"


def test_the_top_tiers_entropy_is_measured_only_when_a_plan_needs_it_and_once():
    calls: list[int] = []

    def measured(value: float):
        def measure() -> float:
            calls.append(1)
            return value

        return measure

    planner = _planner(CPU_CHECK, draft_s=CPU_DRAFT)
    planner.observe_top(measured(UNSURE))
    # A lookup draft that pays is chosen before any model draft is weighed: nothing measured.
    for _ in range(5):
        planner.record_round("lookup", 8, 8, seconds=1.5)
    planner.lookup_kept.record(8, 8)
    assert planner.plan(room=100, lookup_available=8).source == "lookup" and not calls
    # With none on offer the sureness gate reads it, once however many plans ask.
    assert planner.plan(room=100).length == planner.plan(room=100).length == 0
    assert len(calls) == 1
    planner.observe_top(measured(SURE))
    assert planner.plan(room=100).source == "model" and len(calls) == 2


def test_beside_lookup_a_model_draft_pays_the_answers_reading_in_the_round_it_starts():
    # On this CPU a 64-id read of the answer (lookup drafts, the top tier's tokens) costs 3.6
    # one-row passes of the top tier: no round of the drafter's surest tokens repays that,
    # however long the answer; in step it drafts.
    planner = _planner({1: 1.0, 16: 3.4}, draft_s=CPU_DRAFT, with_lookup=True)
    planner.draft.record(64, 4.0)
    assert planner.plan(room=1000, behind=64).length == 0
    assert planner.plan(room=1000, behind=0).source == "model"
    # Where a check costs about one row (a Mac), the read is worth paying.
    mac = _planner({1: 1.0, 33: 1.3}, draft_s=0.4, with_lookup=True)
    mac.draft.record(64, 0.9)
    assert mac.plan(room=1000, behind=64).source == "model"


def test_beside_lookup_the_prompts_read_is_repaid_over_the_answer_as_without_lookup():
    # The prompt is read once an answer: a long answer repays it (a short one does not), where the
    # same 64 ids of the answer itself would have to be repaid by the round.
    planner = _planner({1: 1.0, 16: 3.4}, draft_s=CPU_DRAFT, with_lookup=True)
    planner.draft.record(64, 4.0)
    assert planner.plan(room=1000, behind=64, unread_prompt=64).source == "model"
    assert planner.plan(room=20, behind=64, unread_prompt=64).length == 0
    assert planner.plan(room=1000, behind=64, unread_prompt=4).length == 0


def test_a_prompt_read_is_repaid_at_most_by_what_reads_earned_since():
    # Where lookup copies most of an answer and it ends long before its room, the drafter that
    # read the prompt drafts a few of its tokens: once measured, what a read earned prices the
    # next one, and a read is tried again some answers later.
    def answer(memory=None) -> DraftPlanner:
        planner = DraftPlanner(32, memory=memory, with_lookup=True)
        if memory is None:
            planner.check.record(1, 1.0)
            planner.check.record(16, 3.4)
            planner.draft.record(1, CPU_DRAFT)
            planner.draft.record(64, 4.0)  # a 64-id read: 3.6 passes beyond a step
        planner.observe_top(SURE)
        return planner

    first = answer()
    assert first.plan(room=300, behind=64, unread_prompt=64).source == "model"  # none measured: read
    assert first.read_prompt and first.memory.reads.reads == 1
    first.record_round("model", 4, 4, [SURE] * 4, seconds=3.0)  # 5 tokens, 3 passes' worth: saved 2
    for _ in range(40):  # then lookup's copies and the top tier's own tokens: not the read's
        first.record_round("lookup", 7, 7, seconds=2.0, tokens=8)
        first.record_round("none", 0, 0, seconds=1.0)
    memory = first.memory
    assert memory.reads.per_read == pytest.approx(2.0)
    later = answer(memory)
    assert later.plan(room=300, behind=64, unread_prompt=64).length == 0  # 2 passes < 4.6
    assert not later.read_prompt
    assert later.plan(room=300, behind=0).source == "model"  # in step: no read to repay
    for _ in range(8):  # answers without a read: the measure fades, and a read is tried again
        later = answer(memory)
    assert later.plan(room=300, behind=64, unread_prompt=64).source == "model"
    rich = answer()  # reads that earned more than they cost go on
    for _ in range(3):
        rich = answer(rich.memory)
        assert rich.plan(room=300, behind=64, unread_prompt=64).source == "model"
        rich.record_round("model", 16, 16, [SURE] * 16, seconds=9.0)  # saved 8


def test_beside_lookup_the_reading_must_be_repaid_by_a_round_as_recent_rounds_went():
    # Long checks priced from a few timed counts (flat from 8 rows on) make the best case look
    # good; rounds that barely paid do not repay a 32-id read, rounds that paid well do.
    planner = _planner({1: 1.0, 4: 2.4, 8: 2.4}, draft_s=CPU_DRAFT, with_lookup=True)
    planner.draft.record(4, 0.7)
    planner.draft.record(32, 1.3)
    for _ in range(10):
        planner.record_round("model", 4, 4, [SURE] * 4, seconds=4.4)  # 5 tokens, 4.4 passes' worth
    assert 1.0 < planner.memory.rounds.gain < 1.2
    assert planner.plan(room=1000, behind=32).length == 0
    assert planner.plan(room=1000, behind=0).source == "model"  # in step: nothing to repay
    for _ in range(10):
        planner.record_round("model", 16, 16, [SURE] * 16, seconds=9.0)  # 17 tokens, 9 passes' worth
    assert planner.plan(room=1000, behind=32).source == "model"


def test_a_long_catch_up_is_charged_to_the_draft():
    planner = _planner({1: 1.0, 16: 3.4}, draft_s=CPU_DRAFT)
    planner.draft.record(64, 4.0)  # the drafter must read 64 ids first
    assert planner.plan(room=1000, behind=0).source == "model"
    assert planner.plan(room=20, behind=64).length == 0  # too little answer left to repay it
    assert planner.plan(room=1000, behind=64).source == "model"  # a long answer repays it
    for _ in range(5):  # drafting has barely paid: it takes more answer to repay the read
        planner.record_round("model", 8, 8, [SURE] * 8, seconds=8.0)
    assert 1.0 < planner.memory.rounds.gain < 1.15
    assert planner.plan(room=30, behind=64).length == 0
    assert planner.plan(room=100, behind=64).source == "model"


def test_the_binned_acceptance_learns_per_entropy_and_ignores_what_follows_a_cut():
    counts = BinnedAcceptance()
    assert counts.q(SURE) == pytest.approx(BIN_PRIORS[0])
    assert counts.q(math.nan) == pytest.approx(BIN_PRIORS[-1])
    counts.record([SURE, SURE, UNSURE, SURE], kept=2)
    sure, unsure = entropy_bin(SURE), entropy_bin(UNSURE)
    assert counts.kept[sure] == pytest.approx(1.95) and counts.cut[sure] == 0  # 1 decayed, then 1
    assert counts.cut[unsure] == pytest.approx(1.0)  # the last token: checked on another prefix
    for _ in range(40):
        counts.record([SURE] * 5, kept=5)
    assert counts.q(SURE) > 0.97 and counts.q(UNSURE) < 0.3


def test_costs_and_acceptance_carry_across_answers_through_the_memory():
    memory = DraftMemory()
    first = DraftPlanner(32, memory=memory)
    first.check.record(1, 1.0)
    first.record_round("model", 10, 10, [SURE] * 10)
    second = DraftPlanner(32, memory=memory)
    assert second.check.estimate(1) == 1.0
    assert second.binned.surest > BinnedAcceptance().surest


def test_free_lookup_drafts_win_where_the_drafter_does_not_pay():
    planner = _planner({1: 1.0, 2: 2.0, 16: 4.2}, draft_s=0.47)
    for _ in range(6):
        planner.record_round("lookup", 12, 12)
    plan = planner.plan(room=100, lookup_available=12)
    assert plan.source == "lookup" and plan.length >= 8
    assert planner.plan(room=100, lookup_available=0).source != "lookup"


def _lookup_planner() -> DraftPlanner:
    # Lookup drafts that have paid and are kept: the kept share alone would take every offer whole.
    planner = _planner(CPU_CHECK, draft_s=CPU_DRAFT)
    for _ in range(6):
        planner.record_round("lookup", 12, 12, seconds=2.0)
    planner.lookup_bound = LOOKUP_FIRST  # a new answer's
    return planner


def test_a_copy_starts_short_and_doubles_while_its_drafts_are_kept_whole():
    planner = _lookup_planner()
    assert planner.plan(room=100, lookup_available=30).length == LOOKUP_FIRST
    planner.record_round("lookup", LOOKUP_FIRST, LOOKUP_FIRST, seconds=1.0)
    assert planner.plan(room=100, lookup_available=30).length == 2 * LOOKUP_FIRST
    planner.record_round("lookup", 2 * LOOKUP_FIRST, 2 * LOOKUP_FIRST, seconds=1.0)
    assert planner.plan(room=100, lookup_available=30).length == min(30, 4 * LOOKUP_FIRST)
    # A cut draft: the copy has left the text, and the next starts short again.
    planner.record_round("lookup", 28, 3, seconds=1.0)
    assert planner.plan(room=100, lookup_available=30).length == LOOKUP_FIRST
    # The bound is the answer's own: another answer on the same memory starts short.
    planner.record_round("lookup", LOOKUP_FIRST, LOOKUP_FIRST, seconds=1.0)
    other = DraftPlanner(32, memory=planner.memory)
    assert other.plan(room=100, lookup_available=30).length == LOOKUP_FIRST


def test_a_new_copy_of_the_answers_own_text_is_not_drafted_but_a_kept_copy_goes_on():
    planner = _lookup_planner()
    assert planner.plan(room=100, lookup_available=30, lookup_in_answer=True).source != "lookup"
    assert planner.plan(room=100, lookup_available=30, lookup_in_answer=False).source == "lookup"
    planner.record_round("lookup", LOOKUP_FIRST, LOOKUP_FIRST, seconds=1.0)
    plan = planner.plan(room=100, lookup_available=30, lookup_in_answer=True)
    assert plan.source == "lookup" and plan.length == 2 * LOOKUP_FIRST
    planner.record_round("lookup", 2 * LOOKUP_FIRST, 0, seconds=1.0)
    assert planner.plan(room=100, lookup_available=30, lookup_in_answer=True).source != "lookup"


def test_the_lookup_index_says_where_its_draft_was_found():
    index = LookupIndex(ngram=3, min_ngram=2)
    ids = [1, 2, 3, 4, 9, 1, 2, 3]
    assert index.draft(ids, 2) == [4, 9] and index.found_at == 3
    ids += [7]
    assert index.draft(ids, 2) == [] and index.found_at == -1


def test_the_fixed_rule_drafts_up_to_the_longest_draft():
    planner = DraftPlanner(32, adaptive=False)
    assert planner.plan(room=100).length == 32
    assert planner.plan(room=5).length == 5
    assert planner.plan(room=0).length == 0
    drafted = _draft(planner, [UNSURE] * 40)
    assert len(drafted) == 32 and planner.settle(drafted) == 32


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
    assert lookup_draft(ids, 0, max_tokens=3, ngram=3, min_ngram=2) == expected[:3]


def test_lookup_respects_its_bounds():
    ids = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]
    assert lookup_draft(ids, 0, max_tokens=2, ngram=3, min_ngram=2) == [4, 5]
    assert lookup_draft(ids, 0, max_tokens=0, ngram=3, min_ngram=2) == []
    assert (
        lookup_draft(ids, 2, max_tokens=4, ngram=3, min_ngram=2) == []
    )  # the only matches start before `start`


def test_lookup_takes_no_tail_shorter_than_its_minimum_and_prefers_the_longest():
    # The 4-id tail 1 2 3 4 was followed by 5 once; its 3-id tail 2 3 4 by 9 later.
    ids = [1, 2, 3, 4, 5, 7, 2, 3, 4, 9, 8, 1, 2, 3, 4]
    assert lookup_draft(ids, 0, max_tokens=1) == [5]
    assert lookup_draft(ids, 0, max_tokens=1, ngram=3, min_ngram=3) == [9]
    assert lookup_draft([5, 6, 7, 0, 5, 6, 7], 0, max_tokens=2) == []  # three ids recur: not enough
    assert LookupIndex().draft([5, 6, 7, 0, 5, 6, 7], 2) == []


def test_the_lookup_index_finds_what_the_naive_scan_finds_as_the_sequence_grows():
    rng = random.Random(3)
    for _ in range(20):
        ids = [rng.randrange(6) for _ in range(rng.randrange(1, 12))]  # a small vocabulary repeats
        ngram, min_ngram = rng.choice([(3, 2), (8, 4), (4, 4)])
        index = LookupIndex(ngram, min_ngram)
        for _ in range(60):
            room = rng.randrange(0, 6)
            assert index.draft(ids, room) == lookup_draft(ids, 0, room, ngram, min_ngram), ids
            ids.extend(rng.randrange(6) for _ in range(rng.randrange(1, 4)))


def test_drafting_stops_where_its_rounds_measured_slower_than_the_top_tier_alone_then_retries():
    planner = _planner(CPU_CHECK, draft_s=CPU_DRAFT)
    assert planner.plan(room=100).source == "model"
    for _ in range(10):  # each drafted round: one token in what two one-row passes cost
        planner.record_round("model", 0, 0, (), seconds=2.0)
    assert planner.memory.rounds.gain < 1.0
    assert planner.plan(room=100).length == 0  # whatever the sure tokens promise on paper
    rounds = 0
    while planner.plan(room=100).source != "model":  # the measurement fades toward the prior
        planner.record_round("none", 0, 0)
        planner.observe_top(SURE)
        rounds += 1
        assert rounds <= 1000, "the planner never tried drafting again"
    assert rounds > 50  # a measured loss is not tried again soon
    planner.record_round("model", 12, 12, [SURE] * 12, seconds=5.0)  # 13 tokens for 5 passes' worth
    assert planner.memory.rounds.gain > 1.0


def test_lookup_drafts_stop_where_their_rounds_measured_slower_than_the_top_tier_alone():
    planner = _planner({1: 1.0, 2: 2.0, 16: 4.2}, draft_s=0.47)
    for _ in range(6):
        planner.record_round("lookup", 12, 12, seconds=4.0)
    assert planner.plan(room=100, lookup_available=12).source == "lookup"
    for _ in range(20):  # offered, checked, and cut at once: a 13-row check for one token
        planner.record_round("lookup", 12, 0, seconds=4.2)
    assert planner.plan(room=100, lookup_available=12).source != "lookup"


def test_answers_that_share_a_memory_each_start_drafts_after_their_own_top_tier_token():
    # A server's batch decodes answers side by side on one ladder's memory: one answer's sure
    # token must not start another's model draft.
    sure = _planner(CPU_CHECK, draft_s=CPU_DRAFT)
    unsure = DraftPlanner(32, memory=sure.memory)
    sure.observe_top(SURE)
    unsure.observe_top(UNSURE)
    assert sure.plan(room=100).source == "model"
    assert unsure.plan(room=100).length == 0


def test_a_check_timed_dear_once_fades_until_lookup_drafts_are_tried_again():
    # What a previous run stored, timed while the machine was shared: a 2-row check at 2.5 steps,
    # which no lookup draft can repay, and which is re-timed only by checking a draft.
    planner = DraftPlanner(32, with_lookup=True, model_drafts=False)
    for rows, seconds in {1: 1.0, 2: 2.5, 8: 9.0}.items():
        planner.check.record(rows, seconds)
    assert planner.plan(room=100, lookup_available=8).source == "none"
    rounds = 0
    while planner.plan(room=100, lookup_available=8).source != "lookup":
        planner.record_round("none", 0, 0)
        rounds += 1
        assert rounds <= 500, "lookup drafts were never tried again"
    assert rounds > 20  # a dear check is not retried every round
    # never priced below a check's first price, and the one-row pass is left as timed
    assert planner.check.estimate(2) >= 1 + PRIOR_ROW_SHARE and planner.check.estimate(1) == 1.0
    # a checked draft re-times its count: measured dear again, drafting stops again
    for _ in range(10):
        planner.check.record(2, 2.5)
        planner.check.record(8, 9.0)
    assert planner.plan(room=100, lookup_available=8).source == "none"
