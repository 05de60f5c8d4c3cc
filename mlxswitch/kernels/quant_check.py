"""The quantized kernel's check (quant_rows.c, built by quant_cpu.py): before any model uses a
build, its products equal a float64 product of the dequantized weights (integer activations: of
the rows as the kernel rounds them) at every bit width, group size, scale type, layout (MLX's
triple, GGUF's Q6_K blocks, tiles of either and of Q4_K blocks) and row grouping, on 1 and 2
threads; else the first difference, in words for `mlxswitch doctor`. The references here are also
what the tests compare the kernel with.
"""

from __future__ import annotations

import itertools

import mlx.core as mx
import numpy as np

from .quant_library import QuantKernel
from .quant_tiles import (
    q4k_tiled_values_mx,
    q6k_tiled_values_mx,
    tiled_q4k_weight,
    tiled_q6k_weight,
    tiled_values_mx,
    tiled_weight,
)
from .quant_weights import (
    Q4K_BYTES,
    Q4K_VALUES,
    Q6K_BYTES,
    Q6K_VALUES,
    SCALE_TYPES,
    SUPPORTED_BITS,
    QuantWeight,
    WeightFields,
    q4k_values,
    q6k_values,
    scale_floats,
    unpack_codes,
)

INT8_BLOCK = 32  # inputs sharing one int8 step (quant_rows.c's BLOCK)


def _random_weight(rng, out_dims: int, in_dims: int, bits: int, group_size: int, scale_dtype=mx.float32):
    """A random quantized weight (scales and biases of `scale_dtype`) and its truth: s·q + b in
    float64 (q: MLX's own unpacking of the codes)."""
    w = mx.array(rng.standard_normal((out_dims, in_dims)).astype(np.float32))
    q, s, b = mx.quantize(w, group_size=group_size, bits=bits)
    s, b = s.astype(scale_dtype), b.astype(scale_dtype)
    ones, zeros = mx.ones(s.shape, mx.float32), mx.zeros(s.shape, mx.float32)
    codes = np.array(mx.dequantize(q, ones, zeros, group_size=group_size, bits=bits)).astype(np.float64)
    view = QuantWeight.from_arrays(q, s, b, group_size, bits)
    spread = np.repeat(scale_floats(view.scales), group_size, axis=1)
    return view, codes * spread + np.repeat(scale_floats(view.biases), group_size, axis=1)


def rounded_rows(xs: np.ndarray, wide: bool = False) -> np.ndarray:
    """xs as the integer paths round it, in float64: per block of 32 inputs, step = peak/127
    (wide: peak/32767), codes = rint(x·(127/peak)) in fp32, as quant_rows.c's quantize_rows."""
    levels = np.float32(32767 if wide else 127)
    blocks = xs.astype(np.float32).reshape(xs.shape[0], -1, INT8_BLOCK)
    peak = np.abs(blocks).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inverse = np.where(peak > 0, levels / peak, np.float32(0)).astype(np.float32)
    step = (peak / levels).astype(np.float32)
    return (np.rint(blocks * inverse) * step.astype(np.float64)).reshape(xs.shape)


def int8_reference(xs: np.ndarray, weight: QuantWeight, truth: np.ndarray, wide: bool = False) -> np.ndarray:
    """What the int8 path computes, in float64: x rounded per block of 32 inputs as quant_rows.c
    rounds it (step = peak/127, codes = rint(x·(127/peak)) in fp32; wide: 32767 for int16), times
    the centred codes s·(q - 8), plus the biases (taking 8·s) times the exact sums of x. `truth` is
    W = s·q + b in float64."""
    g = weight.group_size
    rounded = rounded_rows(xs, wide)
    centre = float(1 << weight.centre_log2)
    bias = np.repeat(scale_floats(weight.biases) + centre * scale_floats(weight.scales), g, axis=1)
    return rounded @ (truth - bias).T + xs.astype(np.float64) @ bias.T


def check_kernel(kernel: QuantKernel) -> str | None:
    """None when the kernel equals a float64 product of MLX's dequantized W on odd shapes, at
    every bit width, group size, scale type and row grouping, on 1 and 2 threads, by both paths,
    and unpacks every narrow width as unpack_codes does; else what differed."""
    rng = np.random.default_rng(0)
    for bits in SUPPORTED_BITS:
        packed = rng.integers(0, 1 << 32, size=(67, 3 * bits), dtype=np.uint32)  # rows of 96 codes
        if not np.array_equal(kernel.unpack(packed, bits, 96), unpack_codes(packed, bits, 96)):
            return f"{bits}-bit codes unpacked differently from unpack_codes"
    for bits in SUPPORTED_BITS:
        for group_size in (32, 64):
            for scale_dtype in SCALE_TYPES:
                # a whole tree of 8 int8 blocks and a part of one
                weight, truth = _random_weight(rng, 19, 256 + group_size, bits, group_size, scale_dtype)
                every_row = scale_dtype == mx.float32  # the other types: a row, a tile, the panel
                for rows in (1, 2, 3, 4, 5, 6, 7, 8, 9, 13) if every_row else (1, 3, 13):
                    mismatch = _check_rows(kernel, rng, weight, truth, rows)
                    if mismatch is not None:
                        where = f"{bits}-bit, group {group_size}, {scale_dtype} scales, {rows} rows"
                        return f"{mismatch}, {where}"
    return check_q6k(kernel, rng) or check_tiles(kernel, rng)


def check_tiles(kernel: QuantKernel, rng) -> str | None:
    """None when weights laid out as tiles (where the build tiles: quant_tiles.py) hold MLX's W and
    multiply int8 rows (int16 too, for 4-bit codes) as int8_reference says at every row count, on 1
    and 2 threads, each row's bits independent of the rows beside it; else what differed."""
    if not kernel.tiled:
        return None
    for bits, group_size, scale_dtype in itertools.product((4, 5, 8), (32, 64), SCALE_TYPES):
        weight, truth = _random_weight(rng, 32, 256 + group_size, bits, group_size, scale_dtype)
        if not kernel.tiles(weight):  # full bytes without VNNI: such a layer keeps MLX's layout
            continue
        tiled = tiled_weight(kernel, weight)
        where = f"{bits}-bit tiles, group {group_size}, {scale_dtype} scales"
        codes, scales, biases = tiled.keep
        if _differs(np.asarray(tiled_values_mx(codes, scales, biases, group_size)), truth):
            return f"{where}: the layout's values differed from MLX's"
        wides = (False, True) if bits == 4 else (False,)
        mismatch = _check_tiled_rows(
            kernel, rng, tiled, lambda xs, wide, w=weight, t=truth: int8_reference(xs, w, t, wide), wides
        )
        if mismatch is not None:
            return f"{where}: {mismatch}"
    return _check_q6k_tiles(kernel, rng)


def _check_q6k_tiles(kernel: QuantKernel, rng) -> str | None:
    """check_tiles for Q6_K blocks laid out as tiles, against the float64 product of their values."""
    blocks, truth = _random_q6k(rng, 32, 512)
    tiled = tiled_q6k_weight(kernel, blocks)
    if _differs(np.asarray(q6k_tiled_values_mx(tiled.keep[0], 512)), truth):
        return "Q6_K tiles: the layout's values differed from the blocks'"
    mismatch = _check_tiled_rows(
        kernel, rng, tiled, lambda xs, wide: rounded_rows(xs, wide) @ truth.T, (False, True)
    )
    return f"Q6_K tiles: {mismatch}" if mismatch is not None else _check_q4k_tiles(kernel, rng)


def random_q4k_blocks(rng, out_dims: int, in_dims: int) -> np.ndarray:
    """Random Q4_K blocks (every code, scale and min; d and dmin normal fp16), out × in/256·144."""
    blocks = rng.integers(0, 256, size=(out_dims, in_dims // Q4K_VALUES, Q4K_BYTES), dtype=np.uint8)
    for at in (0, 2):  # d, dmin
        half = (np.abs(rng.standard_normal(blocks.shape[:2])) * 1e-2 + 1e-3).astype(np.float16)
        blocks[..., at : at + 2] = half.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(out_dims, -1)


def _check_q4k_tiles(kernel: QuantKernel, rng) -> str | None:
    """check_tiles for Q4_K blocks laid out as tiles, against the float64 product of their values,
    alone and in one call beside an affine tiled weight (a Q4_K_M layer's q, k and v)."""
    blocks = random_q4k_blocks(rng, 32, 512)
    codes, mins = q4k_values(blocks, 512)

    def reference(xs: np.ndarray, wide: bool) -> np.ndarray:  # the codes on rounded rows, mins on exact
        return rounded_rows(xs, wide) @ codes.T - xs.astype(np.float64) @ mins.T

    tiled = tiled_q4k_weight(kernel, mx.array(blocks), 512)
    if tiled is None:
        return "Q4_K tiles: 32 x 512 blocks did not tile"
    if _differs(np.asarray(q4k_tiled_values_mx(tiled.keep[0], 512)), codes - mins):
        return "Q4_K tiles: the layout's values differed from the blocks'"
    mismatch = _check_tiled_rows(kernel, rng, tiled, reference, (False, True))
    if mismatch is not None:
        return f"Q4_K tiles: {mismatch}"
    affine, affine_truth = _random_weight(rng, 16, 512, 4, 32, mx.float16)
    beside = tiled_weight(kernel, affine)
    xs = rng.standard_normal((3, 512)).astype(np.float32)
    y = np.empty((3, 48), dtype=np.float32)
    fields = (WeightFields * 2)(tiled.fields, beside.fields)
    done = kernel.c.quant_tiled_rows(xs.ctypes.data, y.ctypes.data, 3, 512, 2, 2, fields, 0)
    if (
        done < 1
        or _differs(y[:, :32], reference(xs, False))
        or _differs(y[:, 32:], int8_reference(xs, affine, affine_truth))
    ):
        return "Q4_K tiles beside affine ones in one call differed"
    return None


def _check_tiled_rows(kernel: QuantKernel, rng, tiled: QuantWeight, reference, wides) -> str | None:
    """None when a laid-out weight times 1-13 random rows (int8, or int16 where wide) equals
    `reference(xs, wide)` on 1 and 2 threads, a row's bits the same alone; else what differed."""
    for rows, wide in itertools.product((1, 2, 3, 5, 8, 9, 13), wides):
        xs = rng.standard_normal((rows, tiled.in_dims)).astype(np.float32)
        want, kind = reference(xs, wide), "int16" if wide else "int8"
        for threads in (1, 2):
            got = kernel.times(xs, tiled, threads, int8=True, wide=wide)
            if _differs(got, want):
                return f"{rows} {kind} rows on {threads} threads differed"
        if not np.array_equal(got[-1:], kernel.times(xs[-1:], tiled, 1, int8=True, wide=wide)):
            return f"a row's bits depended on the rows beside it ({kind})"
    return None


def _random_q6k(rng, out_dims: int, in_dims: int) -> tuple[QuantWeight, np.ndarray]:
    """Random Q6_K blocks (every code, scale and sign; d a normal fp16) and their truth in float64."""
    blocks = rng.integers(0, 256, size=(out_dims, in_dims // Q6K_VALUES, Q6K_BYTES), dtype=np.uint8)
    d = (rng.standard_normal(blocks.shape[:2]) * 1e-2).astype(np.float16)
    blocks[..., 208:] = d.view(np.uint8).reshape(*blocks.shape[:2], 2)
    blocks = blocks.reshape(out_dims, -1)
    return QuantWeight.from_q6k(mx.array(blocks), in_dims), q6k_values(blocks, in_dims)


def check_q6k(kernel: QuantKernel, rng) -> str | None:
    """None when Q6_K products equal a float64 product of the blocks' values (integer activations:
    of the rounded rows, int8 or int16) at every row grouping, on 1 and 2 threads, by every path;
    else what differed."""
    for out_dims, in_dims in ((19, 256), (13, 768)):
        weight, truth = _random_q6k(rng, out_dims, in_dims)
        for rows in (1, 2, 3, 4, 5, 9, 13):
            xs = rng.standard_normal((rows, in_dims)).astype(np.float32)
            want = {"fp32": xs.astype(np.float64) @ truth.T}
            for kind, wide in (("int8", False), ("int16", True)):
                want[kind] = rounded_rows(xs, wide=wide) @ truth.T
            for integer, wide in ((False, False), (True, False), (True, True)):
                for many_from, threads in ((1 << 30, 1), (1 << 30, 2), (1, 2)):
                    got = kernel.times(xs, weight, threads, many_from, int8=integer, wide=wide)
                    path = "fp32"  # the panel, or every path of a build without integer ones
                    if integer and kernel.integer_paths:  # many rows: the tiles, on int16
                        path = "int16" if wide or rows >= many_from else "int8"
                    if _differs(got, want[path]):
                        return f"Q6_K {out_dims}x{in_dims}, {rows} rows, {path} on {threads} threads differed"
    return None


def _differs(got: np.ndarray, want: np.ndarray) -> bool:
    """Whether a product is off its float64 truth by more than fp32 rounding (1e-5 of its size)."""
    return got.shape != want.shape or float(np.abs(got - want).max()) > 1e-5 * max(
        float(np.abs(want).max()), 1e-30
    )


def _check_rows(kernel: QuantKernel, rng, weight: QuantWeight, truth: np.ndarray, rows: int) -> str | None:
    """None when `rows` random rows times the weight equal their float64 product by both paths on
    1 and 2 threads, and the int8 path its reference; else which differed."""
    xs = rng.standard_normal((rows, weight.in_dims)).astype(np.float32)
    want = xs.astype(np.float64) @ truth.T
    for many_from in (1 << 30, 1):
        for threads in (1, 2):
            got = kernel.times(xs, weight, threads, many_from)
            if _differs(got, want):
                path = "panel" if many_from == 1 else "register"
                return f"the {path} path on {threads} threads differed from a float64 product"
    if weight.group_size % INT8_BLOCK == 0:  # every code width, whichever the route sends
        for wide in (False, True):
            rounded = int8_reference(xs, weight, truth, wide)
            for many_from, threads in ((1 << 30, 1), (1 << 30, 2), (1, 1), (1, 2)):
                got = kernel.times(xs, weight, threads, many_from, int8=True, wide=wide)
                # else fp32 rows: the panel, or every path of a build without them
                integer = kernel.integer_paths and (rows < many_from or kernel.gemm_takes(weight, wide))
                if _differs(got, rounded if integer else want):
                    path = "register" if rows < many_from else "tile" if integer else "panel"
                    kind = "int16" if wide else "int8"
                    return f"{kind} activations by the {path} path on {threads} threads differed"
    return None
