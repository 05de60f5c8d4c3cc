"""The passes the token loop (loop.py) runs on its rungs, each built lazily and yielded as a
`Score`: a position's row (fed the ids its rung's cache has not seen, or the token just made; or
a row computed ahead and parked, taken instead), a review's row with a guessed next row beside
it, and a lookup round's rows. The loop decides which rung computes what and when; this keeps
each rung's cache in step with the sequence and counts what it is fed to catch up.
"""

from __future__ import annotations

import math
import time
from collections.abc import Generator

import mlx.core as mx

from .drafting import DraftPlanner
from .lookup_rounds import LookupRows, RungLookup
from .loop_state import AnswerSequence, PassMode
from .passes import Score, score
from .positions import Pending, RowsAhead, Sampling
from .tiers import CacheGroup, Ladder

# How often a review's guessed row is used (the guess was the token taken, and the same rung
# computes the next position): 0.81 of reviews were followed by that rung in `peek` on the
# pair's HumanEval answers, each kept only if the guess is right; a guess is made where its
# extra row costs less.
GUESS_USED = 0.5


class RungPasses:
    """One answer's passes on the ladder's rungs, over `sequence`; `lookup`: whether rungs check
    prompt-lookup drafts with their next position (the loop's docstring says where)."""

    def __init__(
        self,
        ladder: Ladder,
        sequence: AnswerSequence,
        sampling: Sampling,
        pass_mode: PassMode,
        bottom_first: bool,
        lookup: bool,
    ):
        self.ladder, self.sequence, self.sampling, self.pass_mode = ladder, sequence, sampling, pass_mode
        self.bottom_first = bottom_first  # every position starts on rung 0 (a bottom-only signal)
        # Rungs whose cache group another rung shares (gears): no step is queued there on a guess.
        tiers = ladder.tiers
        self.shared = {r for r, tier in enumerate(tiers) if sum(t.group is tier.group for t in tiers) > 1}
        # The queued step of the latest move (if its rung computes that position after all, peek's
        # review, it is taken instead of feeding the id again) and a review's guessed rows.
        self.ahead = RowsAhead()
        # Prompt lookup checked by the rung that makes the token (loop.py's docstring).
        self.lookup = RungLookup(ladder, self.shared) if lookup else None

    def queue(self, made: Pending, certain: int | None) -> Generator[Score, mx.array, Pending | None]:
        """The next position, queued before the policy decides, after the token `made` made: on
        the rung that made it (or the bottom rung for a bottom-only signal, where every position
        starts), or where the policy's next rung is `certain` (and its cache holds every id
        before this token). Nothing where gears share that cache and the next gear is uncertain."""
        if certain is not None and self.group(certain).seen == len(self.sequence.ids):
            return (yield from self.produce(certain, made.token))
        rung = 0 if self.bottom_first else made.rung
        return None if rung in self.shared else (yield from self.produce(rung, made.token))

    def produce(
        self, rung: int, token: mx.array | None = None, guess: int | None = None
    ) -> Generator[Score, mx.array, Pending]:
        """Lazily run rung's tier on the ids its group has not seen (or on `token`); with `guess`
        (the token a lower rung sampled at this position, which this rung reviews), the same pass
        may also compute the next position as if the guess were taken (`_guess_pays`)."""
        tier = self.ladder.tiers[rung]
        group = tier.group
        ids = self.sequence.ids
        catch_up = {}
        if token is None:
            parked = self.ahead.take(rung, group, len(ids))
            if parked is not None:
                return parked
            if group.seen >= len(ids):
                # It holds every id already (a step queued at another gear of this cache) but this
                # position must be computed here: drop the newest id (trimmed, or started over).
                group.rewind(group.seen - 1)
            # Generated ids this group did not compute itself: the price of switching.
            fed = len(ids) - max(group.seen, self.sequence.prompt_tokens)
            if fed > 0:
                catch_up[group.name] = fed
            token = mx.array(ids[group.seen :])
        # The probe reads the bottom rung's hidden state: only there is the model run in halves,
        # by the loop itself (a batch does not take a probe-routed ladder: engine.shares_passes).
        probe = self.ladder.probe if rung == 0 and self.bottom_first else None
        if probe is not None:
            split = self.ladder.bottom_split()
            logits, hidden = group.feed(token, tier.gear, self.sequence.prefill_step, split)
        elif guess is not None:
            # A review, where passes compute as they are built: timed (its rung's planner prices
            # the guessed row from it), and with the guess where that pays.
            rows = int(token.size)
            guessing = self._guess_pays(rung, rows)
            inputs = mx.concatenate([token, mx.array([guess])]) if guessing else token
            logits, seconds = yield from self._timed_score(group, inputs, 1 + guessing, tier.gear)
            planner = self.planner(rung)
            if planner is not None:
                planner.check.record(rows + guessing, seconds)  # (nan: not learned)
            if not guessing:
                return self.sampling.pending(rung, logits, catch_up)
            ahead = self.sampling.pending(rung, logits[1:2], {})
            ahead.ahead = True
            self.ahead.guessed.append((rung, guess, ahead))
            return self.sampling.pending(rung, logits[0:1], catch_up)
        else:
            logits, hidden = (yield from score(group, token, 1, tier.gear)), None
        return self.sampling.pending(rung, logits, catch_up, hidden, probe)

    def produce_rows(self, rung: int, draft: list[int]) -> Generator[Score, mx.array, LookupRows[Pending]]:
        """Lazily run rung's tier on the ids its group has not seen and `draft` after them: the
        next position's row, and one after each drafted id."""
        tier = self.ladder.tiers[rung]
        group = tier.group
        ids = self.sequence.ids
        parked = self.ahead.take(rung, group, len(ids))
        if parked is not None:  # its row is the round's first
            return (yield from self.rows_after(parked, draft))
        if group.seen >= len(ids):
            group.rewind(len(ids) - 1)
        catch_up = {}
        # Generated ids this group did not compute itself; the token just made is its next input.
        fed = len(ids) - max(group.seen, self.sequence.prompt_tokens)
        if fed > 1:
            catch_up[group.name] = fed
        inputs = ids[group.seen :] + draft
        logits, seconds = yield from self._timed_score(group, mx.array(inputs), len(draft) + 1, tier.gear)
        rows = [
            self.sampling.pending(rung, logits[j : j + 1], catch_up if j == 0 else {})
            for j in range(len(draft) + 1)
        ]
        return LookupRows(rung, draft, rows, len(inputs), seconds=seconds)

    def rows_after(self, first: Pending, draft: list[int]) -> Generator[Score, mx.array, LookupRows[Pending]]:
        """A lookup round whose first row was computed ahead (a step queued on lazy passes, or a
        review's guessed row): its rung's group holds every id, so only the draft is fed, in one
        pass, for the rows after it."""
        tier = self.ladder.tiers[first.rung]
        assert tier.group.seen == len(self.sequence.ids)  # the queued step fed the token just taken
        # Timed, where it is, as the draft's pass alone: a guessed first row was paid in its review.
        logits, seconds = yield from self._timed_score(tier.group, mx.array(draft), len(draft), tier.gear)
        rows = [first] + [self.sampling.pending(first.rung, logits[j : j + 1], {}) for j in range(len(draft))]
        return LookupRows(first.rung, draft, rows, len(draft) + 1, seconds=seconds)

    def settle_guesses(self) -> None:
        """After a position's token is taken: each guessed row parked or trimmed (RowsAhead.settle)."""
        ids = self.sequence.ids
        self.ahead.settle(ids[-1], len(ids), self.group)

    def planner(self, rung: int) -> DraftPlanner | None:
        """The planner of lookup drafts `rung` checks itself; None where lookup is off there."""
        return None if self.lookup is None else self.lookup.planner(rung)

    def lookup_draft(self, rung: int, room: int) -> list[int]:
        """The lookup draft `rung` checks with the next position ([]: none)."""
        if self.lookup is None:
            return []
        return self.lookup.draft(self.sequence.ids, self.sequence.prompt_tokens, rung, room)

    def row_walked(
        self, rows: LookupRows[Pending], token: int, next_rung: int, more: bool
    ) -> tuple[str | None, bool]:
        """A row of a lookup pass walked (RungLookup.walked): the token's source and whether the
        next row stands; where it does not, the rung's cache keeps only ids taken."""
        assert self.lookup is not None
        walked = self.lookup.walked(rows, token, next_rung, more, len(self.sequence.ids))
        if walked.keep is not None:
            group = self.group(rows.rung)
            group.rewind(min(group.seen, walked.keep))
        return walked.source, walked.stands

    def group(self, rung: int) -> CacheGroup:
        return self.ladder.tiers[rung].group

    def _timed_score(
        self, group: CacheGroup, inputs: mx.array, rows: int, gear: int | None
    ) -> Generator[Score, mx.array, tuple[mx.array, float]]:
        """One pass (passes.score), and its seconds where passes compute as they are built and it
        ran alone (nan elsewhere: a queued or packed pass's time is not its own)."""
        started = time.perf_counter()
        logits = yield from score(group, inputs, rows, gear)
        if self.pass_mode.pipelined or self.pass_mode.shared_pass:
            return logits, math.nan
        mx.eval(logits)
        return logits, time.perf_counter() - started

    def _guess_pays(self, rung: int, rows: int) -> bool:
        """Whether a review's pass of `rows` rows should take one more, the next position given
        the lower rung's token: used where the reviewing rung takes the same token and computes
        the next position too (after 247 of 304 reviews in `peek` on the pair's HumanEval answers),
        it saves that position's pass. It pays where the extra row costs less than GUESS_USED of a
        one-row pass, by this rung's measured pass costs (on a CPU, from 4 rows up; on a Mac, about
        always)."""
        planner = self.planner(rung)
        if planner is None or not self.group(rung).trimmable or not planner.check.known:
            return False
        costs = planner.check
        return costs.estimate(rows + 1) - costs.estimate(rows) < GUESS_USED * costs.estimate(1)
