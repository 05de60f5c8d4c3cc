"""The passes a decoding loop asks for, and the driver that runs them as they come.

The loops (loop.py, verify.py) do not call the model: they yield a `Score` for each pass they
need and are sent its logits back. The engine (engine.py) runs them for every answer: a step runs
each answer's pending pass, those of answers that share passes on one model packed into one call
(CacheGroup.score_together, tiers.py). `run_alone` runs a loop's passes at once, for a loop
driven by itself (its `steps`), as the tests drive one.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import mlx.core as mx

if TYPE_CHECKING:
    from .tiers import CacheGroup

T = TypeVar("T")


@dataclass(frozen=True)
class Score:
    """A pass a loop needs: `group` over `inputs` (ids after those it holds), the lazy logits of
    the last `rows` positions, (rows, V), sent back. `draft`: a drafter's pass, whose logits may
    cover only the ids a draft proposes (SplitModel.draft_head: (rows, ≤ V))."""

    group: CacheGroup
    inputs: mx.array
    rows: int
    gear: int | None
    draft: bool = False


def score(
    group: CacheGroup, inputs: mx.array, rows: int, gear: int | None, draft: bool = False
) -> Generator[Score, mx.array, mx.array]:
    """One pass, run by the loop's driver: its lazy logits, (rows, V) (`yield from` it)."""
    return (yield Score(group, inputs, rows, gear, draft))


def run_alone(rounds: Generator[T | Score, mx.array, None], chunk: int) -> Iterator[T]:
    """Drive a loop alone: each pass it asks for runs at once (prefilled in `chunk`-id pieces);
    everything else it yields (its Steps) is passed on. Closing this closes the loop."""
    try:
        item = next(rounds)
        while True:
            if isinstance(item, Score):
                item = rounds.send(item.group.score(item.inputs, item.rows, item.gear, chunk, item.draft))
            else:
                yield item
                item = next(rounds)
    except StopIteration:
        return
    finally:
        rounds.close()
