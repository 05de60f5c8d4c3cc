"""The compiled quant_rows.c as Python calls it: ctypes bindings, and `times(xs, weight)`, the one
product every layout (MLX's affine triple, Q6_K blocks, either laid out as tiles) goes through.
Building, checking and the rules of which path a layer takes are quant_cpu.py's.
"""

from __future__ import annotations

import ctypes

import numpy as np

from .quant_tiles import tiles_weight
from .quant_weights import Q4K_TILED, Q6K, Q6K_TILED, TILED, QuantWeight

# From this many rows a weight in MLX's layout (or Q6_K blocks as stored) goes through the many-row
# paths (tiles laid out per call, or the fp32 panel); below, codes are unpacked in registers for up
# to 4-8 rows at a time. A weight laid out as tiles at load (quant_tiles.py) takes them at any count.
MANY_ROWS_FROM = 12


_P, _L, _I = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
# x, codes, scales, biases, y; rows, in, out, group; bits, threads; many_from, scale type
_ROWS = [_P] * 5 + [_L] * 4 + [_I] * 2 + [_L, _I]
# x, y, rows, in, threads, count, weights (WeightFields): several weights at once
_MANY = [_P] * 2 + [_L] * 2 + [_I, _L, _P]
# Each call's argument types. Every one returns an int, read where it is called (a product's: 0 where
# it could not get its scratch memory; a tile pack's and unpack's: non-zero where the weight does not fit).
SIGNATURES = {
    "quant_rows": _ROWS,
    "quant_rows_int8": _ROWS + [_I, _I],  # + log2 of the codes' centre, int16 (else int8)
    "quant_rows_int8_many": _MANY,
    "quant_tiled_rows": _MANY + [_I],  # weights laid out as tiles (quant_tiles.py); int16 rows, or int8
    # codes (or Q6_K, Q4_K blocks), out; outputs, inputs; (the codes' container bits;) threads
    "quant_tile_pack": [_P] * 2 + [_L] * 2 + [_I] * 2,
    "quant_q6k_tile_pack": [_P] * 2 + [_L] * 2 + [_I],
    "quant_q4k_tile_pack": [_P] * 2 + [_L] * 2 + [_I],
    "quant_tiled_q6k": [_P] * 3 + [_L] * 3 + [_I] * 2,  # x, tiles, y; rows, in, out; threads, int16
    # x, blocks, y; rows, in, out; threads; many_from; integer activations, int16 (else int8)
    "q6k_rows": [_P] * 3 + [_L] * 3 + [_I, _L, _I, _I],
    "quant_gemm_takes": [_I] * 3,  # bits, log2 of the codes' centre, int16
    "quant_unpack": [_P, _P, _L, _L, _I, _I],  # packed, out; rows, in; bits, threads
}


class QuantKernel:
    """The compiled quant_rows.c: `times(xs, weight, threads)` is xs · Wᵀ. Its calls are `c`'s,
    typed by SIGNATURES (`c.quant_run_parts` is handed to pass_ops.c by address)."""

    def __init__(self, library: ctypes.CDLL, flags: tuple[str, ...]):
        for name, arguments in SIGNATURES.items():
            function = getattr(library, name)  # ctypes keeps it: the types hold for every later call
            function.argtypes, function.restype = arguments, ctypes.c_int
        self.c = library
        self.flags = flags
        self.tiled = bool(library.quant_tiled())
        self.integer_paths = bool(library.quant_integer_paths())  # an AVX2 build: int8 and int16 paths
        self.threaded = bool(library.quant_threaded())

    def unpack(self, packed: np.ndarray, bits: int, in_dims: int, threads: int = 2) -> np.ndarray:
        """As unpack_codes: MLX's packed codes (rows × words) as one uint8 code a weight."""
        raw = np.ascontiguousarray(packed).view(np.uint8)
        out = np.empty((raw.shape[0], in_dims), dtype=np.uint8)
        if self.c.quant_unpack(raw.ctypes.data, out.ctypes.data, raw.shape[0], in_dims, bits, threads) != 0:
            raise ValueError(f"{bits}-bit codes of {in_dims} a row cannot be unpacked")
        return out

    def tiles(self, weight: QuantWeight, wide: bool = False) -> bool:
        """Whether this build multiplies the (affine) weight laid out as tiles, on int8 rows or
        int16 where `wide`: a tiling build, a weight that tiles (quant_tiles.tiles_weight) and codes
        the integer tiles sum exactly (gemm_takes: without VNNI, bytes below 128 only)."""
        return self.tiled and tiles_weight(weight, wide) and self.gemm_takes(weight, wide)

    @property
    def layout_traits(self) -> tuple[bool, bool, bool]:
        """What decides how this build lays weights out: whether it tiles, has integer paths, and
        sums full-byte codes exactly on int8 (VNNI): two machines' builds with the same flags
        (a shared home directory) can differ in these."""
        return self.tiled, self.integer_paths, bool(self.c.quant_gemm_takes(8, 7, 0))

    def gemm_takes(self, weight: QuantWeight, wide: bool = False) -> bool:
        """Whether many rows of integer activations (int8; int16 where `wide`) multiply this weight
        (affine, or Q6_K blocks) through the tiles, else the fp32 panel on the rows as they are."""
        bits = 6 if weight.layout == Q6K else weight.bits  # Q6_K blocks: on int16 only
        return bool(self.c.quant_gemm_takes(bits, weight.centre_log2, int(wide)))

    def times(
        self,
        xs: np.ndarray,
        weight: QuantWeight,
        threads: int = 1,
        many_from: int | None = None,
        int8: bool = False,
        wide: bool = False,
    ) -> np.ndarray:
        """xs (rows × in) · Wᵀ as rows × out fp32 (many_from: rows from which the many-row paths
        run; int8: every row rounded to int8 per 32 inputs where int8_applies, or with `wide` to
        int16, see int8_reference; from many_from rows, only where gemm_takes)."""
        xs = np.ascontiguousarray(xs, dtype=np.float32)
        rows, in_dims = xs.shape
        if in_dims != weight.in_dims:
            raise ValueError(f"x has {in_dims} columns, the weight {weight.in_dims}")
        y = np.empty((rows, weight.out_dims), dtype=np.float32)
        many = MANY_ROWS_FROM if many_from is None else many_from
        if weight.layout in (TILED, Q6K_TILED, Q4K_TILED):  # every row count through the tiles
            if not int8:
                raise ValueError("a weight laid out as tiles multiplies integer activations only")
            if weight.layout == Q6K_TILED:
                blocks = weight.addresses[0]
                done = self.c.quant_tiled_q6k(
                    xs.ctypes.data, blocks, y.ctypes.data, rows, in_dims, weight.out_dims, threads, int(wide)
                )
            else:
                fields = ctypes.addressof(weight.fields)
                done = self.c.quant_tiled_rows(
                    xs.ctypes.data, y.ctypes.data, rows, in_dims, threads, 1, fields, int(wide)
                )
        elif weight.layout == Q6K:  # integer activations: int8 where narrow, else int16 (integer_applies)
            at = (xs.ctypes.data, weight.addresses[0], y.ctypes.data)
            done = self.c.q6k_rows(*at, rows, in_dims, weight.out_dims, threads, many, int(int8), int(wide))
        else:
            arguments = [
                xs.ctypes.data,
                *weight.addresses,
                y.ctypes.data,
                rows,
                in_dims,
                weight.out_dims,
                weight.group_size,
                weight.bits,
                threads,
            ]
            if int8:
                done = self.c.quant_rows_int8(
                    *arguments, many, weight.scale_type, weight.centre_log2, int(wide)
                )
            else:
                done = self.c.quant_rows(*arguments, many, weight.scale_type)
        if done < 1:
            raise MemoryError("the quantized kernel could not get its scratch memory")
        return y
