"""Token signals: the reference against float64, the kernel's algorithm, the kernel where Metal runs."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

from mlxswitch.kernels import _float64_signals, kernel_self_check, relative_error
from mlxswitch.kernels import entropy as entropy_kernel
from mlxswitch.signals import token_signals

VOCABS = (49152, 151936)


def _logits(v: int, seed: int = 0, scale: float = 3.0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, scale, size=v).astype(np.float32)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_reference_matches_float64(vocab, dtype):
    x = mx.array(_logits(vocab)).astype(dtype)
    want = _float64_signals(np.array(x.astype(mx.float32)))
    got = np.array(token_signals(x))
    # bf16 input still reduces in fp32: entropy right to ~1e-3 bits.
    assert abs(got[0] - want[0]) < 1e-3
    assert relative_error(got, want) < 1e-3


def test_extremes_masked_one_hot_uniform_and_nan():
    v = 49152
    masked = np.full(v, -np.inf, dtype=np.float32)
    masked[:4] = 0.0
    assert np.allclose(np.array(token_signals(mx.array(masked))), [2.0, 0.0, 0.0], atol=1e-5)
    one_hot = np.zeros(v, dtype=np.float32)
    one_hot[7] = 100.0
    h, var, margin = np.array(token_signals(mx.array(one_hot)))
    assert h < 1e-6 and margin > 0.999999
    h, var, margin = np.array(token_signals(mx.zeros((1, v))))
    assert abs(h - math.log2(v)) < 1e-3 and abs(var) < 1e-3 and margin == 0
    broken = mx.array(_logits(v)).at[3].add(float("nan"))
    assert math.isnan(float(token_signals(broken)[0]))


def test_signals_stay_lazy_until_evaluated():
    out = token_signals(mx.array(_logits(1000)))
    assert isinstance(out, mx.array) and out.shape == (3,) and out.dtype == mx.float32


def _simulated_kernel(logits: np.ndarray, threads: int = 64, simd: int = 32) -> np.ndarray:
    """The Metal kernel's algorithm in NumPy fp32: per-thread online stats, then tree merges."""
    f = np.float32

    def empty():
        return [f(-np.inf), f(0), f(0), f(0), f(-np.inf), f(-np.inf)]

    def shift(st, m):
        if st[0] == -np.inf:
            st[1] = st[2] = st[3] = f(0)
        else:
            c = f(st[0] - m)
            r = f(np.exp(c))
            st[3] = r * (st[3] + f(2) * c * st[2] + c * c * st[1])
            st[2] = r * (st[2] + c * st[1])
            st[1] = r * st[1]
        st[0] = f(m)

    def merge(a, b):
        m = max(a[0], b[0])
        if m == -np.inf:
            return empty()
        a, b = list(a), list(b)
        shift(a, m)
        shift(b, m)
        return [m, a[1] + b[1], a[2] + b[2], a[3] + b[3], max(a[4], b[4]),
                max(min(a[4], b[4]), max(a[5], b[5]))]

    states = []
    for tid in range(threads):
        st = empty()
        for x in logits[tid::threads]:
            if x == -np.inf:
                continue
            if x > st[4]:
                st[5], st[4] = st[4], x
            elif x > st[5]:
                st[5] = x
            if x > st[0]:
                shift(st, x)
            d = f(x - st[0])
            e = f(np.exp(d))
            st[1] += e
            st[2] += e * d
            st[3] += e * d * d
        states.append(st)
    # SIMD tree reduction towards lane 0 (delta 16, 8, 4, 2, 1), then across SIMD groups.
    partials = []
    for g in range(0, threads, simd):
        lanes = states[g:g + simd]
        delta = simd // 2
        while delta:
            lanes = [merge(lanes[i], lanes[i + delta]) if i + delta < len(lanes) else lanes[i]
                     for i in range(len(lanes))]
            delta //= 2
        partials.append(lanes[0])
    total = partials[0]
    for p in partials[1:]:
        total = merge(total, p)
    m, s, s1, s2, t1, t2 = total
    mean_d = s1 / s
    ln2 = np.log(2)
    return np.array([(np.log(s) - mean_d) / ln2, max(s2 / s - mean_d ** 2, 0) / ln2 ** 2,
                     (1 - np.exp(t2 - m)) / s])


def test_kernel_algorithm_matches_float64_in_simulation():
    # Checks the online-merge formulas of metal/entropy.metal where Metal cannot run.
    x = _logits(6000, seed=3)
    x[::97] = -np.inf
    assert relative_error(_simulated_kernel(x), _float64_signals(x)) < 1e-4


def test_metal_source_ships_with_header_and_body():
    header, body = entropy_kernel._split_source()
    assert "signal_stats_merge" in header and "partials[group]" in body
    # Building is lazy everywhere; here it proves the API accepts the pieces.
    mx.fast.metal_kernel(name=entropy_kernel.KERNEL_NAME, input_names=["logits"],
                         output_names=["out"], source=body, header=header)


@pytest.mark.skipif(not mx.metal.is_available(), reason="needs Metal")
@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_metal_kernel_matches_reference(vocab, dtype):
    x = mx.array(_logits(vocab)).astype(dtype)
    got = np.array(entropy_kernel.metal_token_signals(x))
    want = np.array(entropy_kernel.reference_token_signals(x))
    assert relative_error(got, want) < 1e-3


def test_self_check_reports_and_never_raises():
    checks = kernel_self_check()
    assert checks[0].status == "ok"
    if not mx.metal.is_available():
        assert checks[1].status == "unavailable: no Metal backend"
