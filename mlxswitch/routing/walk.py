"""The policy walk over positions (pure Python): the one place start → review → commit is written.

Per position, `step` has the rung the policy asked for compute it; while the policy may review
that rung, the signal measured there is reviewed and a higher rung may recompute the same
position; the token is taken from the last rung tried and its signal committed, which decides
the rung of the next position. The token loop walks a position that computes lazily on the
tiers (`walking`: its signals yield the passes they need); the bench replays `step` on
teacher-forced arrays (`ColumnPosition`) and the telemetry check on recorded tries
(`RecordedPosition`): one walk, so the three cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .policies import Policy, make_policy
from .router import Decision, RouterConfig

Ask = tuple[str, int, int]  # what the walk needs of a position: ("measure" | "take", rung, attempt)
# A position's measure or take as a generator: (rung, attempt) -> yields what computing it needs,
# returns the signal.
Signal = Callable[[int, int], Generator[Any, Any, float | None]]


class Position(Protocol):
    """One position as the walk sees it: the signal each rung measures there."""

    def measure(self, rung: int, attempt: int) -> float | None:
        """The signal `rung` measures here, the `attempt`-th rung tried (0: the first), for review."""

    def take(self, rung: int, attempt: int) -> float | None:
        """The token is taken from `rung` (the `attempt`-th tried): its signal, for commit."""


@dataclass(frozen=True)
class Settled:
    """One position walked: the rungs that computed it and the policy's decision after it."""

    rungs: tuple[int, ...]  # in order; the last made the token
    measured: tuple[float | None, ...]  # the signal each reviewed rung measured
    taken: float | None  # the signal committed (the last rung's)
    decision: Decision  # the rung of the next position, and why


class Walk:
    """A policy walked over one answer's positions: `start`, then `step` per position."""

    def __init__(self, policy: Policy):
        self.policy = policy

    def start(self, initial: float | None) -> Decision:
        """Seed the policy with the bottom tier's signal at the end of the prompt."""
        return self.policy.start(initial)

    def step(self, rung: int, position: Position) -> Settled:
        """Walk one position from `rung`: review up while the policy may, then commit the token."""
        walking = self.walking(rung, _at_once(position.measure), _at_once(position.take))
        try:
            next(walking)
        except StopIteration as done:
            return done.value
        raise AssertionError("a position computed at once yielded")

    def walking(self, rung: int, measure: Signal, take: Signal) -> Generator[Any, Any, Settled]:
        """`step` on a position whose signals are generators that may yield to compute (the token
        loop's, whose passes are run by its driver): what they yield is passed on, and what is
        sent back goes to them."""
        asking = self.stepping(rung)
        ask = next(asking)
        while True:
            kind, at, attempt = ask
            value = yield from (measure if kind == "measure" else take)(at, attempt)
            try:
                ask = asking.send(value)
            except StopIteration as done:
                return done.value

    def stepping(self, rung: int) -> Generator[Ask, float | None, Settled]:
        """The walk of one position as the policy asks it: yields what it needs of the position,
        ("measure" or "take", rung, attempt), is sent that signal back, and returns the Settled
        position."""
        rungs, measured = [rung], []
        while self.policy.may_review(rungs[-1]):
            value = yield ("measure", rungs[-1], len(rungs) - 1)
            measured.append(value)
            higher = self.policy.review(rungs[-1], value)
            if higher is None:
                break
            rungs.append(higher)
        taken = yield ("take", rungs[-1], len(rungs) - 1)
        return Settled(tuple(rungs), tuple(measured), taken, self.policy.commit(rungs[-1], taken))

    def resume(self, rung: int) -> Decision:
        """A cloud span ended: local decoding goes on at `rung`."""
        return self.policy.resume(rung)


@dataclass(frozen=True)
class ColumnPosition:
    """A position where every rung's signal is known (teacher forcing): value[rung]."""

    values: Sequence[float]

    def measure(self, rung: int, attempt: int) -> float:
        """The signal of `rung` here."""
        return float(self.values[rung])

    def take(self, rung: int, attempt: int) -> float:
        """The signal of `rung` here."""
        return float(self.values[rung])


@dataclass(frozen=True)
class RecordedPosition:
    """A recorded position: the signals measured, in the order the rungs ran (a `tried` record)."""

    values: Sequence[float | None]

    def measure(self, rung: int, attempt: int) -> float | None:
        """The `attempt`-th recorded signal; None past the record (which ends the review)."""
        return self.values[attempt] if attempt < len(self.values) else None

    def take(self, rung: int, attempt: int) -> float | None:
        """The taken rung's signal, or the record's last when it lists fewer tries."""
        return self.values[min(attempt, len(self.values) - 1)]


def _at_once(signal: Callable[[int, int], float | None]) -> Signal:
    """A signal computed at once, as a generator that yields nothing."""

    def computed(rung: int, attempt: int) -> Generator[Any, Any, float | None]:
        yield from ()
        return signal(rung, attempt)

    return computed


def replay(policy: Policy, initial: float | None, positions: Iterable[Position]) -> list[Settled]:
    """Walk every position of a run from its start (the bench's replay, the telemetry check)."""
    walk = Walk(policy)
    rung, out = walk.start(initial).rung, []
    for position in positions:
        out.append(walk.step(rung, position))
        rung = out[-1].decision.rung
    return out


def derive_tried(
    config: RouterConfig,
    num_tiers: int,
    initial_entropy: float | None,
    tried_entropies: Iterable[Sequence[float | None]],
) -> list[list[int]]:
    """Re-derive, for every token, the rungs that computed its position (the last made it).

    `tried_entropies[k]` lists the signals measured at position k, in the order the rungs ran
    (one entry unless the policy escalated there): a telemetry record holds exactly that. A
    record the rule disagrees with shows up as a list of another length.
    """
    settled = replay(
        make_policy(config, num_tiers),
        initial_entropy,
        (RecordedPosition(values) for values in tried_entropies),
    )
    return [list(s.rungs) for s in settled]


def derive_rungs(
    config: RouterConfig,
    num_tiers: int,
    initial_entropy: float | None,
    tried_entropies: Iterable[Sequence[float | None]],
) -> list[int]:
    """The rung that made each token, for any policy (the telemetry check)."""
    return [rungs[-1] for rungs in derive_tried(config, num_tiers, initial_entropy, tried_entropies)]
