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
drafted tokens. While the top tier decodes alone nothing is learnt about the drafter, so after
PROBE_GAP such rounds, once the top tier's own last tokens were sure (mean entropy ≤ 0.5 bits),
a short probe draft measures the kept share again; a probe that did not pay doubles the gap (up
to MAX_PROBE_GAP), one that did resets it. On a CPU where a 25-row check
costs six one-row passes and the 0.5B 0.43 of the 1.5B, drafting pays only where nearly every
drafted token is kept; the probes are what it costs to find out.

Drafts from the prompt lookup (an n-gram of the answer's tail found earlier in the sequence)
cost nothing to draft; they keep acceptance counts of their own.
"""

from __future__ import annotations

import math
from collections import deque
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
MIN_GAIN = 1.05  # the least expected speed-up over the top tier alone that a draft must promise
PROBE_LENGTH = 8  # tokens a probe drafts
PROBE_GAP, MAX_PROBE_GAP = 8, 256  # rounds without the drafter before a probe: first, at most
PROBE_WINDOW, PROBE_MAX_ENTROPY = 8, 0.5  # a probe waits for the top tier's last 8 tokens ≤ 0.5 bits


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
        count above; else a line through the timings, never below the largest (nan before any).

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
        return max(self.seconds[largest], self._base() + self._slope() * (rows - 1))

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


@dataclass
class DraftMemory:
    """What verified drafting learned on one ladder, kept across its answers: what the passes cost
    here (the machine's) and how much of each kind of draft the check kept (the text's, decayed)."""

    check: PassCosts = field(default_factory=PassCosts)  # the top tier's passes
    draft: PassCosts = field(default_factory=PassCosts)  # the bottom tier's passes
    model: Acceptance = field(default_factory=Acceptance)
    lookup: Acceptance = field(default_factory=Acceptance)
    # Rounds since the drafter last drafted, and how many may pass before a probe draft measures
    # the kept share again (doubled after each probe that did not pay, reset by one that did).
    rounds_without_model: int = 0
    probe_gap: int = PROBE_GAP
    # The top tier's entropy (bits) on its latest own tokens: a probe waits until it is sure.
    top_entropies: deque[float] = field(default_factory=lambda: deque(maxlen=PROBE_WINDOW))


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
        alone = Plan(0, "none", self._rate(0, 0.0, 0.0))
        # A draft must promise MIN_GAIN over the top tier alone: what the model leaves out (the
        # drafter's catch-up rows, timing noise) is paid by drafts that barely pay on paper.
        best = Plan(0, "none", alone.tokens_per_s * MIN_GAIN)
        # Until the drafter has been timed, it is priced optimistically, so that it is tried once.
        step_s = self.draft.estimate(1) if self.draft.known else PRIOR_DRAFT_SHARE * self.check.estimate(1)
        p_model = self.model.p
        for k in range(1, room + 1):
            rate = self._rate(k, p_model, step_s)
            if rate > best.tokens_per_s:
                best = Plan(k, "model", rate)
        p_lookup = self.lookup.p
        for k in range(1, min(room, lookup_available) + 1):
            rate = self._rate(k, p_lookup, 0.0)
            if rate > best.tokens_per_s:
                best = Plan(k, "lookup", rate)
        if best.source != "model" and self._probe_due():
            # Nothing is learnt about a drafter that never drafts: a short probe, now and then.
            return Plan(min(room, PROBE_LENGTH), "model", math.nan)
        return best if best.length else alone

    def _rate(self, k: int, p: float, step_s: float) -> float:
        cost = k * step_s + self.check.estimate(k + 1)
        return expected_tokens(p, k) / cost if cost > 0 else math.nan

    def record_round(self, source: str, drafted: int, kept: int) -> None:
        """What the check kept of a round's draft (source "none": no draft was made)."""
        memory = self.memory
        for kind, counts in (("model", memory.model), ("lookup", memory.lookup)):
            if source == kind and drafted > 0:
                counts.record(drafted, kept)
            else:
                counts.idle()
        if source != "model" or drafted == 0:
            memory.rounds_without_model += 1
            return
        if memory.rounds_without_model >= memory.probe_gap:  # this round was a probe
            pays = self.adaptive and self.check.known and self._drafting_pays()
            memory.probe_gap = PROBE_GAP if pays else min(2 * memory.probe_gap, MAX_PROBE_GAP)
        else:  # a draft the plan chose: drafting pays again
            memory.probe_gap = PROBE_GAP
        memory.rounds_without_model = 0

    def observe_top(self, entropy: float) -> None:
        """The top tier made a token of its own, sampled from a distribution of this entropy."""
        if math.isfinite(entropy):
            self.memory.top_entropies.append(entropy)

    def _probe_due(self) -> bool:
        # A probe costs the drafter's catch-up and a check; it is made where the top tier has
        # lately been sure, since there the small tier most often agrees (where it is unsure,
        # as in prose, a probe mostly measures what is already known).
        memory = self.memory
        recent = memory.top_entropies
        sure = len(recent) == recent.maxlen and sum(recent) / len(recent) <= PROBE_MAX_ENTROPY
        return memory.rounds_without_model >= memory.probe_gap and sure

    def _drafting_pays(self) -> bool:
        step_s = self.draft.estimate(1) if self.draft.known else self.check.estimate(1)
        alone = self._rate(0, 0.0, 0.0) * MIN_GAIN
        return any(self._rate(k, self.model.p, step_s) > alone for k in range(1, self.max_draft + 1))


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


class LookupIndex:
    """lookup_draft for a sequence that only grows, without rescanning it: each n-gram's latest
    start is indexed once, so a round costs the new ids, not the whole prompt and answer."""

    def __init__(self, ngram: int = 3, min_ngram: int = 2):
        self.ngram, self.min_ngram = ngram, min_ngram
        self._latest: dict[tuple[int, ...], int] = {}
        self._next = dict.fromkeys(range(min_ngram, ngram + 1), 0)  # per n: the next start to index

    def draft(self, ids: list[int], max_tokens: int) -> list[int]:
        """What lookup_draft(ids, 0, max_tokens) returns; `ids` must extend the last call's."""
        if max_tokens < 1:
            return []
        end = len(ids)
        # Index every n-gram that ends before the last id (the tail is what is looked up), in
        # order of its start, so each keeps its latest earlier occurrence.
        for n, first in self._next.items():
            for at in range(first, end - n):
                self._latest[tuple(ids[at : at + n])] = at
            self._next[n] = max(first, end - n)
        for n in range(self.ngram, self.min_ngram - 1, -1):
            if end - n <= 0:
                continue
            found = self._latest.get(tuple(ids[end - n :]))
            if found is not None and found <= end - n - 1:
                follow = ids[found + n : min(found + n + max_tokens, end)]
                if follow:
                    return list(follow)
        return []
