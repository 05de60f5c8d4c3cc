"""Nested-gear matmul's CPU routes: the active planes dequantized to fp32, then one dense product.

From BLAS_MIN_ROWS rows NumPy's BLAS takes the product (the rule and its measurements are below);
where NumPy is not allowed, MLX's dense matmul where it pays; and a plain quantized linear's
resident fp32 weight goes through BLAS at every row count. The plane helpers that the reference
and the Metal launch (kernels/nested.py, which holds the dispatcher) share live here too.
"""

from __future__ import annotations

import threading
from functools import cache

import mlx.core as mx
import numpy as np

from ._common import as_numpy_rows, blas_threads, rows_as_mx
from .panel_cpu import PanelWeight, panel_copy, panel_kernel
from .route import current_route, route_for

# CPU rule, measured on Linux x86_64 with bench/bench_layers.py nested (bench/results/kernels-rule.txt;
# earlier, git show 824b46b:bench/results/kernels-smollm2.txt): dequantizing a plane costs about
# as much as a few rows of MLX's scalar quantized_matmul, and NumPy's BLAS makes the dense product
# nearly free, so dequantize + BLAS wins from 4 rows at any plane count and layer size (break-even
# near 3 rows), more the more rows.
# MLX's dense matmul costs as much a row as one plane of quantized_matmul: without NumPy, dense
# pays only with ≥ 2 planes (from 8 rows with 2, from 4 with 3).
BLAS_MIN_ROWS = 4
# A resident weight is kept transposed (in × out, contiguous): over the Qwen pair's layer shapes
# OpenBLAS took 0.75-0.93x the time of the out × in layout at 1-16 rows (one row 0.87-0.90x),
# 0.85-1.02x at 24-64 (bench/bench_layers.py threads --layout; bench/results/threads-layout-qwen.txt).
# On it a padded sgemm beats one sgemv a row from 3 rows, so sgemv a row only for 2.
RESIDENT_GEMV_MAX_ROWS = 2
# OpenBLAS's sgemm takes the rows past a multiple of 8 through slow edge kernels. Zero rows up to
# the next multiple made 4-7 rows 1.1-1.5x and 13 rows 1.3x faster over the Qwen pair's layer
# shapes (2 threads), but 9, 10 and 17 rows (one or two past) 0.96-1.02x: only a remainder of 3
# or more is padded (bench/bench_layers.py threads --padding;
# git show 824b46b:bench/results/threads-padding-qwen.txt).
# On the transposed resident weight it held: 4-7 rows 1.14-1.87x, 13 rows 1.30-1.35x
# (bench/results/threads-padding-transposed-qwen.txt).
SGEMM_ROW_MULTIPLE = 8
SGEMM_PAD_MIN_REMAINDER = 3
MX_DENSE_MIN_ROWS = {2: 8, 3: 4}  # planes → rows; more planes than listed: the last entry
DEQUANT_BLOCK = 1 << 20  # weights dequantized at a time by the dense routes
TRANSPOSE_BLOCK = 1 << 20  # bytes of W transposed at a time into a resident copy (about L2)
_SCRATCH = threading.local()


def _active(planes, plane_bits, active: int):
    if not 1 <= active <= min(len(planes), len(plane_bits)):
        raise ValueError(f"active planes must be 1..{len(planes)}, got {active}")
    return list(planes[:active]), tuple(plane_bits[:active])


@cache
def _promoted(*dtypes: mx.Dtype) -> mx.Dtype:
    # MLX's own promotion, read off an empty lazy sum (never evaluated).
    out = mx.zeros((0,), dtypes[0])
    for d in dtypes[1:]:
        out = out + mx.zeros((0,), d)
    return out.dtype


def result_dtype(x: mx.array, planes, bias: mx.array | None = None) -> mx.Dtype:
    """The dtype the reference returns: quantized_matmul promotes x with scales, then + bias."""
    dtypes = [x.dtype] + [p["scales"].dtype for p in planes]
    return _promoted(*dtypes, *([bias.dtype] if bias is not None else []))


def dense_weight(planes, plane_bits, group_size, active) -> mx.array:
    """Σ of the first `active` planes dequantized in fp32 (scales widened first: exact)."""
    weight: mx.array | None = None
    for p, bits in zip(*_active(planes, plane_bits, active), strict=True):
        part = mx.dequantize(
            p["weight"],
            p["scales"].astype(mx.float32),
            p["biases"].astype(mx.float32),
            group_size=group_size,
            bits=bits,
        )
        weight = part if weight is None else weight + part
    assert weight is not None  # _active keeps at least one plane
    return weight


def _scratch(shape: tuple[int, ...], slot: int, dtype=np.float32) -> np.ndarray:
    # Fresh multi-MB temporaries per layer cost page faults that can double a layer's time; a few
    # reused buffers per thread, shape and dtype avoid them.
    buffers = _SCRATCH.__dict__.setdefault("buffers", {})
    key = (shape, slot, np.dtype(dtype).str)
    if key not in buffers:
        if len(buffers) > 32:  # many layer shapes: keep memory bounded
            buffers.clear()
        buffers[key] = np.empty(shape, dtype=dtype)
    return buffers[key]


def _numpy_dense_weight(planes, plane_bits, group_size) -> np.ndarray:
    """dense_weight in NumPy for 4- and 8-bit planes, its columns in the split order (see below).

    Byte views instead of MLX's unpacking loop. MLX packs values from the low bits up and the CPU
    is little-endian, so a plane's bytes are its 8-bit values in order, and a byte's low then
    high nibble are two 4-bit values in order. Writing each group's low nibbles (its even
    columns), then its high nibbles (its odd ones), keeps every pass contiguous: no strided
    interleave. `split_columns` puts x in the same order. The planes' biases are summed first
    (one pass for any plane count). It measured faster than the interleaved order on SmolLM2's
    layers, more so with two planes (bench/bench_layers.py nested;
    git show 824b46b:bench/results/kernels-smollm2.txt).

    The result is a scratch buffer: use it before the next call on this thread.
    """
    rows = planes[0]["weight"].shape[0]
    groups = planes[0]["scales"].shape[1]
    half = group_size // 2
    weight = _scratch((rows, groups, 2, half), 0)
    part = _scratch((rows, groups, 2, half), 1) if len(planes) > 1 else weight
    codes = _scratch((rows, groups, half), 2, np.uint8)
    bias = None
    for index, (p, bits) in enumerate(zip(planes, plane_bits, strict=True)):
        raw = np.asarray(p["weight"]).view(np.uint8)
        scale = np.asarray(p["scales"].astype(mx.float32))[:, :, None]
        out = weight if index == 0 else part
        if bits == 8:
            values = raw.reshape(rows, groups, half, 2)
            np.multiply(values[..., 0], scale, out=out[:, :, 0])
            np.multiply(values[..., 1], scale, out=out[:, :, 1])
        else:
            raw = raw.reshape(rows, groups, half)
            np.bitwise_and(raw, 0xF, out=codes)
            np.multiply(codes, scale, out=out[:, :, 0])
            np.right_shift(raw, 4, out=codes)
            np.multiply(codes, scale, out=out[:, :, 1])
        if index:
            np.add(weight, part, out=weight)
        b = np.asarray(p["biases"].astype(mx.float32))
        bias = b if bias is None else bias + b
    assert bias is not None, "no planes"
    weight += bias[:, :, None, None]
    return weight.reshape(rows, -1)


def split_columns(x: np.ndarray, group_size: int) -> np.ndarray:
    """x's columns in _numpy_dense_weight's order: per group, its even columns, then its odd ones."""
    lead, width = x.shape[:-1], x.shape[-1]
    grouped = x.reshape(*lead, width // group_size, group_size // 2, 2)
    return np.ascontiguousarray(np.swapaxes(grouped, -1, -2)).reshape(*lead, width)


def _row_blocks(out_dims: int, in_dims: int) -> list[tuple[int, int]]:
    # Dequantize DEQUANT_BLOCK weights at a time: a 4 MB fp32 block stays in cache while its
    # planes are summed and multiplied. A whole 18944×3584 layer at once falls out of cache,
    # costs several times more per weight, and takes 271 MB of memory.
    step = max(8, DEQUANT_BLOCK // in_dims)
    return [(r, min(r + step, out_dims)) for r in range(0, out_dims, step)]


def _rows_of(planes, r0: int, r1: int) -> list[dict]:
    return [{k: p[k][r0:r1] for k in ("weight", "scales", "biases")} for p in planes]


def _blas_matmul(x32: mx.array, planes, plane_bits, group_size, blocks) -> mx.array | None:
    xs = as_numpy_rows(x32)
    if xs is None:
        return None
    out = np.empty((xs.shape[0], blocks[-1][1]), dtype=np.float32)
    byte_aligned = all(bits in (4, 8) for bits in plane_bits)
    if byte_aligned:
        xs = split_columns(xs, group_size)  # the weight's column order (see _numpy_dense_weight)
    for r0, r1 in blocks:
        rows = _rows_of(planes, r0, r1)
        if byte_aligned:
            weight = _numpy_dense_weight(rows, plane_bits, group_size)
        else:
            dense = dense_weight(rows, plane_bits, group_size, len(planes))
            mx.eval(dense)
            weight = np.asarray(dense)
        with blas_threads(xs.shape[0]):
            out[:, r0:r1] = sgemm_rows(xs, weight)
    return rows_as_mx(out, x32)


def dense_nested_matmul(
    x, planes, plane_bits, group_size, active, bias=None, use_numpy: bool = True
) -> mx.array:
    """Multi-row CPU route: active planes as fp32 weight blocks, one matmul each (NumPy or MLX)."""
    used, bits = _active(planes, plane_bits, active)
    blocks = _row_blocks(used[0]["scales"].shape[0], x.shape[-1])
    x32 = x.astype(mx.float32)
    y = _blas_matmul(x32, used, bits, group_size, blocks) if use_numpy else None
    if y is None:
        parts = [
            x32 @ dense_weight(_rows_of(used, r0, r1), bits, group_size, len(used)).T for r0, r1 in blocks
        ]
        y = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=-1)
    out_dtype = result_dtype(x, used)
    y = y if y.dtype == out_dtype else y.astype(out_dtype)
    return y if bias is None else y + bias


def _mx_dense_floor(active: int) -> int | None:
    if active < min(MX_DENSE_MIN_ROWS):
        return None
    return MX_DENSE_MIN_ROWS[min(active, max(MX_DENSE_MIN_ROWS))]


def cpu_route(rows: int, active: int) -> str:
    """Which CPU route the rule picks under the route's multi_row: "blas", "dense" (MLX matmul)
    or "reference"."""
    multi_row = current_route().multi_row
    if multi_row == "reference":
        return "reference"
    if multi_row == "numpy-blas" and rows >= BLAS_MIN_ROWS:
        return "blas"
    floor = _mx_dense_floor(active)
    return "dense" if floor is not None and rows >= floor else "reference"


def describe_cpu_rule() -> str:
    """The CPU rule in words, as the current MLXSWITCH_KERNELS setting applies it (on a GPU: as a
    CPU would)."""
    route = current_route()
    multi_row = route.multi_row if route.backend == "cpu" else route_for("cpu", route.kernels).multi_row
    if multi_row == "reference":
        return "reference at every row count (MLXSWITCH_KERNELS=reference)"
    if multi_row == "numpy-blas":
        return f"dense fp32 + NumPy BLAS from {BLAS_MIN_ROWS} rows, any plane count"
    top = max(MX_DENSE_MIN_ROWS)
    floors = ", ".join(
        f"{p}{'+' if p == top else ''} planes from {r} rows" for p, r in sorted(MX_DENSE_MIN_ROWS.items())
    )
    return f"dense fp32 + MLX matmul: {floors}; fewer planes: reference"


def resident_copy(weight_rows, out_dims: int, in_dims: int) -> np.ndarray | PanelWeight:
    """The resident fp32 copy of W the route multiplies: panels where the route has the panel
    kernel, else Wᵀ for NumPy's BLAS (`weight_rows(r0, r1)`: rows r0..r1 of W as fp32 NumPy)."""
    if current_route().resident_product == "panel-kernel":
        return panel_copy(weight_rows, out_dims, in_dims)
    return transposed_copy(weight_rows, out_dims, in_dims)


def resident_dense_matmul(
    x: mx.array, weight: np.ndarray | PanelWeight, bias: mx.array | None = None
) -> mx.array | None:
    """x · Wᵀ (+ bias) on a resident fp32 copy (resident_copy): panels by the panel kernel, or Wᵀ
    (in × out, contiguous; see RESIDENT_GEMV_MAX_ROWS) by NumPy's BLAS. The CPU route at every row
    count for a plain quantized linear (MLX's quantized mat-vec is a scalar loop on x86; see
    bench/results/row-routes-qwen1.5b.txt). None where evaluation is refused (mx.compile)."""
    xs = as_numpy_rows(x)
    if xs is None:
        return None
    if isinstance(weight, PanelWeight):
        kernel = panel_kernel()
        assert kernel is not None, "panels are built only where the kernel is"
        y = rows_as_mx(kernel.times(xs, weight, current_route().blas_threads), x)
    else:
        with blas_threads(xs.shape[0]):
            y = rows_as_mx(resident_rows_times(xs, weight), x)
    y = y if y.dtype == x.dtype else y.astype(x.dtype)
    return y if bias is None else y + bias


def resident_rows_times(xs: np.ndarray, weight_t: np.ndarray) -> np.ndarray:
    """xs · Wᵀ on the kept Wᵀ: one sgemv a row for 2..RESIDENT_GEMV_MAX_ROWS rows, else one
    (padded) sgemm."""
    rows = xs.shape[0]
    if 1 < rows <= RESIDENT_GEMV_MAX_ROWS:
        out = np.empty((rows, weight_t.shape[1]), dtype=np.result_type(xs, weight_t))
        for i, row in enumerate(xs):
            np.matmul(row, weight_t, out=out[i])
        return out
    return _padded_product(xs, weight_t)


def transposed_copy(weight_rows, out_dims: int, in_dims: int) -> np.ndarray:
    """A resident fp32 Wᵀ (in × out, contiguous) built a block of W's rows at a time:
    `weight_rows(r0, r1)` gives rows r0..r1 of W as fp32 NumPy. Each block is transposed while it
    is in cache, and no whole fp32 W is ever held beside the result."""
    weight_t = np.empty((in_dims, out_dims), dtype=np.float32)
    step = max(8, TRANSPOSE_BLOCK // (4 * in_dims))
    for r0 in range(0, out_dims, step):
        r1 = min(r0 + step, out_dims)
        weight_t[:, r0:r1] = weight_rows(r0, r1).T
    return weight_t


def _padded_product(xs: np.ndarray, right: np.ndarray) -> np.ndarray:
    """xs · right as one sgemm, xs zero-padded to a multiple of SGEMM_ROW_MULTIPLE rows where 3
    or more rows are past one (see there)."""
    rows = xs.shape[0]
    if rows == 1 or rows % SGEMM_ROW_MULTIPLE < SGEMM_PAD_MIN_REMAINDER:
        return xs @ right
    wide = np.zeros((-(-rows // SGEMM_ROW_MULTIPLE) * SGEMM_ROW_MULTIPLE, xs.shape[1]), dtype=xs.dtype)
    wide[:rows] = xs
    return (wide @ right)[:rows]


def sgemm_rows(xs: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """xs · Wᵀ (W: out × in, as a nested gear's dequantized block is) as one padded sgemm."""
    return _padded_product(xs, weight.T)
