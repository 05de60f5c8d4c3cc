"""An MLX affine-quantized weight as the compiled quantized kernel reads it (kernels/quant_cpu.py).

The views read MLX's buffers in place: 4- and 8-bit codes, fp32, fp16 or bf16 scales and biases
(no copy at all); codes of other widths are unpacked to a byte a code once, at load. Also the
rule by which the CPU default holds fp32 scales as fp16, and the NumPy unpacking every width
shares with the kernel's own.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import mlx.core as mx
import numpy as np

DIRECT_BITS = (4, 8)  # read in place; other widths are widened (or unpacked) to a byte a code at load
SUPPORTED_BITS = (2, 3, 4, 5, 6, 8)

# A weight's layout: MLX's affine triple, or GGUF's Q6_K blocks as the file holds them (MLX has no
# group of 16, so a Q6_K weight as an MLX one is re-rounded to 8 bits: 9-10 bits a weight and not
# the file's values; quant_rows.c's q6k_rows reads the blocks).
AFFINE, Q6K = "affine", "q6_k"
# Or an affine 4-bit weight laid out once as the kernel's tiles read it (kernels/quant_tiles.py):
# the same bytes in another order, multiplied through the tiles at every row count.
TILED = "tiled"
Q6K_TILED = "q6_k-tiled"  # Q6_K blocks laid out so too (the same bytes: quant_tiles.py)
Q6K_VALUES, Q6K_BYTES = 256, 210  # weights a block holds, its bytes
# GGUF's Q4_K blocks laid out as tiles (quant_tiles.py): read as stored, 4.5 bits a weight where an
# MLX affine copy holds 5 (an fp16 scale and bias per 32). Multiplied only through the tiles.
Q4K_TILED = "q4_k-tiled"
Q4K_VALUES, Q4K_BYTES = 256, 144


# How the kernel reads scales and biases (quant_rows.c's SCALE_F32, SCALE_F16, SCALE_BF16).
SCALE_TYPES = {mx.float32: 0, mx.float16: 1, mx.bfloat16: 2}
SCALE_Q4K = 3  # quant_rows.c's: a Q4_K tiled weight's scales live in its tiles


def _scale_view(values: mx.array) -> tuple[np.ndarray, int]:
    """Scales or biases as the kernel reads them, and their type: a view of MLX's buffer where
    they are fp32, fp16 or bf16 (bf16 as its uint16 bits: NumPy has no bf16); else an fp32 copy."""
    if values.dtype not in SCALE_TYPES:
        values = values.astype(mx.float32)
    scale_type = SCALE_TYPES[values.dtype]
    if values.dtype == mx.bfloat16:
        values = mx.view(values, mx.uint16)
    mx.eval(values)
    return np.ascontiguousarray(np.asarray(values)), scale_type


FP16_NORMAL_MIN = 2.0**-14  # below it an fp16 value is subnormal: fewer than 11 significant bits
FP16_MAX = 65504.0


def fp16_scales(scales: mx.array, biases: mx.array) -> tuple[mx.array, mx.array] | None:
    """A layer's fp32 scales and biases as fp16, where every non-zero scale is in fp16's normal
    range (each then kept to 11 significant bits, a weight s·q + b as precise as an fp16 model's:
    on the Qwen pair, all but the Q6_K-born 8-bit down and v projections whose smallest steps are
    subnormal there); else None: the layer keeps its own."""
    if scales.dtype != mx.float32 or biases.dtype != mx.float32:
        return None
    mx.eval(scales, biases)
    size, offset = np.abs(np.asarray(scales)), np.asarray(biases)  # views of MLX's buffers
    smallest = float(size.min(initial=np.inf, where=size > 0))  # no copy of the non-zero ones
    largest = max(float(size.max()), float(offset.max()), -float(offset.min()))
    if smallest < FP16_NORMAL_MIN or largest > FP16_MAX:
        return None
    narrowed = scales.astype(mx.float16), biases.astype(mx.float16)
    mx.eval(*narrowed)
    return narrowed


def scale_floats(values: np.ndarray) -> np.ndarray:
    """A kernel view's scales or biases (fp32, fp16, or bf16 as uint16 bits) as float64."""
    if values.dtype == np.uint16:  # bf16: the top half of an fp32
        return (values.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return values.astype(np.float64)


def unpack_codes(weight: np.ndarray, bits: int, in_dims: int) -> np.ndarray:
    """MLX's packed codes (rows × words: each row a little-endian bit stream, value i at bits
    i·bits…) as one uint8 code a weight. A run of 8/gcd(bits, 8) values fills whole bytes (8 5-bit
    codes: 5 bytes), read as one integer and shifted apart: ~5x numpy's unpackbits and packbits."""
    raw = np.ascontiguousarray(weight).view(np.uint8)
    run = 8 // math.gcd(bits, 8)  # values in a run of whole bytes
    run_bytes = bits * run // 8
    shifts = bits * np.arange(run, dtype=np.uint64)
    mask = np.uint64((1 << bits) - 1)
    out = np.empty((raw.shape[0], in_dims), dtype=np.uint8)
    step = max(1, (1 << 21) // max(1, in_dims))  # bounded temporaries on an embedding
    for r0 in range(0, raw.shape[0], step):
        runs = raw[r0 : r0 + step].reshape(-1, run_bytes).astype(np.uint64)
        word = runs[:, 0].copy()
        for k in range(1, run_bytes):
            word |= runs[:, k] << np.uint64(8 * k)
        out[r0 : r0 + step] = ((word[:, None] >> shifts) & mask).astype(np.uint8).reshape(-1, in_dims)
    return out


class WeightFields(ctypes.Structure):
    """quant_rows.c's struct quant_weight: a weight as one call of several takes it."""

    _fields_ = [
        ("codes", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("biases", ctypes.c_void_p),
        ("n_out", ctypes.c_long),
        ("gs", ctypes.c_long),
        ("bits", ctypes.c_int),
        ("type", ctypes.c_int),
        ("centre", ctypes.c_int),
    ]


@dataclass(frozen=True, eq=False)
class QuantWeight:
    """One affine-quantized W (out × in) as the kernel reads it: codes (4-bit packed, or one byte
    a code), scales and biases (out × groups) of `scale_type` (SCALE_TYPES). `keep` holds the MLX
    arrays the views read."""

    codes: np.ndarray
    scales: np.ndarray
    biases: np.ndarray
    bits: int
    group_size: int
    out_dims: int
    in_dims: int
    keep: tuple = ()
    code_bits: int = 0  # the codes' own width (5 for 5-bit codes held a byte each); 0: `bits`
    scale_type: int = 0  # SCALE_TYPES: fp32, fp16 or bf16 (held as its uint16 bits)
    layout: str = AFFINE  # or Q6K: `codes` holds the blocks (scales and biases are empty); or TILED

    @property
    def centre_log2(self) -> int:
        """log2 of the codes' midpoint, where the int8 path centres them (quant_rows.c)."""
        return (self.code_bits or self.bits) - 1

    @classmethod
    def from_arrays(
        cls,
        weight: mx.array,
        scales: mx.array,
        biases: mx.array,
        group_size: int,
        bits: int,
        code_bits: int = 0,
    ) -> QuantWeight:
        """The kernel's view of MLX's triple (copies only codes of other widths than 4 and 8, and
        scales of other types than fp32, fp16 and bf16); code_bits: the codes' own width where
        narrower than their container (widened_codes)."""
        if bits not in SUPPORTED_BITS:
            raise ValueError(f"{bits}-bit codes are not supported (supported: {SUPPORTED_BITS})")
        mx.eval(weight)
        out_dims, in_dims = weight.shape[0], weight.shape[1] * 32 // bits
        packed = np.asarray(weight)
        if bits in DIRECT_BITS:
            codes, kernel_bits = packed.view(np.uint8), bits
        else:
            codes, kernel_bits = unpack_codes(packed, bits, in_dims), 8
        if scales.dtype != biases.dtype:
            scales, biases = scales.astype(mx.float32), biases.astype(mx.float32)
        (s, scale_type), (b, _) = _scale_view(scales), _scale_view(biases)
        keep = (weight, scales, biases)
        own_bits = code_bits or bits
        return cls(codes, s, b, kernel_bits, group_size, out_dims, in_dims, keep, own_bits, scale_type)

    @classmethod
    def from_tiles(
        cls,
        weight: mx.array,
        scales: mx.array,
        biases: mx.array,
        group_size: int,
        bits: int,
        code_bits: int = 0,
    ) -> QuantWeight:
        """The kernel's view of an affine weight laid out as tiles (quant_tiles.py), read in place:
        `weight` holds `bits`-bit tiles (4, 5, or 8: codes a byte each) shaped as MLX's packed
        codes of that width (out × in·bits/32 words), the scales and biases in the tiles' order."""
        mx.eval(weight)
        out_dims, in_dims = weight.shape[0], weight.shape[1] * 32 // bits
        (s, scale_type), (b, _) = _scale_view(scales), _scale_view(biases)
        codes = np.asarray(weight).view(np.uint8)
        keep = (weight, scales, biases)
        return cls(
            codes, s, b, bits, group_size, out_dims, in_dims, keep, code_bits or bits, scale_type, TILED
        )

    @classmethod
    def from_q6k(cls, blocks: mx.array, in_dims: int) -> QuantWeight:
        """The kernel's view of a Q6_K weight's blocks (uint8, out × in/256·210), read in place."""
        if (
            in_dims % Q6K_VALUES
            or blocks.dtype != mx.uint8
            or blocks.shape[1] != in_dims // Q6K_VALUES * Q6K_BYTES
        ):
            raise ValueError(f"not Q6_K blocks of {in_dims} weights a row: {blocks.shape} {blocks.dtype}")
        mx.eval(blocks)
        none = np.zeros(1, dtype=np.float32)  # a valid address the kernel never reads
        return cls(np.asarray(blocks), none, none, 6, 16, blocks.shape[0], in_dims, (blocks,), 6, 0, Q6K)

    @classmethod
    def from_q4k_tiles(cls, tiles: mx.array, in_dims: int) -> QuantWeight:
        """The kernel's view of Q4_K blocks laid out as tiles (uint8, out × in/256·144), in place."""
        row_bytes = in_dims // Q4K_VALUES * Q4K_BYTES
        if in_dims % Q4K_VALUES or tiles.dtype != mx.uint8 or tiles.shape[1] != row_bytes:
            raise ValueError(f"not Q4_K tiles of {in_dims} weights a row: {tiles.shape} {tiles.dtype}")
        mx.eval(tiles)
        none = np.zeros(1, dtype=np.float32)  # a valid address the kernel never reads
        out_dims = tiles.shape[0]
        return cls(np.asarray(tiles), none, none, 4, 32, out_dims, in_dims, (tiles,), 4, SCALE_Q4K, Q4K_TILED)

    @cached_property
    def addresses(self) -> tuple[int, int, int]:
        """Where codes, scales and biases start: fixed for the view's life, so read once, not once
        a product (NumPy's .ctypes makes an object a call)."""
        return self.codes.ctypes.data, self.scales.ctypes.data, self.biases.ctypes.data

    @cached_property
    def fields(self) -> WeightFields:
        """The weight as quant_rows.c's struct quant_weight."""
        return WeightFields(
            *self.addresses, self.out_dims, self.group_size, self.bits, self.scale_type, self.centre_log2
        )

    @property
    def nbytes(self) -> int:
        """Bytes a product reads: codes, scales and biases (a Q6_K weight's blocks hold all three)."""
        if self.layout in (Q6K, Q6K_TILED, Q4K_TILED):
            return self.codes.nbytes
        return self.codes.nbytes + self.scales.nbytes + self.biases.nbytes

    def fits_kernel(self) -> bool:
        """Whether the kernel takes this shape (a group of 16 or more inputs dividing the row)."""
        g = self.group_size
        return g >= 16 and g % 16 == 0 and self.in_dims % g == 0


def q6k_values(blocks: np.ndarray, in_dims: int) -> np.ndarray:
    """Q6_K blocks (out × in/256·210 bytes) as the weights they hold, float64 (exact: d·scale·(q - 32)
    in ggml's value order, quant_rows.c's q6k_dequantize_tile)."""
    raw = np.ascontiguousarray(blocks).reshape(blocks.shape[0], in_dims // Q6K_VALUES, Q6K_BYTES)
    low, high = raw[..., :128].astype(np.int64), raw[..., 128:192].astype(np.int64)
    scales = raw[..., 192:208].view(np.int8).astype(np.float64)
    d = raw[..., 208:210].copy().view(np.float16).astype(np.float64)  # (out, blocks, 1)
    q = np.empty(raw.shape[:2] + (Q6K_VALUES,), dtype=np.int64)
    for n in range(2):  # each half: 64 bytes of low nibbles, 32 of high bits
        ql, qh, out = low[..., 64 * n : 64 * n + 64], high[..., 32 * n : 32 * n + 32], 128 * n
        for j in range(4):  # values 32j..32j+31 of the half
            nibble = ql[..., 32 * (j % 2) : 32 * (j % 2) + 32] >> (4 * (j // 2)) & 15
            q[..., out + 32 * j : out + 32 * j + 32] = nibble | ((qh >> (2 * j)) & 3) << 4
    step = d * np.repeat(scales, 16, axis=-1)
    return (step * (q - 32)).reshape(blocks.shape[0], in_dims)


def q4k_scales_mins(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 sub-blocks' 6-bit scales and mins of Q4_K blocks' 12 bytes (..., 12) as int64 (..., 8)
    (ggml's get_scale_min_k4)."""
    q = raw.astype(np.int64)
    low_sc, low_m = q[..., 0:4] & 63, q[..., 4:8] & 63
    high_sc = (q[..., 8:12] & 15) | ((q[..., 0:4] >> 6) << 4)
    high_m = (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)
    return np.concatenate([low_sc, high_sc], axis=-1), np.concatenate([low_m, high_m], axis=-1)


def q4k_values(blocks: np.ndarray, in_dims: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K blocks (out × in/256·144 bytes) as the weights they hold, float64, in two parts: the
    codes' (d·sc)·q and the mins' dmin·m a weight (W is their difference, exactly ggml's
    dequantize_row_q4_K; the kernel multiplies the first by rounded rows, the second by exact ones)."""
    raw = np.ascontiguousarray(blocks).reshape(blocks.shape[0], in_dims // Q4K_VALUES, Q4K_BYTES)
    d = raw[..., 0:2].copy().view(np.float16).astype(np.float64)  # (out, blocks, 1)
    dmin = raw[..., 2:4].copy().view(np.float16).astype(np.float64)
    sc, m = q4k_scales_mins(raw[..., 4:16])
    qs = raw[..., 16:].reshape(*raw.shape[:2], 4, 32).astype(np.int64)
    q = np.stack([qs & 15, qs >> 4], axis=3).reshape(*raw.shape[:2], 8, 32)  # sub-block 2p, 2p + 1
    codes = ((d * sc)[..., None] * q).reshape(blocks.shape[0], in_dims)
    mins = np.repeat((dmin * m).reshape(blocks.shape[0], -1), 32, axis=1)
    return codes, mins


@dataclass(frozen=True, eq=False)
class QuantViews:
    """The kernel's views of a layer's planes, kept on the layer (a plain attribute, never a
    parameter) so that a step does not rebuild them."""

    weights: tuple[QuantWeight, ...]


def quant_views(
    planes: Sequence[dict], plane_bits: Sequence[int], group_size: int, code_bits: int = 0
) -> QuantViews | None:
    """The kernel's views of MLX planes ({"weight", "scales", "biases"}), or None where a plane
    has no biases or a shape the kernel does not take (code_bits: as QuantWeight.from_arrays)."""
    weights = []
    for plane, bits in zip(planes, plane_bits, strict=True):
        if plane.get("biases") is None or bits not in SUPPORTED_BITS:
            return None
        view = QuantWeight.from_arrays(
            plane["weight"], plane["scales"], plane["biases"], group_size, bits, code_bits
        )
        if not view.fits_kernel():
            return None
        weights.append(view)
    return QuantViews(tuple(weights))


def q6k_values_mx(blocks: mx.array, in_dims: int) -> mx.array:
    """q6k_values in plain mx ops, fp32 (a Q6_K layer's product where the kernel's is refused: in
    mx.compile)."""
    raw = blocks.reshape(blocks.shape[0], in_dims // Q6K_VALUES, Q6K_BYTES)
    low, high = raw[..., :128].astype(mx.int32), raw[..., 128:192].astype(mx.int32)
    scales = mx.view(raw[..., 192:208], mx.int8).astype(mx.float32)
    d = mx.view(raw[..., 208:210], mx.float16).astype(mx.float32)
    parts = []
    for n in range(2):
        ql, qh = low[..., 64 * n : 64 * n + 64], high[..., 32 * n : 32 * n + 32]
        for j in range(4):
            nibble = (ql[..., 32 * (j % 2) : 32 * (j % 2) + 32] >> (4 * (j // 2))) & 15
            parts.append(nibble | (((qh >> (2 * j)) & 3) << 4))
    step = d * mx.repeat(scales, 16, axis=-1)
    return (step * (mx.concatenate(parts, axis=-1) - 32).astype(mx.float32)).reshape(blocks.shape[0], in_dims)
