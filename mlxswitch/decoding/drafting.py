"""How far to draft: each round's draft length, from what passes cost and how much of a draft is kept.

Pure Python (no MLX), replayable on hand-made numbers. A verified-drafting round drafts up to k
tokens, then the top tier checks k + 1 rows in one pass. If each drafted token is kept with
probability p once the ones before it were, a round yields
    E(k) = 1 + p + … + p^k = (1 − p^(k+1)) / (1 − p)
tokens (the kept draft and the top tier's own) for
    cost(k) = k · draft_s + check_s(k + 1)
seconds. The planner picks the k that maximises E(k) / cost(k). k = 0 is the top tier alone (a
one-row check of no draft), taken whenever no draft is expected to beat it: a round is never
planned slower than the large model decoding by itself.

Both sides are measured as the answers go (DraftMemory, kept on the ladder): the seconds of each
pass by row count (so a CPU, where a 16-row pass costs 4× one row, and a Mac, where it costs
about one, each get their own plan), and the acceptance as decayed counts of kept and rejected
drafted tokens. The planner plans with p plus one standard error, so that little evidence leaves
room to try a draft and much evidence decides; while the top tier decodes alone nothing is
observed, the counts decay, the error grows, and a draft is tried again in time.

Drafts from the prompt lookup (an n-gram of the answer's tail found earlier in the sequence)
cost nothing to draft; they keep acceptance counts of their own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Row counts whose check seconds are kept separately; above the last, linear in the rows.
_SMOOTHING = 0.3  # weight of a new timing in a pass's moving average
PRIOR_KEPT, PRIOR_REJECTED = 3.0, 1.0  # pseudo-counts: a draft token is kept with p = 0.75 at first
DECAY = 0.8  # per drafted round: about the last five rounds decide
IDLE_DECAY = 0.93  # per round without a draft: what was seen fades, and the prior returns
# Until a second row count has been timed, each extra row of a check is priced at this share of a
# one-row check: between a Mac (≈ 0) and one CPU core (≈ 0.2 a row measured here), optimistic.
PRIOR_ROW_SHARE = 0.1
PRIOR_DRAFT_SHARE = 0.25  # an untimed drafter's step, as a share of the top tier's one-row pass


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
        """Seconds for a pass of `rows` rows: the timed average, else interpolated between the
        nearest timed row counts, else a line from the one-row cost (nan before any timing)."""
        if rows in self.seconds:
            return self.seconds[rows]
        if not self.seconds:
            return math.nan
        below = [n for n in self.seconds if n < rows]
        above = [n for n in self.seconds if n > rows]
        if below and above:
            lo, hi = max(below), min(above)
            t = (rows - lo) / (hi - lo)
            return (1 - t) * self.seconds[lo] + t * self.seconds[hi]
        return max(0.0, self._base() + self._slope() * (rows - 1))

    def _base(self) -> float:
        smallest = min(self.seconds)
        return self.seconds[smallest] - self._slope() * (smallest - 1)

    def _slope(self) -> float:
        # The seconds each extra row adds: least squares over the timed row counts, never below 0.
        counts = sorted(self.seconds)
        if len(counts) < 2:
            return PRIOR_ROW_SHARE * self.seconds[counts[0]] / (1 + PRIOR_ROW_SHARE * (counts[0] - 1))
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

    @property
    def optimistic_p(self) -> float:
        """p plus one standard error of its evidence (at most 0.99): what the planner plans with,
        so that a little evidence leaves room to try, and much evidence decides."""
        n = self.kept + self.rejected + PRIOR_KEPT + PRIOR_REJECTED
        p = self.p
        return min(0.99, p + math.sqrt(p * (1 - p) / (n + 1)))


@dataclass
class DraftMemory:
    """What verified drafting learned on one ladder, kept across its answers: what the passes cost
    here (the machine's) and how much of each kind of draft the check kept (the text's, decayed)."""

    check: PassCosts = field(default_factory=PassCosts)  # the top tier's passes
    draft: PassCosts = field(default_factory=PassCosts)  # the bottom tier's passes
    model: Acceptance = field(default_factory=Acceptance)
    lookup: Acceptance = field(default_factory=Acceptance)


def expected_tokens(p: float, k: int) -> float:
    """Tokens a round yields with a draft of k tokens, each kept with p once those before were."""
    if p >= 1.0:
        return float(k + 1)
    return (1 - p ** (k + 1)) / (1 - p)


@dataclass(frozen=True)
class Plan:
    """One round's choice: how many tokens to draft, from where, and the rate it expects."""

    length: int  # 0: the top tier alone
    source: str  # "model" (the bottom tier drafts), "lookup" (n-gram), "none"
    tokens_per_s: float  # expected; nan before the first timing


class DraftPlanner:
    """Chooses each round's draft: its source and length (see the module docstring)."""

    def __init__(self, max_draft: int, adaptive: bool = True, memory: DraftMemory | None = None):
        self.max_draft = max_draft
        self.adaptive = adaptive  # False: always draft up to max_draft (the fixed rule, for comparison)
        self.memory = memory if memory is not None else DraftMemory()
        self.check, self.draft = self.memory.check, self.memory.draft
        self.model, self.lookup = self.memory.model, self.memory.lookup

    def plan(self, room: int, lookup_available: int = 0) -> Plan:
        """The draft for a round with `room` tokens left (lookup_available: n-gram tokens on offer)."""
        room = min(room, self.max_draft)
        if room <= 0:
            return Plan(0, "none", self._rate(0, 0.0, 0.0))
        if not self.adaptive:
            return Plan(room, "model", math.nan)
        if 1 not in self.check.seconds:
            # First time the top tier alone (one row): every other plan is priced against it.
            return Plan(0, "none", math.nan)
        best = Plan(0, "none", self._rate(0, 0.0, 0.0))
        # Until the drafter has been timed, it is priced optimistically, so that it is tried once.
        step_s = self.draft.estimate(1) if self.draft.known else PRIOR_DRAFT_SHARE * self.check.estimate(1)
        p_model = self.model.optimistic_p
        for k in range(1, room + 1):
            rate = self._rate(k, p_model, step_s)
            if rate > best.tokens_per_s:
                best = Plan(k, "model", rate)
        p_lookup = self.lookup.optimistic_p
        for k in range(1, min(room, lookup_available) + 1):
            rate = self._rate(k, p_lookup, 0.0)
            if rate > best.tokens_per_s:
                best = Plan(k, "lookup", rate)
        return best

    def _rate(self, k: int, p: float, step_s: float) -> float:
        cost = k * step_s + self.check.estimate(k + 1)
        return expected_tokens(p, k) / cost if cost > 0 else math.nan

    def record_round(self, source: str, drafted: int, kept: int) -> None:
        """What the check kept of a round's draft (source "none": no draft was made)."""
        for kind, counts in (("model", self.model), ("lookup", self.lookup)):
            if source == kind and drafted > 0:
                counts.record(drafted, kept)
            else:
                counts.idle()


def lookup_draft(
    ids: list[int], start: int, max_tokens: int, ngram: int = 3, min_ngram: int = 2
) -> list[int]:
    """Prompt-lookup drafting: the tokens that followed the latest earlier occurrence of the
    sequence's last n ids (n from `ngram` down to `min_ngram`), up to `max_tokens`; [] without one.

    `start` is where the search may begin (0: the prompt and the answer so far)."""
    if max_tokens < 1:
        return []
    end = len(ids)
    for n in range(ngram, min_ngram - 1, -1):
        if end - n <= start:
            continue
        tail = ids[end - n :]
        # The latest earlier match: code answers echo what they just read.
        for at in range(end - n - 1, start - 1, -1):
            if ids[at : at + n] == tail:
                follow = ids[at + n : min(at + n + max_tokens, end)]
                if follow:
                    return list(follow)
    return []
