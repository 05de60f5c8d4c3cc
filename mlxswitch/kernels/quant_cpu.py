"""MLX affine-quantized weights multiplied as they are stored, by a small C kernel (quant_rows.c).

Why our own: MLX's CPU quantized matmul is a scalar loop on x86 (0.4-1.1 GB/s), and the only
fast alternative there, a resident fp32 copy of every quantized weight, reads 4 bytes a weight per
token where the model holds ~0.6-1.2 (6-8 GB resident for the Qwen 1.5B). This kernel reads the
packed codes, scales and biases in place (no copy at all for 4- and 8-bit codes with fp32,
fp16 or bf16 scales; the CPU default holds a layer's as fp16 where they fit: the views are
quant_weights.py's), unpacks them in registers and reads each byte once for up to 8 rows; many
rows go through integer tiles or a small dequantized panel kept in cache. With AVX-512 VNNI the
loader lays weights out as those tiles read them, once, and every pass takes them (quant_tiles.py).
mlx-lm has no CPU route of its own to reuse.

Life cycle as the panel kernel's: compiled on first use with the machine's C compiler into the
per-machine cache (cbuild.py), loaded with ctypes and checked against a float64 product before
any model uses it (a pass kept beside the library: a later process loading the same bytes on this
CPU does not check again). Without a compiler, or on a failed check, `quant_kernel()` is None and the
route falls back (kernels/route.py says which and why).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import mlx.core as mx
import numpy as np

from . import quant_check, quant_library, quant_tiles, quant_weights
from .cbuild import build_checked
from .quant_check import INT8_BLOCK, check_kernel
from .quant_library import QuantKernel
from .quant_weights import (
    Q4K_TILED,
    Q6K,
    Q6K_TILED,
    TILED,
    QuantWeight,
    unpack_codes,
)

SOURCE = Path(__file__).with_name("quant_rows.c")
# Tried in order: a compiler may refuse -march=native. Threads are the kernel's own pool (pthreads).
COMPILE_FLAGS = (
    ("-O3", "-march=native", "-pthread"),
    ("-O3", "-pthread"),
)
# Every pass a decoding round makes, of every sequence in a batch (a step, a check of the longest
# draft: decoding.drafting.MAX_DRAFT = 32, plus one position), computes each row as a step would
# (int8 activations where they apply, the few-row path otherwise), so a checked token's logits are
# a step's, bit for bit, alone or batched; a pass of more positions a sequence (a prefill) takes
# the many-row paths: integer tiles where gemm_takes, else the fp32 panel (kernels.md).
INT8_MAX_POSITIONS = 33


def widened_codes(weight: mx.array, bits: int) -> mx.array:
    """MLX's packed `bits`-bit codes (2, 3, 5 or 6) as MLX's 8-bit layout of the same codes: one
    byte a code, which the kernel reads in place (with the same scales and biases, the same W).
    By the compiled kernel where it built (~10x NumPy's: the Qwen pair's Q6_K-born layers took
    2.2 s of its load in NumPy), else by unpack_codes."""
    mx.eval(weight)
    in_dims = weight.shape[1] * 32 // bits
    packed = np.asarray(weight)
    kernel = quant_kernel()
    codes = unpack_codes(packed, bits, in_dims) if kernel is None else kernel.unpack(packed, bits, in_dims)
    return mx.array(codes.view(np.uint32))


@dataclass(frozen=True)
class QuantBuild:
    """What building the kernel gave: the kernel, or None and why not (for `mlxswitch doctor`)."""

    kernel: QuantKernel | None
    detail: str


# Layers whose input is not rounded to int8: the MLP's down projection reads silu(gate)·up, where a
# transformer's massive activations live (hundreds of times the median), which a block of 32
# rounded to int8 cannot keep. With them on int8 the Qwen 1.5B's argmax agreed with fp32 at 473 of
# 480 positions, two of the differences over a logit apart (bench/results/int8-accuracy-down.txt).
# They take int16 activations instead where their codes are 4-bit (wide_applies), else fp32.
# mlx-lm's models name the layer so.
FP32_INPUT_LAYERS = ("down_proj",)


def int8_inputs(layer_name: str, in_dims: int | None = None) -> bool:
    """Whether a layer of this name (its path in the model) and input width may take int8
    activations: not a down projection, and rows at least INT8_MIN_INPUTS wide (narrower ones take
    int16 where their codes are 4-bit, wide_applies, else fp32)."""
    narrow_rows = in_dims is not None and in_dims < INT8_MIN_INPUTS
    return layer_name.rsplit(".", 1)[-1] not in FP32_INPUT_LAYERS and not narrow_rows


# Codes whose products take int16 activations where int8 is refused (a down projection): the Qwen
# 1.5B's 4-bit down projections, one row, 2 threads: 11.7 ms on fp32 activations, 6.6 on int16
# (6.5 on int8); its Q6_K-born 8-bit ones 10.0 on fp32 against 12.6 on int16 (read-bound either
# way: the fp32 path there is as fast as int8's). Ad hoc, bench/results/down-int16.txt.
WIDE_CODE_BITS = (4,)


def integer_applies(weight: QuantWeight, narrow: bool) -> bool:
    """Whether a decoding pass's rows take integer activations on this weight: int8 where the layer
    allows them (`narrow`) and int8_applies, int16 where it refuses them and wide_applies; a Q6_K
    weight's always (int8 where narrow: an output head; int16 else: a down projection)."""
    if weight.layout in (Q6K, TILED, Q6K_TILED, Q4K_TILED):
        return True
    return int8_applies(weight) if narrow else wide_applies(weight)


def wide_applies(weight: QuantWeight) -> bool:
    """Whether a layer refused int8 activations takes int16 ones on this weight (else fp32): 4-bit
    codes (WIDE_CODE_BITS), groups a multiple of 32, rows at least WIDE_MIN_INPUTS wide."""
    return (
        weight.bits in WIDE_CODE_BITS
        and (weight.code_bits or weight.bits) in INT8_CODE_BITS
        and weight.group_size % INT8_BLOCK == 0
        and weight.in_dims >= WIDE_MIN_INPUTS
    )


def int8_applies(weight: QuantWeight) -> bool:
    """Whether the kernel's int8-activation path takes this product (else the fp32 one): codes of
    up to 6 bits (a byte's code below 128 is one u8 × s8 product, as a 4-bit one is) or a full
    byte (centred in registers, one product of its size and x with its sign), groups a multiple
    of 32. The Qwen 0.5B's layers on it: argmax equal to fp32's at 477/480 (each difference a
    near-tie), logit difference at most 0.56; the 1.5B's 480/480 (bench/bench_int8_accuracy.py).
    Rows of fewer than INT8_MIN_INPUTS inputs are not rounded to int8 (they take int16 where
    wide_applies, int8_inputs)."""
    return (
        (weight.code_bits or weight.bits) in INT8_CODE_BITS
        and weight.group_size % INT8_BLOCK == 0
        and weight.in_dims >= INT8_MIN_INPUTS
    )


# 8-bit codes (the Qwen 1.5B's Q6_K tied head and v projections): one row of the head 20.6 ms on
# fp32, 11.9 on int8; 4 rows 23.8 against 19.7 (git show 824b46b:bench/results/quant-kernel-8bit.txt).
INT8_CODE_BITS = (2, 3, 4, 5, 6, 8)
# Rows at least this wide take int8: the Qwen 0.5B's (896) and 1.5B's (1536). SmolLM2-135M's (576)
# on int8 moved its argmax at 13 of 480 teacher-forced positions, one 0.85 logits apart, and on
# int16 at none (largest logit difference 0.009; bench/results/int8-accuracy-embedded.txt). So
# narrower rows take int16 where their codes are 4-bit (int8_inputs, wide_applies), from
# WIDE_MIN_INPUTS: on the fp32 panel, as before 6d5115f, its decoding took ~2x the time
# (bench/results/single-tier-embedded.txt).
INT8_MIN_INPUTS = 768
WIDE_MIN_INPUTS = 512


@cache
def build_quant_kernel() -> QuantBuild:
    """Compile (or load from the per-machine cache), load and check the kernel once per process."""
    made = build_checked(
        SOURCE, COMPILE_FLAGS, lambda built: QuantKernel(built.library, built.flags), check_kernel, CHECKED_BY
    )
    if isinstance(made, str):
        return QuantBuild(None, made)
    kernel, built = made
    return QuantBuild(kernel, built.detail(kernel.threaded, "float64", pool="its own thread pool"))


# The code a check's verdict depends on besides the library: the check and its references
# (quant_check.py), the library's Python face, and the weight views and tile layouts it multiplies.
CHECKED_BY = tuple(Path(str(m.__file__)) for m in (quant_check, quant_library, quant_weights, quant_tiles))


def quant_kernel() -> QuantKernel | None:
    """The checked kernel, or None where it could not be built (see build_quant_kernel)."""
    return build_quant_kernel().kernel


def quant_weights_times(
    xs: np.ndarray,
    weights: Sequence[QuantWeight],
    threads: int,
    int8: bool = False,
    by_row: bool = False,
    narrow: bool = True,
) -> np.ndarray:
    """xs · (Σ weights)ᵀ: one kernel product a weight (a nested gear's planes), summed in fp32
    (int8: integer activations where they apply, int8 where `narrow` (int8_applies) and else int16
    (wide_applies), else fp32; by_row: every row by the few-row path, whose result for a row does
    not depend on the other rows, not the panel)."""
    kernel = quant_kernel()
    assert kernel is not None, "quantized views are used only where the kernel is"
    many_from = xs.shape[0] + 1 if by_row else None
    y = None
    for weight in weights:
        integer = int8 and integer_applies(weight, narrow)
        product = kernel.times(xs, weight, threads, many_from, int8=integer, wide=not narrow)
        y = product if y is None else y + product
    assert y is not None, "a layer has at least one plane"
    return y
