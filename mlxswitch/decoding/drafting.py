"""How far to draft: each round's draft, from what passes cost and how sure the drafter is.

Pure Python (no MLX), replayable on hand-made numbers. A verified-drafting round drafts n tokens,
then the top tier checks n + 1 rows in one pass; the draft is kept up to its first token the top
tier samples differently, and the top tier's own token follows. If the i-th drafted token is kept
with probability q_i once those before it were, the round yields
    E(n) = 1 + S_1 + … + S_n,   S_i = q_1 · … · q_i
tokens for
    cost(n) = n · draft_s + check_s(n + 1)
seconds. n = 0 is the top tier alone (a one-row check of no draft).

q_i is read from the drafter's own entropy at that token, binned (ENTROPY_BINS): each bin keeps
decayed counts of its drafted tokens the check kept and cut (BinnedAcceptance). A kept share per
bin, not one share per draft, is what follows bursty text: the drafter is sure through a
docstring it can finish and unsure at the name it must invent, and the check agrees.

A round goes (DraftPlanner):
- plan: a model draft is started only where the top tier was sure of its latest own token, a
  draft made entirely of the drafter's surest tokens would beat the top tier alone by MIN_GAIN
  (with prompt lookup on, in this round, the drafter's reading of the answer it has not seen
  included: the tokens lookup drafts and the top tier made since it last drafted), and the rest
  of the answer, at the gain drafting has measured, can repay what the drafter must read first
  (the prompt too, the first time: that at most by what earlier reads earned in the rest of their
  answers, draft_memory.ReadYield) and one round that comes to nothing;
  else the top tier decodes alone (or checks a free prompt-lookup draft, lookup.py: n-gram tokens that
  followed an earlier occurrence of the answer's tail, with their own kept share; a new copy is
  drafted only from the prompt, and short until a draft of it is kept whole: LOOKUP_FIRST);
- keep_drafting: after each drafted token, drafting goes on while some longer draft, its next
  tokens as sure as the last one, promises a better rate for the round than stopping there;
- settle: the check takes the prefix with the best rate, the drafting seconds already spent
  counted in every option; 0 (the drafted tokens dropped) when even the best prefix does worse
  than a one-row pass.
Each kind of draft must also have paid, measured: the tokens its recent rounds made over their
seconds (catch-ups, dropped drafts and Python included; the drafter's one read of the prompt
excepted), in one-row passes of the top tier (RoundYield). Below 1, no such draft is started.
So on a CPU where a 16-row check costs 3.4 one-row passes (NumPy's BLAS; 2.2 on the panel kernel,
bench/results/model-rows-qwen.txt) and the 0.5B 0.41 of the 1.5B, drafts
are made only through stretches the drafter is sure of, and the top tier decodes alone
elsewhere; on a Mac, where a check costs about one row, drafts run long. Replayed on the Qwen
pair's recorded answers (bench/replay_drafting.py --no-lookup, draft-replay-pair.txt), the
0.5B's rounds here make at best 1.23× the 1.5B's one-row rate (HumanEval, drafter in step),
lookup rounds 3.7×: where lookup drafts are on offer the drafter falls behind, and the reading
that costs keeps it from starting.

What the planner reads (pass costs by row count, kept shares by entropy bin, what each kind of
round made) is learned as the answers go and kept on the ladder: draft_memory.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from .draft_memory import DraftMemory

# Bounds a round's rows (a check is one batched pass) and how long a stream waits for a check.
MAX_DRAFT = 32
PRIOR_DRAFT_SHARE = 0.25  # an untimed drafter's step, as a share of the top tier's one-row pass
MIN_GAIN = 1.05  # the least expected speed-up over the top tier alone that a draft must promise
START_MAX_ENTROPY = 0.5  # a model draft starts only after a top-tier token this sure (bits)
# A lookup draft is at most LOOKUP_FIRST tokens until one is kept whole in this answer; each one
# kept whole doubles the next's bound, a cut one resets it. The kept share prices a copy's tokens
# as if each were as likely as the last, but a copy's first tokens are where it fails, and a long
# check costs several one-row passes on a CPU: a 25-token draft that kept 1 cost 1.3 s
# (everyday-heldout2-pair-v12: git show 824b46b:bench/results/everyday-heldout2-pair-v12.jsonl).
# 7 tokens: an 8-row check, which on NumPy's BLAS costs what a 4-row one does (on the panel kernel
# 1.6 against 1.2 one-row passes: model-rows-qwen.txt).
LOOKUP_FIRST = 7


def expected_tokens(p: float, k: int) -> float:
    """Tokens a round yields with a draft of k tokens, each kept with p once those before were."""
    if p >= 1.0:
        return float(k + 1)
    return (1 - p ** (k + 1)) / (1 - p)


@dataclass(frozen=True)
class Plan:
    """One round's choice: how many tokens to draft at most, from where, and the rate it expects."""

    length: int  # 0: the top tier alone
    source: str  # "model" (the bottom tier drafts), "lookup" (n-gram), "none"
    tokens_per_s: float  # expected; nan before the first timing


class DraftPlanner:
    """Chooses each round's draft: its source and length (see the module docstring)."""

    def __init__(
        self,
        max_draft: int,
        adaptive: bool = True,
        memory: DraftMemory | None = None,
        with_lookup: bool = False,
        model_drafts: bool = True,
    ):
        self.max_draft = max_draft
        # False: lookup drafts only (a routed token loop's rung checks them with its own model;
        # there is no drafter below it to draft with).
        self.model_drafts = model_drafts
        self.adaptive = adaptive  # False: always draft up to max_draft (the fixed rule, for comparison)
        # Prompt lookup on: model drafts compete with free ones and fall behind while those are
        # kept, so a model draft pays its reading of the answer in the round it starts; the
        # prompt's read is repaid over the answer either way (see plan).
        self.with_lookup = with_lookup
        self.memory = memory if memory is not None else DraftMemory()
        self.check, self.draft = self.memory.check, self.memory.draft
        self.lookup_kept = self.memory.lookup_kept
        self.binned = self.memory.binned
        # The top tier's entropy (bits) on this answer's latest own token: a model draft starts
        # after a sure one. Or the function that measures it, called only if a plan gets that far
        # (observe_top). The answer's own, not the memory's: answers decoded together share that.
        self.top_entropy: float | Callable[[], float] = math.nan
        # The longest lookup draft this answer may check next (LOOKUP_FIRST, doubled by each kept
        # whole): the answer's own, as its copy runs are.
        self.lookup_bound = LOOKUP_FIRST
        # Whether this answer's drafter has read its prompt: its rounds after it teach what a read
        # earns (memory.reads), which each answer begun lets fade.
        self.read_prompt = False
        if model_drafts:
            self.memory.reads.new_answer()

    def plan(
        self,
        room: int,
        lookup_available: int = 0,
        behind: int = 0,
        lookup_in_answer: bool = False,
        unread_prompt: int = 0,
    ) -> Plan:
        """The draft for a round with `room` tokens left (lookup_available: n-gram tokens on offer;
        behind: ids the drafter must read before it drafts, unread_prompt of them the prompt's;
        lookup_in_answer: the offer copies the answer itself, not the prompt)."""
        answer_room = room
        room = min(room, self.max_draft)
        if room <= 0:
            return Plan(0, "none", self._rate(0, 0.0, 0.0))
        if not self.adaptive:
            return Plan(room, "model", math.nan)
        if 1 not in self.check.seconds:
            # First time the top tier alone (one row): every other plan is priced against it.
            return Plan(0, "none", math.nan)
        alone = Plan(0, "none", self._rate(0, 0.0, 0.0))
        # A draft must promise MIN_GAIN over the top tier alone: what the model leaves out (timing
        # noise, the Python between passes) is paid by drafts that barely pay on paper.
        best = Plan(0, "none", alone.tokens_per_s * MIN_GAIN)
        p_lookup = self.lookup_kept.p
        # Lookup drafts too are offered only while their rounds, measured, beat the top tier alone.
        offered = min(lookup_available, self.lookup_bound) if self.memory.lookup_rounds.gain > 1.0 else 0
        if lookup_in_answer and self.lookup_bound <= LOOKUP_FIRST:
            # A new copy of the answer's own text: kept too seldom to pay (lookup.py). One goes on
            # only from a copy whose last draft was kept whole.
            offered = 0
        for k in range(1, min(room, offered) + 1):
            rate = self._rate(k, p_lookup, 0.0)
            if rate > best.tokens_per_s:
                best = Plan(k, "lookup", rate)
        if best.source == "none" and self.model_drafts and self.memory.rounds.gain > 1.0:
            # A draft of the drafter's surest tokens only: the best any model draft can do. Beside
            # lookup, what the drafter must read of the answer first (the tokens lookup drafts and
            # the top tier made since it last drafted) is in this round's price; the prompt's read,
            # once an answer, is repaid from the rest of the answer (below), lookup or not.
            surest, step_s, reading = self.binned.surest, self._step_s(), self._catch_up(behind)
            catch_up = self._catch_up(behind - unread_prompt) if self.with_lookup else 0.0
            # Beside lookup the reading must also be repaid by one round as recent rounds went:
            # the projection's best case prices long checks from a few timed counts, and drafts
            # stop at the drafter's first doubt, well short of it.
            measured = not self.with_lookup or self.memory.rounds.saving * self.check.estimate(1) > catch_up
            if measured and self._top_was_sure():
                projected = max(
                    expected_tokens(surest, k) / (catch_up + k * step_s + self.check.estimate(k + 1))
                    for k in range(1, room + 1)
                )
                if projected > best.tokens_per_s and self._repays_catch_up(
                    reading, answer_room, projected / alone.tokens_per_s, unread_prompt > 0
                ):
                    best = Plan(room, "model", projected)
                    if unread_prompt > 0 and not self.read_prompt:
                        self.read_prompt = True
                        self.memory.reads.read()
        return best if best.length else alone

    def _top_was_sure(self) -> bool:
        # The top tier's latest own token was sure enough to start a model draft after (nan, none
        # yet: not sure); a measuring function is called here, once, and its value kept.
        entropy = self.top_entropy
        if callable(entropy):
            entropy = self.top_entropy = entropy()
        return entropy <= START_MAX_ENTROPY

    def _repays_catch_up(
        self, reading_s: float, answer_room: int, projected_gain: float, reads_prompt: bool
    ) -> bool:
        # What the drafter must read first (the prompt, the first time; what the top tier made
        # alone since) and one round that may come to nothing are paid once; drafting can repay
        # them only from the rest of the answer, at the gain its rounds have measured (or the
        # plan's, if lower). So a short answer on a machine where drafting barely pays is left to
        # the top tier alone, and a long one is drafted. A prompt's read is repaid at most by what
        # reads have earned since, where that has been measured (draft_memory.ReadYield).
        top_s = self.check.estimate(1)
        gain = min(self.memory.rounds.gain, projected_gain)
        saving_s = answer_room * top_s * (1.0 - 1.0 / gain)
        per_read = self.memory.reads.per_read if reads_prompt else None
        if per_read is not None:
            saving_s = min(saving_s, per_read * top_s)
        return saving_s > reading_s + top_s

    def keep_drafting(self, entropies: Sequence[float], room: int) -> bool:
        """After each drafted token (the drafter's entropies so far): draft another? Yes while a
        longer draft, its further tokens kept as often as the last one's bin, promises a better
        rate for the round than checking now; the fixed rule drafts to `room`."""
        n = len(entropies)
        if n >= room:
            return False
        if not self.adaptive:
            return True
        survive, expected = self._survival(entropies)
        now = max(self._options(survive, expected, n))
        q_next = self.binned.q(entropies[-1])
        step = self._step_s()
        sunk = n * step
        s, tokens = survive[-1], expected[-1]
        for j in range(1, room - n + 1):
            s *= q_next
            tokens += s
            if tokens / (sunk + j * step + self.check.estimate(n + j + 1)) > now:
                return True
        return False

    def settle(self, entropies: Sequence[float]) -> int:
        """How much of a model draft to check: the prefix with the best rate for the round (its
        drafting already paid); 0 where a one-row pass of the top tier alone does better."""
        if not self.adaptive or not entropies:
            return len(entropies)
        survive, expected = self._survival(entropies)
        rates = self._options(survive, expected, len(entropies))
        best = max(range(len(rates)), key=lambda m: (rates[m], m))
        return best

    def _survival(self, entropies: Sequence[float]) -> tuple[list[float], list[float]]:
        # S_i (the chance the first i drafted tokens are all kept) and E(i), for i = 0 … n.
        survive, expected = [1.0], [1.0]
        for entropy in entropies:
            survive.append(survive[-1] * self.binned.q(entropy))
            expected.append(expected[-1] + survive[-1])
        return survive, expected

    def _options(self, survive: list[float], expected: list[float], n: int) -> list[float]:
        # The round's rate if the first m of n drafted tokens are checked, m = 0 … n; m = 0 is a
        # one-row pass of the top tier (its rate without the drafting: that is not undone).
        sunk = n * self._step_s()
        rates = [1.0 / (sunk + self.check.estimate(1))]
        rates += [expected[m] / (sunk + self.check.estimate(m + 1)) for m in range(1, n + 1)]
        return rates

    def _step_s(self) -> float:
        # Until the drafter has been timed, it is priced optimistically, so that it is tried once.
        return self.draft.estimate(1) if self.draft.known else PRIOR_DRAFT_SHARE * self.check.estimate(1)

    def _catch_up(self, behind: int) -> float:
        # The seconds of the drafter's first pass beyond those of a one-row step.
        if behind <= 1 or not self.draft.known:
            return 0.0
        return max(0.0, self.draft.estimate(behind) - self.draft.estimate(1))

    def _rate(self, k: int, p: float, step_s: float) -> float:
        cost = k * step_s + self.check.estimate(k + 1)
        return expected_tokens(p, k) / cost if cost > 0 else math.nan

    def record_round(
        self,
        source: str,
        drafted: int,
        kept: int,
        entropies: Sequence[float] = (),
        seconds: float = math.nan,
        tokens: int | None = None,
    ) -> None:
        """What the check kept of a round's draft (source "none": no draft was made; entropies:
        the drafter's at each checked model-drafted token; seconds: the round's, from its plan to
        its check read, the drafter's catch-up included; tokens: the positions those seconds made,
        kept + 1 unless given)."""
        memory = self.memory
        top_s = self.check.estimate(1)
        made = kept + 1 if tokens is None else tokens
        if self.read_prompt and source == "model" and math.isfinite(seconds) and top_s > 0:
            memory.reads.record(made - seconds / top_s)
        if drafted == 0:
            self.check.idle()
        for kind, rounds in (("model", memory.rounds), ("lookup", memory.lookup_rounds)):
            if source != kind:
                rounds.idle()
            elif math.isfinite(seconds) and top_s > 0:
                rounds.record(made, seconds / top_s)
        if source == "lookup" and drafted > 0:
            memory.lookup_kept.record(drafted, kept)
            self.lookup_bound = 2 * self.lookup_bound if kept == drafted else LOOKUP_FIRST
        else:
            memory.lookup_kept.idle()
        if source == "model" and drafted > 0 and entropies:
            self.binned.record(entropies[:drafted], kept)
        else:
            self.binned.idle()

    def observe_top(self, entropy: float | Callable[[], float]) -> None:
        """The top tier made a token of its own, sampled from a distribution of this entropy; or
        a function that measures it, called only if a plan needs it (on a CPU the read costs about
        a millisecond over a 152k-id vocabulary, and most rounds are decided without it)."""
        if callable(entropy) or math.isfinite(entropy):
            self.top_entropy = entropy


@dataclass
class ModelDraft:
    """A round's model draft as the drafter makes it, position by position, and the part settled
    for the check: part of the round (verified_round.py) that the live loop and
    bench/replay_drafting.py both run (a test holds them to the same rounds on a recorded answer)."""

    threshold: float  # a position whose routed signal exceeds it ends the draft without a token
    room: int  # the longest draft the round allows
    eos: Collection[int]
    tokens: list[int] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)  # the drafter's, at each drafted token
    # The routed signal at each position the drafter computed: its tokens', then the one that
    # ended the draft unsure (settle leaves these whole: the position after the kept ones is read).
    signals: list[float | None] = field(default_factory=list)
    ended_unsure: bool = False  # ended at a position the drafter was unsure of, or cut by settle

    def take(self, token: int, entropy: float, signal: float, planner: DraftPlanner) -> bool:
        """The drafter's next position (its token, entropy and routed signal): whether to draft
        another. An unsure position ends the draft without its token; an end-of-sequence token, or
        the planner's keep_drafting, after it."""
        self.signals.append(signal)
        if not math.isfinite(signal) or signal > self.threshold:
            self.ended_unsure = True
            return False
        self.tokens.append(token)
        self.entropies.append(entropy)
        return token not in self.eos and planner.keep_drafting(self.entropies, self.room)

    def settle(self, planner: DraftPlanner) -> None:
        """Keep the prefix the planner checks (DraftPlanner.settle), once the drafting is done; the
        rest is dropped unchecked, though the drafter computed it."""
        checked = planner.settle(self.entropies)
        if checked < len(self.tokens):
            del self.tokens[checked:], self.entropies[checked:]
            self.ended_unsure = True


def kept_prefix(draft: Sequence[int], samples: Sequence[int]) -> int:
    """How much of the draft stands: up to the first position where the top tier's own sample
    differs. Each kept token is then that sample, so the answer is drawn as the top tier alone
    draws it (the test of this plants a bias here and must see it)."""
    kept = 0
    while kept < len(draft) and kept < len(samples) and samples[kept] == draft[kept]:
        kept += 1
    return kept
