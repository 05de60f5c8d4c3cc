"""How a request's settings become its sampler (mlx-lm's), and a seeded request's sampler among
others: its draws follow from its seed alone."""

from __future__ import annotations

import os

import mlx.core as mx
import numpy as np
from mlx_lm.sample_utils import make_sampler

from ..kernels.route import current_route
from .requests import GenerationSettings
from .steps import Sampler


def sampler_for(settings: GenerationSettings) -> Sampler:
    """mlx-lm's sampler for these settings; greedy decoding where passes compute in NumPy (a CPU's
    route) takes NumPy's argmax of the logits those passes made (numpy_argmax)."""
    if settings.temperature == 0 and current_route().numpy_allowed:
        return numpy_argmax
    return make_sampler(
        temp=settings.temperature, top_p=settings.top_p, min_p=settings.min_p, top_k=settings.top_k
    )


def numpy_argmax(logits: mx.array) -> mx.array:
    """mlx-lm's greedy sampler (mx.argmax over the last axis: the first of the largest, as NumPy's)
    in NumPy: on a CPU MLX's argmax over a 151,936-id row took ~0.17 ms a token and a hop to its
    stream's thread, NumPy's ~0.015 ms on logits already held in memory."""
    if logits.dtype == mx.bfloat16:  # NumPy has no bfloat16
        return mx.argmax(logits, axis=-1)
    return mx.array(np.argmax(np.asarray(logits), axis=-1).astype(np.uint32))


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
