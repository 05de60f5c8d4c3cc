"""What the decoding loops hand out: a `Step` per token, and the shapes of their generators.

Shared by the token loop (loop.py), verified drafting (verify.py), the batches and the answer
builder, so none of them imports another loop for its vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from .passes import Score

Sampler = Callable[[mx.array], mx.array]


@dataclass(frozen=True, kw_only=True)
class Step:
    """One generated token and how it was made (built by keyword: eleven fields)."""

    token: int
    rung: int  # the tier whose token was taken
    entropy: float | None  # bits, of the distribution it was sampled from (None: cloud, or not measured)
    mean: float | None  # the policy's rolling mean after this token (None: cloud)
    guard: bool  # this token's tier was chosen by the catastrophic guard
    tried: tuple[int, ...]  # rungs that computed this position, in order; the last made the token
    tried_signals: tuple[float | None, ...]  # the routed signal each of them measured
    catch_up: dict[str, int] = field(default_factory=dict)  # ids fed per cache group to catch up
    logprob: float | None = None  # the token's log-probability (natural log), when asked for
    top_logprobs: tuple[tuple[int, float], ...] = ()  # the likeliest ids and theirs, when asked for
    source: str | None = None  # what proposed a checked token other than a tier ("lookup"), if any

    @property
    def signal(self) -> float | None:
        """The routed signal of the token taken (its entropy, unless routing reads another)."""
        return self.tried_signals[-1]


Rounds = Generator[Step | Score, mx.array, None]  # a loop's steps and the passes it asks for


def token_and_top(logprobs: np.ndarray, token: int, top: int) -> tuple[float, tuple[tuple[int, float], ...]]:
    """From one distribution's log-probabilities: the token's, and the `top` likeliest ids with theirs."""
    best = np.argpartition(-logprobs, top - 1)[:top] if top else np.array([], dtype=np.int64)
    best = best[np.argsort(-logprobs[best])]
    return float(logprobs[token]), tuple((int(i), float(logprobs[i])) for i in best)
