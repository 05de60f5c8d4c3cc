"""What verified drafting learns as the answers go, kept on the ladder (DraftMemory): each model's
pass seconds by row count (PassCosts), how much of each kind of draft the check kept (per entropy
bin for the drafter's: BinnedAcceptance; one share for lookup's: Acceptance), what each kind's
rounds made over their seconds (RoundYield), and what the drafter's reads of a prompt saved in the
rest of their answers (ReadYield). Pure Python; drafting.py's planner reads it.

A bin's evidence, a kind's measured gain and a dear multi-row pass cost fade toward their priors
while nothing is drafted (IDLE_DECAY, ROUND_IDLE_DECAY), and what reads saved fades with each
answer (READ_ANSWER_DECAY), so drafting is tried again after a stretch where it did not pay.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

# Each row count's pass seconds are a moving average (PassCosts); beyond the largest timed count, a line.
_SMOOTHING = 0.3  # weight of a new timing in a pass's moving average
PRIOR_KEPT, PRIOR_REJECTED = 3.0, 1.0  # pseudo-counts: a draft token is kept with p = 0.75 at first
DECAY = 0.8  # per drafted round: about the last five rounds decide
IDLE_DECAY = 0.93  # per round without a draft: what was seen fades, and the prior returns
# Until a second row count has been timed, each extra row of a check is priced at this share of a
# one-row check: between a Mac (≈ 0) and one CPU core (≈ 0.2 a row measured here), optimistic.
PRIOR_ROW_SHARE = 0.1
# From here up a CPU's pass is one matrix product on NumPy's BLAS (not a mat-vec a row), and on
# the panel kernel past the few rows that cost about one: the regime a line fits.
MATRIX_ROWS = 4
# The drafter's entropy (bits) at a drafted token, binned: upper edges, and each bin's prior kept
# share (a guess, weighted as BIN_PRIOR_WEIGHT tokens, that the checks soon replace).
ENTROPY_BINS = (0.1, 0.3, 0.7, 1.5)
BIN_PRIORS = (0.97, 0.9, 0.75, 0.5, 0.3)
BIN_PRIOR_WEIGHT = 2.0
BIN_DECAY = 0.95  # per checked token in the bin: about its last twenty decide
# The measured gain of the drafter's rounds starts at a prior worth a couple of tokens, decays by
# ROUND_DECAY a drafted round (about the last ten decide); below 1, no model draft is started.
PRIOR_ROUND_TOKENS, PRIOR_ROUND_GAIN, ROUND_DECAY = 4.0, 1.2, 0.9
# Per round without that kind of draft, the measured gain moves back toward the prior: slowly,
# since trying again is what a loss costs (a CPU's multi-row check for a token or two): from a
# gain of 0.75 about 85 rounds pass before the next try, from 0.95 about 20.
ROUND_IDLE_DECAY = 0.99
# What the drafter's reads of a prompt earned (ReadYield): each answer begun fades the totals,
# and below READ_EVIDENCE reads' worth a read is priced as if none had been measured, so one is
# tried again about seven answers after a read that did not pay.
READ_ANSWER_DECAY, READ_EVIDENCE = 0.9, 0.5


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

    def idle(self) -> None:
        """A round that checked no draft: each multi-row count's average dearer than the prior's
        price (a one-row pass plus PRIOR_ROW_SHARE of it a row) moves toward it at
        ROUND_IDLE_DECAY. A count is re-timed only when a draft is checked, and drafts are priced
        by these counts: one timed dear (a shared machine, a run stored before a faster kernel)
        would otherwise keep drafting off for good, on this machine's every later run."""
        one = self.seconds.get(1)
        if one is None:
            return
        for rows, seconds in self.seconds.items():
            prior = one * (1 + PRIOR_ROW_SHARE * (rows - 1))
            if rows > 1 and seconds > prior:
                self.seconds[rows] = prior + ROUND_IDLE_DECAY * (seconds - prior)

    @property
    def known(self) -> bool:
        """Whether any pass has been timed."""
        return bool(self.seconds)

    def estimate(self, rows: int) -> float:
        """Seconds for a pass of `rows` rows: the timed average; else that of the next timed row
        count above; else, beyond the largest timed count, a line from it (nan before any).

        Not interpolated: on a CPU the cost is far from linear in the rows (on NumPy's BLAS one
        mat-vec a row up to 3, then a matrix product that costs as much at 8 rows as at 5:
        bench/results/threads-qwen.txt; on the panel kernel about one row up to 3, then steps of
        6 rows: model-rows-qwen.txt), and a line from one row to ten priced 5 rows at 2/3 of
        their cost."""
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
class ReadYield:
    """Decayed totals over the drafter's reads of a prompt: how many, and the one-row passes of the
    top tier its rounds saved in the rest of those answers. Beside prompt lookup, a drafter that
    has read a HumanEval prompt drafts a few of the answer's tokens (lookup copies most, and the
    answer ends long before its room): live, a read saved 0.5-3 passes where it cost 6-12. An
    answer's room, at the gain of the drafter's rounds, promises far more than a read earns."""

    reads: float = 0.0
    saved: float = 0.0

    @property
    def per_read(self) -> float | None:
        """One-row passes a read saved, on average (None: too few reads measured)."""
        return self.saved / self.reads if self.reads >= READ_EVIDENCE else None

    def read(self) -> None:
        """The drafter reads an answer's prompt."""
        self.reads += 1.0

    def record(self, saved: float) -> None:
        """A drafter's round after a read: `saved` one-row passes (negative: it cost more)."""
        self.saved += saved

    def new_answer(self) -> None:
        """An answer begins: what was measured fades."""
        self.reads *= READ_ANSWER_DECAY
        self.saved *= READ_ANSWER_DECAY


@dataclass
class DraftMemory:
    """What verified drafting learned on one ladder, kept across its answers: what the passes cost
    here (the machine's) and how much of each kind of draft the check kept (the text's, decayed)."""

    check: PassCosts = field(default_factory=PassCosts)  # the top tier's passes
    draft: PassCosts = field(default_factory=PassCosts)  # the bottom tier's passes
    binned: BinnedAcceptance = field(default_factory=BinnedAcceptance)  # per token, by entropy
    rounds: RoundYield = field(default_factory=RoundYield)  # what the drafter's rounds made
    lookup_rounds: RoundYield = field(default_factory=RoundYield)  # what the lookup's rounds made
    lookup_kept: Acceptance = field(default_factory=Acceptance)
    reads: ReadYield = field(default_factory=ReadYield)  # what the drafter's prompt reads earned
