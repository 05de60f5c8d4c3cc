"""The ladder's two tiers as verified drafting's round uses them live (verified_round.RoundModels):
the bottom tier's draft and the top tier's check, each a pass yielded to the driver, booked to the
round's clock at the sync that reads it, and the caches trimmed to what the check kept.

The round's own record of its check (its rows, samples, first row's signals) and the ids fed to
catch tiers up stay here until the loop (verify.py) has made the round's steps from them.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

import mlx.core as mx

from ..routing.registry import uncertainty
from ..routing.signals import LazySignals, read_time_signals
from .drafting import DraftPlanner, ModelDraft
from .lookup import LookupIndex
from .loop_state import AnswerSequence
from .passes import Score, score
from .positions import Sampling
from .round_clock import RoundClock
from .tiers import Ladder


@dataclass
class Queued:
    """A check queued before it is read: its rows (log-probabilities where asked), the samples
    drawn from them, and its first row's signals (where it checks no draft: that row is the
    token's)."""

    rows: mx.array
    samples: mx.array
    top_signals: LazySignals | None


@dataclass
class Settled:
    """A round's check, and the ids it fed each tier that had not computed them."""

    check: Queued
    catch_up: dict[str, int]


class LadderModels:
    """The bottom and top tiers of `ladder` drafting and checking onto `sequence`."""

    def __init__(
        self,
        ladder: Ladder,
        sequence: AnswerSequence,
        sampling: Sampling,
        clock: RoundClock,
        threshold: float,
        signal: str,
        lookup: bool,
    ):
        self.ladder, self.sequence, self.sampling, self.clock = ladder, sequence, sampling, clock
        self.threshold, self.signal = threshold, signal
        self.eos = ladder.tokenizer.eos_token_ids
        self.lookup_index = LookupIndex() if lookup else None  # the sequence's n-grams, indexed as it grows
        self.catch_up: dict[str, int] = {}  # this round's ids fed to tiers that had not computed them
        self.checked: Queued | None = None  # this round's check, once run
        self.settled: Settled | None = None  # the last round's check and catch-up, for its steps
        # The top tier's one-row pass over the token a round with no draft takes, queued before
        # that token is read (as mlx-lm pipelines its steps): the first row of the next check,
        # whatever that round drafts, so it is never thrown away.
        self.ahead: Queued | None = None

    @property
    def ids(self) -> list[int]:
        return self.sequence.ids

    @property
    def prompt_tokens(self) -> int:
        return self.sequence.prompt_tokens

    @property
    def drafter_seen(self) -> int:
        return self.ladder.tiers[0].group.seen

    def draft(self, made: ModelDraft, planner: DraftPlanner) -> Generator[Score, mx.array, None]:
        """The bottom tier's draft from the end of `ids`, into `made`. No room: no draft, and the
        bottom tier reads nothing. Generated ids it is fed that it did not compute (the top tier's
        tokens, kept lookup drafts) are counted into `catch_up`."""
        room = made.room
        if room == 0:
            return
        bottom = self.ladder.tiers[0]
        group = bottom.group
        ids, prompt_tokens = self.sequence.ids, self.sequence.prompt_tokens
        length = len(ids)
        behind = length - max(group.seen, prompt_tokens)
        if behind > 0:
            self.catch_up[group.name] = behind
        if group.seen >= length:  # it holds every id: the last one is fed again to predict the next
            group.rewind(length - 1)
        fed, prefill = length - group.seen, group.seen < prompt_tokens
        logits = yield from score(group, mx.array(ids[group.seen :]), 1, bottom.gear, draft=True)
        current = self._lazy(logits)
        rows = fed
        # The fixed rule drafts to `room`: the next position is queued before this one is read
        # (mlx-lm's pipelining). The planner's drafts stop on the drafter's doubt, which is read
        # first: a queued step would be thrown away at the end of every draft.
        queue_ahead = not planner.adaptive
        while True:
            token, lazy = current
            if queue_ahead and len(made.tokens) + 1 < room:
                current = self._lazy((yield from score(group, token, 1, bottom.gear, draft=True)))
                mx.async_eval(current[0], current[1].array)
            values = lazy.values()
            self.clock.book(group.name, rows, prefill)
            rows, prefill = 1, False
            if not made.take(int(token.item()), values[0], uncertainty(self.signal, values), planner):
                return
            if not queue_ahead:
                current = self._lazy((yield from score(group, token, 1, bottom.gear, draft=True)))

    def check(self, draft: list[int], room: int) -> Generator[Score, mx.array, list[int]]:
        """The top tier's samples at each drafted position and the one after: one pass, or the row
        queued ahead where there is no draft. Where passes stay lazy and the round drafted nothing,
        the next round's first row is queued before these samples are read."""
        ahead, self.ahead = self.ahead, None
        top = self.ladder.tiers[-1]
        # A check whose first row was queued ahead ran partly while the last token was read: its
        # seconds are not one pass's, so the planner does not learn from them.
        teach = ahead is None
        if ahead is not None and not draft:  # the row queued ahead is the whole check
            check, rows, prefill = ahead, 1, False
        else:  # a row at every drafted position and the one after
            inputs, wanted, prefill = self._check_inputs(draft, after_ahead=ahead is not None)
            logits = yield from score(top.group, mx.array(inputs), wanted, top.gear)
            check = self._checked(logits, draft, ahead)
            rows = len(inputs) + (1 if ahead is not None else 0)
        if not draft and room > 1 and self.clock.pass_mode.pipelined:
            self.ahead = yield from self._queue_one(check.samples)  # this round's token is its first sample
        samples: list[int] = check.samples.tolist()  # type: ignore[assignment]  # mlx: any nesting
        self.clock.book(top.group.name, rows, prefill, check=True, teach=teach)
        self.checked = check
        return samples

    def keep(self, kept: int) -> None:
        """Trim every cache to `ids` and the kept draft (the top tier's to one id more where a pass
        was queued ahead: it holds this round's token); the round's check and catch-up settled."""
        assert self.checked is not None, "a round checks before it keeps"
        self.settled, self.checked, self.catch_up = Settled(self.checked, self.catch_up), None, {}
        held = len(self.sequence.ids) + kept
        top_group = self.ladder.tiers[-1].group
        for group in self.ladder.groups:
            queued = 1 if self.ahead is not None and group is top_group else 0
            group.rewind(min(group.seen, held + queued))

    def _checked(self, logits: mx.array, draft: list[int], ahead: Queued | None) -> Queued:
        """The top tier's check of `draft` from its logits: its rows at every drafted position and
        the one after, their samples and the first row's signals, queued. After a one-row pass
        queued `ahead`, that pass is the check's first row (these logits the draft's)."""
        rows = self._normalized(logits.astype(mx.float32))
        samples = self.sampling.sampler(rows)
        if ahead is None:
            first = None if draft or not self.sampling.measures else read_time_signals(rows[0])
            queued = Queued(rows, samples, first)
        else:  # the row queued ahead, read at the same sync, then the draft's
            rows, samples = mx.concatenate([ahead.rows, rows]), mx.concatenate([ahead.samples, samples])
            queued = Queued(rows, samples, ahead.top_signals)
        first_row = queued.top_signals
        mx.async_eval(queued.samples, *([first_row.array] if first_row is not None else []))
        return queued

    def _queue_one(self, token: mx.array) -> Generator[Score, mx.array, Queued]:
        """The top tier's one-row pass over `token` (lazy: the sample a round with no draft takes)."""
        top = self.ladder.tiers[-1]
        rows = (yield from score(top.group, token, 1, top.gear)).astype(mx.float32)
        rows = self._normalized(rows)
        first = read_time_signals(rows[0]) if self.sampling.measures else None
        queued = Queued(rows, self.sampling.sampler(rows), first)  # fed its own token: no catch-up
        mx.async_eval(queued.samples, *([first.array] if first is not None else []))
        return queued

    def _check_inputs(self, draft: list[int], after_ahead: bool) -> tuple[list[int], int, bool]:
        """The ids the top tier's check is fed, the rows it reads and whether it reads the prompt:
        the generated ids it has not computed (its catch-up, counted into `catch_up`), then the
        draft; a row at every drafted position and the one after. `after_ahead`: the top tier
        holds every id (a one-row pass was queued ahead, giving the first row): only the draft is
        fed, and its rows read."""
        group = self.ladder.tiers[-1].group
        ids, prompt_tokens = self.sequence.ids, self.sequence.prompt_tokens
        length = len(ids)
        if not after_ahead and group.seen > length - 1:  # a shared gear cache holds the draft
            group.rewind(length - 1)  # at the bottom gear
        start = group.seen
        fed = length + len(draft) - max(start, prompt_tokens)
        if length - 1 >= max(start, prompt_tokens):
            fed -= 1  # the last id is its own token (every round ends with one): its next input
        if fed > 0:
            self.catch_up[group.name] = self.catch_up.get(group.name, 0) + fed
        return ids[start:] + draft, len(draft) + (0 if after_ahead else 1), start < prompt_tokens

    def _lazy(self, logits: mx.array):
        return self.sampling.sampler(self._normalized(logits)), read_time_signals(logits)

    def _normalized(self, logits: mx.array) -> mx.array:
        """Log-probabilities where the sampler or the log-probabilities need them (else the logits:
        mlx-lm's samplers other than top-p do not mind a shift)."""
        return logits - mx.logsumexp(logits, axis=-1, keepdims=True) if self.sampling.normalizes else logits
