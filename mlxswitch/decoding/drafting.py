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
  (with prompt lookup on, in this round, the drafter's reading of what it has not seen included:
  the prompt, the first time, and the tokens lookup drafts and the top tier made since), and the
  rest of the answer, at the gain drafting has measured, can repay what the drafter must read
  first and one round that comes to nothing;
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
So on a CPU where a 16-row check costs 3.4 one-row passes and the 0.5B 0.41 of the 1.5B, drafts
are made only through stretches the drafter is sure of, and the top tier decodes alone
elsewhere; on a Mac, where a check costs about one row, drafts run long. Replayed on the Qwen
pair's recorded answers (bench/replay_drafting.py), the 0.5B's rounds here make at best 1.25×
the 1.5B's one-row rate (HumanEval, drafter in step), lookup rounds 3.7×: where lookup drafts
are on offer the drafter falls behind, and the reading that costs keeps it from starting.

Pass costs are measured by row count as the answers go (PassCosts) and kept, with the kept
shares, on the ladder (DraftMemory); a bin's evidence and a kind's measured gain fade toward
their priors while nothing is drafted (IDLE_DECAY), so drafting is tried again after a stretch
where it did not pay.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# Bounds a round's rows (a check is one batched pass) and how long a stream waits for a check.
MAX_DRAFT = 32
# Row counts whose check seconds are kept separately; above the last, linear in the rows.
_SMOOTHING = 0.3  # weight of a new timing in a pass's moving average
PRIOR_KEPT, PRIOR_REJECTED = 3.0, 1.0  # pseudo-counts: a draft token is kept with p = 0.75 at first
DECAY = 0.8  # per drafted round: about the last five rounds decide
IDLE_DECAY = 0.93  # per round without a draft: what was seen fades, and the prior returns
# Until a second row count has been timed, each extra row of a check is priced at this share of a
# one-row check: between a Mac (≈ 0) and one CPU core (≈ 0.2 a row measured here), optimistic.
PRIOR_ROW_SHARE = 0.1
MATRIX_ROWS = 4  # from here up a CPU's pass is one matrix product, not a mat-vec per row
PRIOR_DRAFT_SHARE = 0.25  # an untimed drafter's step, as a share of the top tier's one-row pass
MIN_GAIN = 1.05  # the least expected speed-up over the top tier alone that a draft must promise
# The drafter's entropy (bits) at a drafted token, binned: upper edges, and each bin's prior kept
# share (a guess, weighted as BIN_PRIOR_WEIGHT tokens, that the checks soon replace).
ENTROPY_BINS = (0.1, 0.3, 0.7, 1.5)
BIN_PRIORS = (0.97, 0.9, 0.75, 0.5, 0.3)
BIN_PRIOR_WEIGHT = 2.0
BIN_DECAY = 0.95  # per checked token in the bin: about its last twenty decide
START_MAX_ENTROPY = 0.5  # a model draft starts only after a top-tier token this sure (bits)
# The measured gain of the drafter's rounds starts at a prior worth a couple of tokens, decays by
# ROUND_DECAY a drafted round (about the last ten decide); below 1, no model draft is started.
PRIOR_ROUND_TOKENS, PRIOR_ROUND_GAIN, ROUND_DECAY = 4.0, 1.2, 0.9
# A lookup draft is at most LOOKUP_FIRST tokens until one is kept whole in this answer; each one
# kept whole doubles the next's bound, a cut one resets it. The kept share prices a copy's tokens
# as if each were as likely as the last, but a copy's first tokens are where it fails, and a long
# check costs several one-row passes on a CPU: a 25-token draft that kept 1 cost 1.3 s
# (everyday-heldout2-pair-v12). 7 tokens: an 8-row check, which costs a CPU what a 4-row one does.
LOOKUP_FIRST = 7
# Per round without that kind of draft, the measured gain moves back toward the prior: slowly,
# since trying again is what a loss costs (a CPU's multi-row check for a token or two): from a
# gain of 0.75 about 85 rounds pass before the next try, from 0.95 about 20.
ROUND_IDLE_DECAY = 0.99


@dataclass
class PassCosts:
    """Moving averages of one model's pass seconds by row count, and a line through them."""

    seconds: dict[int, float] = field(default_factory=dict)

    def record(self, rows: int, seconds: float) -> None:
        """Fold one timed pass of `rows` rows into its row count's average."""
        if rows < 1 or not math.isfinite(seconds) or seconds < 0:
            return
        old = self.seconds.get(rows)
        self.seconds[rows] = seconds if old is None else (1 - _SMOOTHING) * old + _SMOOTHING * seconds

    @property
    def known(self) -> bool:
        """Whether any pass has been timed."""
        return bool(self.seconds)

    def estimate(self, rows: int) -> float:
        """Seconds for a pass of `rows` rows: the timed average; else that of the next timed row
        count above; else, beyond the largest timed count, a line from it (nan before any).

        Not interpolated: on a CPU the cost is far from linear in the rows (one mat-vec a row up
        to 3, then a matrix product that costs as much at 8 rows as at 5: bench/results/
        threads-qwen.txt), and a line from one row to ten priced 5 rows at 2/3 of their cost."""
        if rows in self.seconds:
            return self.seconds[rows]
        if not self.seconds:
            return math.nan
        above = [n for n in self.seconds if n > rows]
        if above:
            return self.seconds[min(above)]
        largest = max(self.seconds)
        return self.seconds[largest] + self._slope() * (rows - largest)

    def _slope(self) -> float:
        # The seconds each row adds beyond the largest timed count: least squares over the timed
        # counts from MATRIX_ROWS up (the matrix-product regime), never below 0. Until two such
        # are timed, the prior share of a one-row pass: optimistic, so that a long check is tried
        # once rather than priced out by the mat-vec slope of 2 or 3 rows (a row each).
        counts = sorted(n for n in self.seconds if n >= MATRIX_ROWS)
        if len(counts) < 2:
            smallest = min(self.seconds)
            return PRIOR_ROW_SHARE * self.seconds[smallest] / (1 + PRIOR_ROW_SHARE * (smallest - 1))
        mean_n = sum(counts) / len(counts)
        mean_t = sum(self.seconds[n] for n in counts) / len(counts)
        var = sum((n - mean_n) ** 2 for n in counts)
        cov = sum((n - mean_n) * (self.seconds[n] - mean_t) for n in counts)
        return max(0.0, cov / var)


@dataclass
class Acceptance:
    """Decayed counts of drafted tokens kept and drafts cut short by the check."""

    kept: float = 0.0
    rejected: float = 0.0

    @property
    def p(self) -> float:
        """The chance a drafted token is kept once the ones before it were (prior included)."""
        return (self.kept + PRIOR_KEPT) / (self.kept + self.rejected + PRIOR_KEPT + PRIOR_REJECTED)

    def record(self, drafted: int, kept: int) -> None:
        """One checked draft: `kept` of its `drafted` tokens survived the check."""
        self.kept = DECAY * self.kept + kept
        self.rejected = DECAY * self.rejected + (1 if kept < drafted else 0)

    def idle(self) -> None:
        """A round with no draft of this kind: the evidence fades toward the prior."""
        self.kept *= IDLE_DECAY
        self.rejected *= IDLE_DECAY


def entropy_bin(entropy: float) -> int:
    """The bin of a drafted token by the drafter's entropy there (bits; nan: the least sure)."""
    return bisect.bisect_left(ENTROPY_BINS, entropy) if math.isfinite(entropy) else len(ENTROPY_BINS)


@dataclass
class BinnedAcceptance:
    """Per entropy bin, decayed counts of the drafter's checked tokens the check kept and cut."""

    kept: list[float] = field(default_factory=lambda: [0.0] * len(BIN_PRIORS))
    cut: list[float] = field(default_factory=lambda: [0.0] * len(BIN_PRIORS))

    def q(self, entropy: float) -> float:
        """The chance a token drafted at this entropy is kept, once those before it were."""
        b = entropy_bin(entropy)
        prior = BIN_PRIOR_WEIGHT * BIN_PRIORS[b]
        return (self.kept[b] + prior) / (self.kept[b] + self.cut[b] + BIN_PRIOR_WEIGHT)

    @property
    def surest(self) -> float:
        """The kept share of the surest bin: what a draft can at best expect."""
        return self.q(0.0)

    def record(self, entropies: Sequence[float], kept: int) -> None:
        """One checked draft (the drafter's entropy at each token): the first `kept` survived, the
        next (if any) was cut; those after it were checked against another prefix and say nothing."""
        for i, entropy in enumerate(entropies[: kept + 1]):
            b = entropy_bin(entropy)
            self.kept[b] *= BIN_DECAY
            self.cut[b] *= BIN_DECAY
            if i < kept:
                self.kept[b] += 1
            else:
                self.cut[b] += 1

    def idle(self) -> None:
        """A round with no model draft: the evidence fades toward the priors."""
        self.kept = [k * IDLE_DECAY for k in self.kept]
        self.cut = [c * IDLE_DECAY for c in self.cut]


@dataclass
class RoundYield:
    """Decayed totals of what the drafter's rounds made: tokens, and their seconds counted in the
    top tier's one-row passes. Their ratio is the measured gain of drafting over the top tier
    alone, everything included that the plan leaves out (catch-ups, dropped drafts, Python)."""

    tokens: float = PRIOR_ROUND_TOKENS
    steps: float = PRIOR_ROUND_TOKENS / PRIOR_ROUND_GAIN
    rounds: float = 1.0  # the prior counts as one round

    @property
    def gain(self) -> float:
        """Tokens per one-row pass's worth of seconds: above 1, the drafter's rounds paid."""
        return self.tokens / self.steps

    @property
    def saving(self) -> float:
        """One-row passes a recent round saved on average (negative: it cost more than it made)."""
        return (self.tokens - self.steps) / self.rounds

    def record(self, tokens: int, steps: float) -> None:
        """One model-drafted round: `tokens` made in `steps` one-row passes' worth of seconds."""
        self.tokens = ROUND_DECAY * self.tokens + tokens
        self.steps = ROUND_DECAY * self.steps + steps
        self.rounds = ROUND_DECAY * self.rounds + 1

    def idle(self) -> None:
        """A round without the drafter: the totals fade toward the prior's gain."""
        prior_steps = PRIOR_ROUND_TOKENS / PRIOR_ROUND_GAIN
        self.tokens = ROUND_IDLE_DECAY * self.tokens + (1 - ROUND_IDLE_DECAY) * PRIOR_ROUND_TOKENS
        self.steps = ROUND_IDLE_DECAY * self.steps + (1 - ROUND_IDLE_DECAY) * prior_steps
        self.rounds = ROUND_IDLE_DECAY * self.rounds + (1 - ROUND_IDLE_DECAY)


@dataclass
class DraftMemory:
    """What verified drafting learned on one ladder, kept across its answers: what the passes cost
    here (the machine's) and how much of each kind of draft the check kept (the text's, decayed)."""

    check: PassCosts = field(default_factory=PassCosts)  # the top tier's passes
    draft: PassCosts = field(default_factory=PassCosts)  # the bottom tier's passes
    binned: BinnedAcceptance = field(default_factory=BinnedAcceptance)  # per token, by entropy
    rounds: RoundYield = field(default_factory=RoundYield)  # what the drafter's rounds made
    lookup_rounds: RoundYield = field(default_factory=RoundYield)  # what the lookup's rounds made
    lookup: Acceptance = field(default_factory=Acceptance)


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
        # kept, so a model draft pays its whole reading in the round it starts (see plan).
        self.with_lookup = with_lookup
        self.memory = memory if memory is not None else DraftMemory()
        self.check, self.draft = self.memory.check, self.memory.draft
        self.lookup = self.memory.lookup
        self.binned = self.memory.binned
        # The top tier's entropy (bits) on this answer's latest own token: a model draft starts
        # after a sure one. Or the function that measures it, called only if a plan gets that far
        # (observe_top). The answer's own, not the memory's: answers decoded together share that.
        self.top_entropy: float | Callable[[], float] = math.nan
        # The longest lookup draft this answer may check next (LOOKUP_FIRST, doubled by each kept
        # whole): the answer's own, as its copy runs are.
        self.lookup_bound = LOOKUP_FIRST

    def plan(
        self, room: int, lookup_available: int = 0, behind: int = 0, lookup_in_answer: bool = False
    ) -> Plan:
        """The draft for a round with `room` tokens left (lookup_available: n-gram tokens on offer;
        behind: ids the drafter must read before it drafts; lookup_in_answer: the offer copies
        the answer itself, not the prompt)."""
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
        p_lookup = self.lookup.p
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
            # lookup, what the drafter must read first (the ids it has not seen) is in this round's
            # price; without it, the prompt's read is repaid from the rest of the answer (below).
            surest, step_s, reading = self.binned.surest, self._step_s(), self._catch_up(behind)
            catch_up = reading if self.with_lookup else 0.0
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
                    reading, answer_room, projected / alone.tokens_per_s
                ):
                    best = Plan(room, "model", projected)
        return best if best.length else alone

    def _top_was_sure(self) -> bool:
        # The top tier's latest own token was sure enough to start a model draft after (nan, none
        # yet: not sure); a measuring function is called here, once, and its value kept.
        entropy = self.top_entropy
        if callable(entropy):
            entropy = self.top_entropy = entropy()
        return entropy <= START_MAX_ENTROPY

    def _repays_catch_up(self, reading_s: float, answer_room: int, projected_gain: float) -> bool:
        # What the drafter must read first (the prompt, the first time; what the top tier made
        # alone since) and one round that may come to nothing are paid once; drafting can repay
        # them only from the rest of the answer, at the gain its rounds have measured (or the
        # plan's, if lower). So a short answer on a machine where drafting barely pays is left to
        # the top tier alone, and a long one is drafted.
        top_s = self.check.estimate(1)
        gain = min(self.memory.rounds.gain, projected_gain)
        saving_s = answer_room * top_s * (1.0 - 1.0 / gain)
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
        for kind, rounds in (("model", memory.rounds), ("lookup", memory.lookup_rounds)):
            if source != kind:
                rounds.idle()
            elif math.isfinite(seconds) and top_s > 0:
                rounds.record(kept + 1 if tokens is None else tokens, seconds / top_s)
        if source == "lookup" and drafted > 0:
            memory.lookup.record(drafted, kept)
            self.lookup_bound = 2 * self.lookup_bound if kept == drafted else LOOKUP_FIRST
        else:
            memory.lookup.idle()
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
