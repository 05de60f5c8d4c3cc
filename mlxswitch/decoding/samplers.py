"""A seeded request's sampler among others: its draws follow from its seed alone."""

from __future__ import annotations

import os

import mlx.core as mx

from .steps import Sampler


class SeededSampler:
    """A seeded request's sampler inside a batch. mlx-lm calls each row's own sampler in turn;
    this one seeds the generator from (seed, step) before its row samples, then reseeds it from
    fresh entropy for the rows after it. So a seeded answer is the same whoever shares the batch,
    and no other row's draws follow from its seed."""

    def __init__(self, sampler: Sampler, seed: int):
        self.sampler, self.seed, self.step = sampler, seed, 0

    def __call__(self, logprobs: mx.array) -> mx.array:
        """Sample this row's token from its own stream."""
        mx.random.seed((self.seed * 0x9E3779B97F4A7C15 + self.step) % (1 << 64))
        self.step += 1
        try:
            return self.sampler(logprobs)
        finally:
            mx.random.seed(int.from_bytes(os.urandom(8), "little"))


def seeded(sampler: Sampler, seed: int | None) -> Sampler:
    """A request's sampler in a batch: `sampler` itself, or on a stream of its own where the
    request is seeded (SeededSampler)."""
    return sampler if seed is None else SeededSampler(sampler, seed)
