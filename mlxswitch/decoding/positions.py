"""A position the token loop computes lazily on one rung, how its logits become one, and the rows
computed before their position is due (loop.py's module docstring says when each is made).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ..routing.probe import Probe
from ..routing.registry import SIGNAL_BY_NAME, uncertainty
from ..routing.signals import LazySignals, read_time_signals
from .steps import Sampler, token_and_top
from .tiers import CacheGroup


@dataclass
class Pending:
    """A position computed lazily on one rung: the sampled id and its signals, not yet read."""

    rung: int
    token: mx.array
    signals: LazySignals | None  # the logits reduction's outputs (registry.MEASURED), if measured
    catch_up: dict[str, int]
    hidden: mx.array | None = None  # the last hidden state, when the probe reads this rung
    probe: Probe | None = None
    _probe_score: float | None = None
    logprobs: mx.array | None = None  # log-softmax of the logits, when log-probabilities are asked for
    ahead: bool = False  # computed in an earlier position's pass (a guessed row): no pass of its own

    @property
    def arrays(self) -> list[mx.array]:
        """What must be computed before this position can be read (for async_eval)."""
        return (
            [self.token]
            + ([self.signals.array] if self.signals is not None else [])
            + ([self.hidden] if self.hidden is not None else [])
            + ([self.logprobs] if self.logprobs is not None else [])
        )

    def entropy(self) -> float | None:
        """Entropy in bits (reads the lazy signals: a sync point); None where none were measured."""
        return self._read()[0] if self.signals is not None else None

    def signal(self, name: str) -> float | None:
        """The routed signal as an uncertainty (registry.py), or the probe's score (None on a rung
        the probe does not read)."""
        if not SIGNAL_BY_NAME[name].bottom_only:
            return uncertainty(name, self._read()) if self.signals is not None else None
        if self.hidden is None or self.probe is None:
            return None
        if self._probe_score is None:
            hidden = np.asarray(self.hidden.astype(mx.float32))
            self._probe_score = self.probe.score_position(hidden, self._read())
        return self._probe_score

    def _read(self) -> list[float]:
        assert self.signals is not None  # only a routed loop reads them, and it measures them
        return self.signals.values()

    def token_logprobs(self, token: int, top: int) -> tuple[float | None, tuple[tuple[int, float], ...]]:
        """The token's log-probability and the `top` likeliest ids with theirs (a sync point)."""
        if self.logprobs is None:
            return None, ()
        return token_and_top(np.asarray(self.logprobs.astype(mx.float32)).reshape(-1), token, top)


@dataclass(frozen=True)
class Sampling:
    """How a position's logits become its token, and what is read of them."""

    sampler: Sampler
    # mlx-lm's greedy, temperature, min-p and top-k samplers are all unchanged by a shift of
    # every logit; only top-p reads probabilities. Otherwise the log-sum-exp pass is skipped.
    normalize: bool
    top_logprobs: int | None  # None: no log-probabilities; k: the token's and the top k
    measures: bool  # compute the signals (a router reads them, or a caller asked)

    @property
    def normalizes(self) -> bool:
        """Whether logits become log-probabilities before sampling (top-p reads probabilities; a
        token's log-probability is read from them)."""
        return self.normalize or self.top_logprobs is not None

    def pending(
        self,
        rung: int,
        logits: mx.array,
        catch_up: dict[str, int],
        hidden: mx.array | None = None,
        probe: Probe | None = None,
    ) -> Pending:
        """A position's token sampled from rung's logits (1, V), lazily, with what is measured of it."""
        signals = read_time_signals(logits) if self.measures else None
        if self.normalizes:
            logits = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        logprobs = logits if self.top_logprobs is not None else None
        return Pending(rung, self.sampler(logits), signals, catch_up, hidden, probe, logprobs=logprobs)


class RowsAhead:
    """Rows computed before their position is due: the step queued on one rung before a move
    (parked, with its group's `seen` then), and a review's guessed rows (rung, guess, row)."""

    def __init__(self) -> None:
        self._parked: tuple[Pending, int] | None = None
        self.guessed: list[tuple[int, int, Pending]] = []

    def park(self, row: Pending, seen: int) -> None:
        self._parked = (row, seen)

    def take(self, rung: int, group: CacheGroup, length: int) -> Pending | None:
        """The parked row of `rung`, taken if it computed the position now due: its group holds
        every one of the sequence's `length` ids and nothing more."""
        if self._parked is None:
            return None
        parked, seen = self._parked
        if parked.rung != rung or not seen == group.seen == length:
            return None
        self._parked = None
        return parked

    def settle(self, token: int, length: int, group_of: Callable[[int], CacheGroup]) -> None:
        """After a position's `token` is taken (the sequence now `length` ids): a guessed row stands
        where the guess was that token (parked for its rung's next position); elsewhere the guess
        is trimmed off its cache."""
        for rung, guess, row in self.guessed:
            group = group_of(rung)
            if token == guess and group.seen == length:
                self.park(row, group.seen)
            else:
                group.rewind(min(group.seen, length - 1))
        self.guessed = []
