"""A request's settings to its sampler: greedy decoding on a CPU's NumPy route takes NumPy's argmax,
which must pick mlx-lm's id (MLX's argmax) on every row, ties and infinities included."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.sample_utils import make_sampler

from mlxswitch.decoding.requests import GenerationSettings
from mlxswitch.decoding.samplers import numpy_argmax, sampler_for
from mlxswitch.kernels.route import resolve_route


def test_numpy_argmax_picks_mlx_s_id_on_every_row():
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((6, 5000)).astype(np.float32)
    logits[1, [7, 40, 4000]] = 9.0  # a tie: the first of the largest
    logits[2, :] = -np.inf
    logits[2, 11] = 0.0
    logits[3, [5, 9]] = np.inf
    logits[4] = np.round(logits[4])  # many ties among the rounded values
    for dtype in (mx.float32, mx.float16):
        rows = mx.array(logits).astype(dtype)
        want = make_sampler(temp=0.0)(rows)
        got = numpy_argmax(rows)
        assert got.dtype == want.dtype
        assert got.tolist() == want.tolist()
    one = mx.array(logits[:1])
    assert numpy_argmax(one).tolist() == make_sampler(temp=0.0)(one).tolist()


@pytest.mark.parametrize(
    ("kernels", "temperature", "numpy"), [("auto", 0.0, True), ("mx", 0.0, False), ("auto", 0.7, False)]
)
def test_greedy_on_the_numpy_route_takes_numpy_s_argmax_and_nothing_else_does(kernels, temperature, numpy):
    resolve_route(kernels, "cpu")
    sampler = sampler_for(GenerationSettings(temperature=temperature))
    assert (sampler is numpy_argmax) == numpy
