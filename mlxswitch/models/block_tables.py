"""What a decoder block's NumPy operations (cpu_blocks.py) and its one-call pass (block_calls.py)
share: RoPE's cos and sin tables for a pass's positions, and a norm's weight as an fp32 view."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np


def rope_tables(rope: nn.RoPE, offsets: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin (1 or B, 1, L, dims/2) of nn.RoPE's angles at positions offsets + 0..L-1. Every
    layer of a pass rotates its queries and keys at the same positions: the last tables are kept
    (one entry; a pass of 28 layers computes them once, not 56 times)."""
    key = (rope.dims, rope.base, rope.scale, length, offsets.tobytes())
    last = ROPE_TABLES_KEPT.get("last")
    if last is not None and last[0] == key:
        return last[1]
    half = rope.dims // 2
    positions = offsets.reshape(-1, 1) + np.arange(length)  # (1 or B, L)
    frequencies = np.asarray(rope.base, dtype=np.float64) ** (-np.arange(half) / half)
    angles = (rope.scale * positions)[:, None, :, None] * frequencies  # (1 or B, 1, L, half)
    tables = (np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32))
    ROPE_TABLES_KEPT["last"] = (key, tables)  # one assignment: a reader on another thread sees a pair
    return tables


ROPE_TABLES_KEPT: dict[str, tuple] = {}


@dataclass(frozen=True)
class _NumpyWeight:
    """A norm's weight and its fp32 NumPy view, kept on the norm (a plain attribute, never a
    parameter: not an mx.array, dict, list or tuple) while that array is still its weight."""

    weight: mx.array
    view: np.ndarray


def rms_norm_weight(norm: nn.RMSNorm) -> np.ndarray:
    """The norm's weight as an fp32 NumPy view, kept on the norm while it is its weight."""
    kept = getattr(norm, "numpy_weight", None)
    if kept is None or kept.weight is not norm.weight:
        view = np.asarray(norm.weight if norm.weight.dtype == mx.float32 else norm.weight.astype(mx.float32))
        kept = norm.numpy_weight = _NumpyWeight(norm.weight, view)
    return kept.view
