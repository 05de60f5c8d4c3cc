"""Weights that read the same rows, multiplied in one call of the quantized kernel.

A decoder block's q, k and v projections (and its gate and up) multiply the same rows. One call
rounds the rows once per layout (container bits and groups) and runs one pass of the kernel's
thread pool over all their outputs, where a call each paid Python's call, the rounding, a wake of
the pool and the prefetcher's ramp on a small weight: on the Qwen 1.5B those products took 26.2 ms
a step against 27.8 (every layer's, one row, in turns in one process, a slow hour; 17.5 against
18.3 earlier, when each weight still rounded the rows itself). Each output is computed as
quant_rows_int8 computes it alone, so the bits are the same (tests/test_quant_kernel.py).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .quant_cpu import int8_applies, wide_applies
from .quant_library import QuantKernel
from .quant_weights import Q4K_TILED, TILED, QuantWeight, WeightFields

# Most weights one call multiplies together (quant_rows.c's MANY_WEIGHTS).
MANY_WEIGHTS = 8


@dataclass(frozen=True, eq=False)
class WeightPack:
    """Weights of one input width that all take the int8 path (with `wide`, the int16 one), as one
    call takes them; `ends`: where each weight's outputs end in the product's columns."""

    weights: tuple[QuantWeight, ...]
    fields: ctypes.Array
    ends: tuple[int, ...]
    tiled: bool = False  # all laid out as tiles (quant_tiles.py): the tiles' call
    wide: bool = False  # rows rounded to int16 (quant_cpu.wide_applies): tiles only


def weight_pack(weights: Sequence[QuantWeight], wide: bool = False) -> WeightPack | None:
    """The pack of 2..MANY_WEIGHTS weights of one input width that all take the int8 path (wide:
    the int16 one, on tiles), or None."""
    if not 1 < len(weights) <= MANY_WEIGHTS or len({w.in_dims for w in weights}) != 1:
        return None
    layouts = {w.layout for w in weights}
    # The tiles' call takes affine tiles and Q4_K tiles together (a Q4_K_M layer's q and k beside a
    # v re-rounded from Q6_K); a tiled weight beside an affine one: each its own call.
    tiled = layouts <= {TILED, Q4K_TILED}
    applies = wide_applies if wide else int8_applies
    if not all(applies(w) for w in weights) or not (tiled or (len(layouts) == 1 and not wide)):
        return None
    fields = (WeightFields * len(weights))(*(w.fields for w in weights))
    ends = tuple(np.cumsum([w.out_dims for w in weights]).tolist())
    return WeightPack(tuple(weights), fields, ends, tiled, wide)


def times_together(
    kernel: QuantKernel, xs: np.ndarray, pack: WeightPack, threads: int = 1
) -> np.ndarray | None:
    """xs (rows × in) · [W_0 … W_n]ᵀ as rows × Σ out on int8 activations (int16 where the pack is
    wide), each weight's outputs as `kernel.times(xs, W_i, int8=True, wide=pack.wide)` gives them,
    side by side. None where the kernel refused (the caller then multiplies one at a time)."""
    xs = np.ascontiguousarray(xs, dtype=np.float32)
    rows = xs.shape[0]
    y = np.empty((rows, pack.ends[-1]), dtype=np.float32)
    at = (xs.ctypes.data, y.ctypes.data, rows, xs.shape[1], threads, len(pack.weights), pack.fields)
    done = (
        kernel.c.quant_tiled_rows(*at, int(pack.wide)) if pack.tiled else kernel.c.quant_rows_int8_many(*at)
    )
    return y if done >= 1 else None
