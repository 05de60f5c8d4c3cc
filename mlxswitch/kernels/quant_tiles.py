"""Quantized weights laid out once, at load, as the quantized kernel's tiles read them: MLX's 4-bit
codes and codes held a byte each (their scales and biases re-ordered alike), and GGUF's Q6_K blocks.

The kernel's integer tiles multiply 16 outputs an instruction with no horizontal adds, but laying
a tile out from MLX's rows costs a call about a step's reads and shuffles: a prefill pays it once
for hundreds of rows, a check of a few drafted tokens cannot (the Qwen 1.5B's 8960 × 1536 gate,
one thread: 4 rows 9.7 ms through tiles filled per call against 2.5 through the few-row path).
Laid out once, the same bytes in another order, every pass of such a weight goes through the
tiles: a step, a check and a prefill give a row the same bits, and a check's extra rows cost only
their own multiply-adds. quant_rows.c's quant_tile_pack and quant_q6k_tile_pack say the layouts;
AVX2 and AVX-512 builds (`QuantKernel.tiles`; without VNNI not full-byte codes): elsewhere weights keep
MLX's layout (and Q6_K its blocks).
"""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import numpy as np

from .quant_weights import (
    Q4K_BYTES,
    Q4K_TILED,
    Q4K_VALUES,
    Q6K,
    Q6K_BYTES,
    Q6K_TILED,
    Q6K_VALUES,
    SCALE_TYPES,
    TILED,
    QuantWeight,
)

TILE_OUTPUTS = 16  # outputs a tile holds (quant_rows.c's GEMM_OUT)
# 5-bit codes held a byte each are laid out as 5-bit tiles (False: as codes a byte each, the layout
# before; bench/bench_layers.py's `steps --byte-tiles` arm).
FIVE_BIT_TILES = True
TILE_INPUTS = 32  # inputs a block of a tile holds (quant_rows.c's BLOCK)


def leading_rows(weight: QuantWeight, rows: int) -> QuantWeight | None:
    """The view of W's first `rows` outputs: a prefix of each array, the same bytes (every layout
    holds an output's codes and scales before the next's, tiles whole tiles of 16 before the
    next). None where `rows` would cut a tile."""
    tiled = weight.layout in (TILED, Q6K_TILED, Q4K_TILED)
    if not 0 < rows <= weight.out_dims or (tiled and rows % TILE_OUTPUTS):
        return None

    def prefix(values: np.ndarray) -> np.ndarray:  # a K-quant's scales are a placeholder of one
        return values[:rows] if values.shape[0] == weight.out_dims else values

    return dataclasses.replace(
        weight,
        codes=prefix(weight.codes),
        scales=prefix(weight.scales),
        biases=prefix(weight.biases),
        out_dims=rows,
    )


def tiles_weight(weight: QuantWeight, wide: bool = False) -> bool:
    """Whether a weight can be laid out as tiles: affine 4-bit codes, or codes a byte each (2 to 8
    bits, held as MLX's 8-bit layout) where the rows are int8 (not `wide`: int16), groups a multiple
    of 32, outputs a multiple of 16."""
    return (
        weight.layout == "affine"
        and (weight.bits == 4 or (weight.bits == 8 and not wide))
        and weight.group_size % TILE_INPUTS == 0
        and weight.in_dims % weight.group_size == 0
        and weight.out_dims % TILE_OUTPUTS == 0
    )


def tile_order(values: np.ndarray) -> np.ndarray:
    """A weight's scales or biases (out × groups) in the tiles' order: per tile of 16 outputs, per
    group, the 16 outputs' values; shaped out × groups again (the same elements)."""
    out_dims, groups = values.shape
    tiles = values.reshape(out_dims // TILE_OUTPUTS, TILE_OUTPUTS, groups).transpose(0, 2, 1)
    return np.ascontiguousarray(tiles).reshape(out_dims, groups)


def _pack_target(weight: QuantWeight, in_place: bool) -> np.ndarray:
    """Where a pack writes a weight's layout: a new NumPy array, or `in_place` the codes' own buffer
    (MLX's, which NumPy shares: writable), whose array the weight then keeps."""
    if not in_place:
        return np.empty_like(weight.codes)
    codes = weight.codes
    if not (
        codes.flags.writeable
        and codes.flags.c_contiguous
        and np.shares_memory(codes, np.asarray(weight.keep[0]))
    ):
        raise ValueError("a weight laid out in place must hold its codes in its own array")
    return codes


def tiled_weight(kernel, weight: QuantWeight, threads: int = 2, in_place: bool = False) -> QuantWeight:
    """The weight laid out as tiles (tiles_weight must hold), and the kernel's view of them: its
    `keep` the codes, scales and biases, shaped and typed as MLX's triple of the tiles' width. The
    codes in a new array, or `in_place` in the weight's own (the loader's: the same bytes in another
    order, no second copy of the weight at its peak; every other view of that array then reads
    tiles). 5-bit codes held a byte each are laid out as 5-bit tiles, always in a new array: 5 bits
    a code read where the bytes held 8 (the Qwen 0.5B's Q5_0 layers)."""
    bits = 5 if FIVE_BIT_TILES and weight.bits == 8 and weight.code_bits == 5 else weight.bits
    if bits == 5:
        into = np.empty((weight.out_dims, weight.in_dims * 5 // 8), dtype=np.uint8)
    else:
        into = _pack_target(weight, in_place)
    at = (weight.codes.ctypes.data, into.ctypes.data, weight.out_dims, weight.in_dims, bits)
    if kernel.c.quant_tile_pack(*at, threads):
        raise ValueError(f"a {weight.out_dims} x {weight.in_dims} weight does not tile")
    arrays = [weight.keep[0] if in_place and bits != 5 else mx.array(into.view(np.uint32))]
    for values in (weight.scales, weight.biases):  # bf16 is held as its uint16 bits (_scale_view)
        array = mx.array(tile_order(values))
        arrays.append(mx.view(array, mx.bfloat16) if weight.scale_type == SCALE_TYPES[mx.bfloat16] else array)
    mx.eval(*arrays)
    return QuantWeight.from_tiles(arrays[0], arrays[1], arrays[2], weight.group_size, bits, weight.code_bits)


def tiled_codes(codes: np.ndarray | mx.array, out_dims: int, in_dims: int):
    """A tiled weight's codes (bytes: out × in/2 for 4-bit codes, out × in·5/8 for 5-bit ones, out ×
    in for a byte each) as one code a weight, out × in in natural order (NumPy or mx, as given): per
    tile, block and run of 8 inputs, output j's 4 bytes hold inputs 0-3 of the run in their low
    nibbles and 4-7 in their high ones (5-bit codes: then a run of their top bits, quant_rows.c's
    TILE_FIVE_BLOCK); a byte each, per run of 4 inputs output j's 4 bytes."""
    if codes.size * 8 == out_dims * in_dims * 5:
        return _five_bit_codes(codes, out_dims, in_dims)
    if codes.size == out_dims * in_dims:  # a byte each
        runs = codes.reshape(out_dims // TILE_OUTPUTS, in_dims // TILE_INPUTS, 8, TILE_OUTPUTS, 4)
        return runs.transpose(0, 3, 1, 2, 4).reshape(out_dims, in_dims)
    shape = (out_dims // TILE_OUTPUTS, in_dims // TILE_INPUTS, 4, TILE_OUTPUTS, 4)
    raw = codes.reshape(shape)
    if isinstance(raw, mx.array):
        both = mx.stack([raw & 15, raw >> 4], axis=-2)  # tile, block, run, output, half, input
        return both.transpose(0, 3, 1, 2, 4, 5).reshape(out_dims, in_dims)
    pair = np.stack([raw & 15, raw >> 4], axis=-2)
    return pair.transpose(0, 3, 1, 2, 4, 5).reshape(out_dims, in_dims)


def _five_bit_codes(codes: np.ndarray | mx.array, out_dims: int, in_dims: int):
    """tiled_codes of 5-bit tiles: the low 4 bits as 4-bit tiles hold them, plus 16 where the top
    bit is set (the block's fifth run: lane byte i, bit 4·h + p for input 8p + 4h + i)."""
    tiles, blocks = out_dims // TILE_OUTPUTS, in_dims // TILE_INPUTS
    raw = codes.reshape(tiles, blocks, 5, TILE_OUTPUTS * 4)
    low = tiled_codes(raw[:, :, :4].reshape(out_dims, in_dims // 2), out_dims, in_dims)
    top = raw[:, :, 4].reshape(tiles, blocks, TILE_OUTPUTS, 4, 1, 1)  # tile, block, output, i
    shifts = (4 * np.arange(2).reshape(2, 1) + np.arange(4)).astype(np.uint8)  # h, p
    if isinstance(top, mx.array):
        set_mx = (top >> mx.array(shifts)) & 1  # tile, block, output, i, h, p
        order = set_mx.transpose(0, 2, 1, 5, 4, 3).reshape(out_dims, in_dims)  # p, h, i: input 8p + 4h + i
        return low + (order << 4)
    set_np = (top >> shifts) & 1
    return low + (set_np.transpose(0, 2, 1, 5, 4, 3).reshape(out_dims, in_dims) << 4)


def tiled_values_mx(codes: mx.array, scales: mx.array, biases: mx.array, group_size: int) -> mx.array:
    """A tiled weight's W = s·q + b in plain mx ops, fp32 (its product where the kernel's is
    refused: in mx.compile, or off the kernel's route)."""
    out_dims, groups = scales.shape
    in_dims = groups * group_size
    q = tiled_codes(mx.view(codes, mx.uint8).reshape(out_dims, -1), out_dims, in_dims)

    def natural(values: mx.array) -> mx.array:  # tile order back to out × groups, one per input
        back = values.reshape(out_dims // TILE_OUTPUTS, groups, TILE_OUTPUTS).transpose(0, 2, 1)
        return mx.repeat(back.reshape(out_dims, groups).astype(mx.float32), group_size, axis=1)

    return natural(scales) * q.astype(mx.float32) + natural(biases)


# A Q6_K weight's tile of 16 outputs and 256 inputs (quant_rows.c's Q6K_TILE): 16 int8 scales an
# output and 16 fp16 d's, then per 32 inputs 4 runs of low nibbles and 2 of high bits (64 bytes each).
Q6K_TILE_CODES = 8 * 6 * 64
Q6K_TILE_BYTES = TILE_OUTPUTS * Q6K_BYTES
Q6K_TILE_META = Q6K_TILE_BYTES - Q6K_TILE_CODES  # the scales (256 bytes), then the d's


def tiles_q6k(weight: QuantWeight) -> bool:
    """Whether Q6_K blocks can be laid out as tiles: outputs a multiple of 16."""
    return weight.layout == Q6K and weight.out_dims % TILE_OUTPUTS == 0


def tiled_q6k_weight(kernel, weight: QuantWeight, threads: int = 2, in_place: bool = False) -> QuantWeight:
    """Q6_K blocks laid out as tiles (tiles_q6k must hold), in a new MLX array of the blocks' shape
    or `in_place` in the blocks' own (as tiled_weight), and the kernel's view of it."""
    blocks = weight.codes if in_place else np.ascontiguousarray(weight.codes)
    into = _pack_target(weight, in_place)
    if kernel.c.quant_q6k_tile_pack(
        blocks.ctypes.data, into.ctypes.data, weight.out_dims, weight.in_dims, threads
    ):
        raise ValueError(f"a {weight.out_dims} x {weight.in_dims} Q6_K weight does not tile")
    view = QuantWeight.from_q6k(weight.keep[0] if in_place else mx.array(into), weight.in_dims)
    return dataclasses.replace(view, layout=Q6K_TILED)


def q6k_tiled_values_mx(tiles: mx.array, in_dims: int) -> mx.array:
    """A tiled Q6_K weight's values (d·scale)·(q - 32) in plain mx ops, fp32, out × in (as
    q6k_values_mx for the blocks as stored)."""
    out_dims = tiles.shape[0]
    count, superblocks = out_dims // TILE_OUTPUTS, in_dims // Q6K_VALUES
    raw = tiles.reshape(count, superblocks, Q6K_TILE_BYTES).astype(mx.int32)
    codes = raw[..., Q6K_TILE_META:].reshape(count, superblocks, 8, 6, TILE_OUTPUTS, 4)
    low, high = [], []  # per run: inputs 0-3 of the run, then 4-7
    for run in range(4):
        nibbles = codes[:, :, :, run]
        low.append((nibbles & 15) | (((codes[:, :, :, 4] >> (2 * run)) & 3) << 4))
        high.append((nibbles >> 4) | (((codes[:, :, :, 5] >> (2 * run)) & 3) << 4))
    # tile, block of 256, block of 32, run, half, output, input
    q = mx.stack([mx.stack([lo, hi], axis=3) for lo, hi in zip(low, high, strict=True)], axis=3)
    q = q.transpose(0, 5, 1, 2, 3, 4, 6).reshape(out_dims, in_dims)
    scale_bytes = tiles.reshape(count, superblocks, Q6K_TILE_BYTES)[..., :256]
    scales = mx.view(scale_bytes, mx.int8).reshape(count, superblocks, 16, TILE_OUTPUTS).astype(mx.float32)
    d_bytes = tiles.reshape(count, superblocks, Q6K_TILE_BYTES)[..., 256:Q6K_TILE_META]
    d = mx.view(d_bytes, mx.float16).astype(mx.float32)  # count, superblocks, 16
    step = (d[:, :, None, :] * scales).transpose(0, 3, 1, 2).reshape(out_dims, in_dims // 16)
    return mx.repeat(step, 16, axis=1) * (q - 32).astype(mx.float32)


# A Q4_K weight's tile of 16 outputs and 256 inputs (quant_rows.c's Q4K_TILE): 3 runs of the blocks'
# scale bytes, 16 fp16 d's and 16 fp16 dmin's, then per 32 inputs 4 runs of nibbles as the 4-bit
# tiles lay them.
Q4K_TILE_CODES = 8 * 4 * 64
Q4K_TILE_BYTES = TILE_OUTPUTS * Q4K_BYTES
Q4K_TILE_META = Q4K_TILE_BYTES - Q4K_TILE_CODES


def tiled_q4k_weight(kernel, blocks: mx.array, in_dims: int, threads: int = 2) -> QuantWeight | None:
    """Q4_K blocks (uint8, out × in/256·144, as the file holds them) laid out as tiles in their own
    array (the same bytes in another order), and the kernel's view of them; None where they do not
    tile (outputs a multiple of 16)."""
    out_dims = blocks.shape[0]
    row_bytes = in_dims // Q4K_VALUES * Q4K_BYTES
    if out_dims % TILE_OUTPUTS or in_dims % Q4K_VALUES or blocks.shape[1] != row_bytes:
        return None
    mx.eval(blocks)
    codes = np.asarray(blocks)  # MLX's buffer: written in place
    if not (codes.flags.writeable and codes.flags.c_contiguous):
        blocks = mx.array(np.ascontiguousarray(codes))
        mx.eval(blocks)
        codes = np.asarray(blocks)
    if kernel.c.quant_q4k_tile_pack(codes.ctypes.data, codes.ctypes.data, out_dims, in_dims, threads):
        return None
    return QuantWeight.from_q4k_tiles(blocks, in_dims)


def q4k_tiled_values_mx(tiles: mx.array, in_dims: int) -> mx.array:
    """A tiled Q4_K weight's values (d·sc)·q - dmin·m in plain mx ops, fp32, out × in (its product
    where the kernel's is refused: in mx.compile, or off the kernel's route)."""
    out_dims = tiles.shape[0]
    count, superblocks = out_dims // TILE_OUTPUTS, in_dims // Q4K_VALUES
    raw = tiles.reshape(count, superblocks, Q4K_TILE_BYTES)
    codes = raw[..., Q4K_TILE_META:].astype(mx.int32).reshape(count, superblocks, 8, 4, TILE_OUTPUTS, 4)
    q = mx.stack([codes & 15, codes >> 4], axis=4)  # tile, 256, 32, run, half, output, input
    q = q.transpose(0, 5, 1, 2, 3, 4, 6).reshape(out_dims, in_dims)
    meta = raw[..., :Q4K_TILE_META]
    scale_bytes = meta[..., : 3 * 64].reshape(count, superblocks, 3, TILE_OUTPUTS, 4)
    scale_bytes = scale_bytes.transpose(0, 3, 1, 2, 4).reshape(out_dims, superblocks, 12).astype(mx.int32)
    low_sc, low_m = scale_bytes[..., 0:4] & 63, scale_bytes[..., 4:8] & 63
    high_sc = (scale_bytes[..., 8:12] & 15) | ((scale_bytes[..., 0:4] >> 6) << 4)
    high_m = (scale_bytes[..., 8:12] >> 4) | ((scale_bytes[..., 4:8] >> 6) << 4)
    sc = mx.concatenate([low_sc, high_sc], axis=-1).astype(mx.float32)  # out, 256s, 8
    m = mx.concatenate([low_m, high_m], axis=-1).astype(mx.float32)

    def halves(at: int) -> mx.array:  # count, superblocks, 16 → out, superblocks, 1
        values = mx.view(meta[..., at : at + 2 * TILE_OUTPUTS], mx.float16).astype(mx.float32)
        return values.transpose(0, 2, 1).reshape(out_dims, superblocks, 1)

    step, low = halves(3 * 64) * sc, halves(3 * 64 + 2 * TILE_OUTPUTS) * m

    def per_input(values: mx.array) -> mx.array:  # out, 256s, 8 → one a weight
        return mx.repeat(values.reshape(out_dims, superblocks * 8), 32, axis=1)

    return per_input(step) * q.astype(mx.float32) - per_input(low)
