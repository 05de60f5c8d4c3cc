"""Attention in NumPy on the CPU's eager route: softmax(q·kᵀ·scale + mask)·v for mlx-lm's llama and
qwen2 attention (cpu_blocks.py), where MLX's CPU `scaled_dot_product_attention` ran at ~2 GFLOP/s
(cpu_blocks' docstring). A decoding pass's queries one at a time over exactly the keys each sees,
so a checked token's attention is its step's; longer passes one batched product (under a causal
mask, a block of queries at a time over the keys it sees).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import mlx.core as mx
import numpy as np

from ..kernels._common import single_threaded_blas
from ..kernels.pass_ops import PassOps
from ..kernels.quant_cpu import INT8_MAX_POSITIONS

# Up to this many query rows (steps, checks and the default prefill step's chunks) attention runs
# on one BLAS thread (numpy_attention): OpenBLAS's workers spin after a product and took ~11% of a
# 512-token prefill's samples on 2 cores, beside the kernel's own pool; on one thread the Qwen 1.5B's
# prefill took 12.9-13.0 s against 13.5-14.6 (git show 824b46b:bench/results/prefill-int8-tiles.txt).
SMALL_QUERIES = 512


def evaluated(*arrays: mx.array) -> list[np.ndarray] | None:
    """fp32 NumPy views of evaluated arrays, or None where evaluation is refused (mx.compile)."""
    widened = [a if a.dtype == mx.float32 else a.astype(mx.float32) for a in arrays]
    try:
        mx.eval(*widened)
    except ValueError:
        return None
    return [np.asarray(a) for a in widened]


def numpy_attention(
    queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask: Any
) -> mx.array | None:
    """softmax(q·kᵀ·scale + mask)·v for q (B, H, L, D) and k, v (B, KV, T, D), KV dividing H (each
    query head h reads key head h // (H / KV), as MLX's grouped attention does). `mask`: None,
    "causal" (the last L of T positions) or an additive or boolean array. None where evaluation
    is refused or the mask is of another kind."""
    if not (mask is None or isinstance(mask, mx.array) or (isinstance(mask, str) and mask == "causal")):
        return None
    views = evaluated(queries, keys, values)
    if views is None:
        return None
    q, k, v = views
    # One BLAS thread for a step or a check: these products are small, and OpenBLAS's own threads
    # would fight the quantized kernel's threads (still spinning after its last product)
    # for the cores: on 2 cores that made a 16-row check of the Qwen 1.5B ~2.6x slower, and a
    # 512-token prefill chunk ~5-10% slower (SMALL_QUERIES).
    small = q.shape[2] <= SMALL_QUERIES
    with single_threaded_blas() if small else contextlib.nullcontext():
        return mx.array(attention_rows(q, k, v, scale, mask))


def attention_rows(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, mask, ops: PassOps | None = None
) -> np.ndarray:
    """A decoding pass's queries one at a time (by the compiled pass operations where given, else
    _attention_by_row), where the mask says plainly which keys each sees; else, and for longer
    passes, one batched product."""
    if q.shape[2] <= INT8_MAX_POSITIONS:
        seen = visible_ranges(mask, q.shape[0], q.shape[2], k.shape[2]) if ops is not None else None
        attended = ops.attend(q, k, v, seen, scale) if ops is not None and seen is not None else None
        if attended is not None:
            return attended
        by_row = _attention_by_row(q, k, v, scale, mask)
        if by_row is not None:
            return by_row
    return _attention(q, k, v, scale, mask)


def visible_ranges(mask, batch: int, length: int, total: int) -> list[slice] | None:
    """The keys each query (b, i) of a pass sees, in order b·L + i (_visible_keys); None where
    the mask does not say so plainly for one of them."""
    if isinstance(mask, mx.array):
        mask = np.asarray(mask)  # once, not once a query
    seen = [_visible_keys(mask, length, total, b, i) for b in range(batch) for i in range(length)]
    return None if any(s is None for s in seen) else seen  # type: ignore[return-value]


def _visible_keys(mask, length: int, total: int, b: int, i: int) -> slice | None:
    """The keys query i of sequence b sees, as one contiguous range; None where the mask does not
    say so plainly (a per-head mask, a bias that is neither 0 nor -inf, holes)."""
    if mask is None:
        return slice(0, total)
    if isinstance(mask, str):  # causal: query i sits at position total - length + i
        return slice(0, total - length + i + 1)
    m = np.asarray(mask)
    if m.ndim == 4:  # (B, 1 or H, L, T)
        if m.shape[1] != 1:
            return None
        m = m[:, 0]
    if m.ndim == 2:  # (L, T): every sequence alike
        m = m[None]
    row = m[b if m.shape[0] > 1 else 0, i]
    if row.dtype == np.bool_:
        seen = row
    elif np.all((row == 0) | np.isneginf(row)):
        seen = row == 0
    else:
        return None
    where = np.flatnonzero(seen)
    if where.size == 0 or where[-1] - where[0] + 1 != where.size:
        return None
    return slice(int(where[0]), int(where[-1]) + 1)


def _attention_by_row(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, mask) -> np.ndarray | None:
    """_attention one query position of one sequence at a time, over exactly the keys it sees:
    the products a decoding step at that position makes, so a check's or a packed pass's rows
    get a step's bits (a batched product sums in another order, and int8 activations downstream
    can turn a last-bit difference into a different token). None where the mask is not plain."""
    batch, heads, length, dim = q.shape
    total = k.shape[2]
    out = np.empty_like(q)
    if isinstance(mask, mx.array):
        mask = np.asarray(mask)  # once, not once a query
    for b in range(batch):
        for i in range(length):
            seen = _visible_keys(mask, length, total, b, i)
            if seen is None:
                return None
            # Views, not copies: each head's keys are contiguous rows, which BLAS reads in place (a
            # copy of the cache a layer cost the 1.5B ~1.4 ms a step at a 1,000-token context).
            keys, values = k[b : b + 1, :, seen], v[b : b + 1, :, seen]
            out[b : b + 1, :, i : i + 1] = _attention(
                np.ascontiguousarray(q[b : b + 1, :, i : i + 1]), keys, values, scale, None
            )
    return out


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, mask) -> np.ndarray:
    """numpy_attention's product on fp32 NumPy arrays (its docstring)."""
    if isinstance(mask, str):
        return _causal_attention(q, k, v, scale)
    batch, heads, length, dim = q.shape
    kv_heads, total = k.shape[1], k.shape[2]
    group = heads // kv_heads
    # Queries grouped by the key head they read: one product per key head for all its queries.
    scores = np.matmul(q.reshape(batch, kv_heads, group * length, dim), np.swapaxes(k, -1, -2))
    scores = scores.reshape(batch, kv_heads, group, length, total) * np.float32(scale)
    if mask is not None:
        # (L, T), (B, L, T), or (B, 1 or H, L, T), broadcast over the grouped scores
        m = np.asarray(mask)
        if m.ndim == 3:
            m = m[:, None, None]
        elif m.ndim == 4:
            m = m[:, :, None] if m.shape[1] == 1 else m.reshape(m.shape[0], kv_heads, group, length, total)
        scores = np.where(m, scores, np.float32(-np.inf)) if m.dtype == np.bool_ else scores + m
    _softmax_in_place(scores)
    out = np.matmul(scores.reshape(batch, kv_heads, group * length, total), v)
    return out.reshape(batch, heads, length, dim)


# Queries a causal product takes at a time (_causal_attention).
CAUSAL_BLOCK = 128


def _causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """_attention under a causal mask (query i sits at position total - length + i and sees keys
    up to it), CAUSAL_BLOCK queries at a time over only the keys the block's last query sees:
    a prefill chunk's scores above the diagonal were computed, masked and exponentiated whole
    (a 512-token chunk of the Qwen 1.5B: ~44 ms a layer, half of it masking and softmax)."""
    batch, heads, length, dim = q.shape
    kv_heads, total = k.shape[1], k.shape[2]
    group = heads // kv_heads
    out = np.empty_like(q)
    grouped_q = q.reshape(batch, kv_heads, group, length, dim)
    grouped_out = out.reshape(batch, kv_heads, group, length, dim)  # a view: out is contiguous
    for first in range(0, length, CAUSAL_BLOCK):
        n = min(CAUSAL_BLOCK, length - first)
        seen = total - length + first + n  # keys the block's last query sees
        block = grouped_q[:, :, :, first : first + n].reshape(batch, kv_heads, group * n, dim)
        scores = np.matmul(block, np.swapaxes(k[:, :, :seen], -1, -2))
        scores = scores.reshape(batch, kv_heads, group, n, seen)
        scores *= np.float32(scale)
        scores[..., seen - n :] += _upper_triangle(n)  # the last n keys: query r sees the first r + 1
        _softmax_in_place(scores)
        attended = np.matmul(scores.reshape(batch, kv_heads, group * n, seen), v[:, :, :seen])
        grouped_out[:, :, :, first : first + n] = attended.reshape(batch, kv_heads, group, n, dim)
    return out


def _softmax_in_place(scores: np.ndarray) -> None:
    """softmax over the last axis, in place (every attention product's, one order of operations)."""
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)


@functools.cache
def _upper_triangle(n: int) -> np.ndarray:
    """(n, n) fp32: -inf above the diagonal, 0 on and below it (added: masked scores become -inf)."""
    return np.triu(np.full((n, n), -np.inf, dtype=np.float32), k=1)
