"""Nested-gear matmul x · (Σ active planes)ᵀ: reference, Metal mat-vec, dispatcher.

The CPU routes the dispatcher picks, and their rule, are in nested_cpu.py; a plain quantized
linear's product (quantized_matmul_rows) is here because it goes through the dispatcher.
"""

from __future__ import annotations

import warnings

import mlx.core as mx

from ..resources import metal_source
from ._common import KernelCheck, relative_max_error
from .nested_cpu import (
    _active,
    _promoted,
    cpu_route,
    dense_nested_matmul,
    describe_cpu_rule,
    result_dtype,
)
from .quant_linear import quant_matmul
from .quant_weights import quant_views
from .route import current_route

# Bump whenever metal/nested_qmv.metal or the launch changes: MLX caches compiled libraries by name.
KERNEL_VERSION = "v1"
KERNEL_PREFIX = "mlxswitch_nested_qmv"
SUPPORTED_BITS = (2, 3, 4, 5, 6, 8)
SUPPORTED_GROUP_SIZES = (32, 64, 128)
RESULTS_PER_SIMD = 4  # output rows a SIMD group owns: each x chunk in registers feeds 4 rows
SIMDS_PER_GROUP = 2
BLOCK_ROWS = RESULTS_PER_SIMD * SIMDS_PER_GROUP
# The fused kernel is a mat-vec: one x row per grid z, weights re-read per row. Past a few rows
# MLX's tiled quantized matmul (one call per plane) reuses weights better. Unmeasured on a Mac.
METAL_MAX_ROWS = 4
_FLOAT_DTYPES = (mx.float32, mx.float16, mx.bfloat16)
# First-use tolerance on max |kernel − truth| / max |truth|: fp32 is the summation order; halves
# are one output rounding (2^-8 relative for bf16) plus the reference's own.
_TOLERANCE = {mx.float32: 1e-4, mx.float16: 4e-3, mx.bfloat16: 2e-2}


def reference_nested_matmul(x, planes, plane_bits, group_size, active, bias=None) -> mx.array:
    """x · (Σ first `active` dequantized planes)ᵀ (+ bias): one mx.quantized_matmul per plane."""
    out: mx.array | None = None
    for plane, bits in zip(*_active(planes, plane_bits, active), strict=True):
        y = mx.quantized_matmul(
            x,
            plane["weight"],
            plane["scales"],
            plane["biases"],
            transpose=True,
            group_size=group_size,
            bits=bits,
        )
        out = y if out is None else out + y
    assert out is not None  # _active keeps at least one plane
    return out if bias is None else out + bias


# -- the fused Metal kernel -------------------------------------------------------------------


def kernel_name(n_planes: int, has_bias: bool) -> str:
    """Unique name of one variant (MLX adds the template values and dtypes to it)."""
    return f"{KERNEL_PREFIX}_p{n_planes}{'_bias' if has_bias else ''}_{KERNEL_VERSION}"


def kernel_source(n_planes: int, has_bias: bool) -> tuple[str, str]:
    """(header, body) for `mx.fast.metal_kernel`: one line per plane, the bias line if any."""
    text = metal_source("nested_qmv")
    rest, bias_line = text.split("// ---- bias ----", 1)
    rest, plane_line = rest.split("// ---- plane ----", 1)
    rest, body = rest.split("// ---- body ----", 1)
    header = rest.split("// ---- header ----", 1)[1]
    planes = "\n  ".join(plane_line.strip().replace("{p}", str(i)) for i in range(n_planes))
    body = body.replace("/*PLANES*/", planes)
    return header, body.replace("/*BIAS*/", bias_line.strip() if has_bias else "")


def input_names(n_planes: int, has_bias: bool) -> list[str]:
    """The kernel's inputs, in launch order."""
    names = ["x"] + [f"{k}{i}" for i in range(n_planes) for k in ("w", "scales", "biases")]
    return names + (["bias"] if has_bias else [])


def make_kernel(n_planes: int, has_bias: bool):
    """Build one variant; building only records the source, so this works on any backend."""
    header, body = kernel_source(n_planes, has_bias)
    return mx.fast.metal_kernel(
        name=kernel_name(n_planes, has_bias),
        input_names=input_names(n_planes, has_bias),
        output_names=["out"],
        source=body,
        header=header,
    )


def launch(kernel, x, planes, plane_bits, group_size, bias=None, verbose=False) -> mx.array:
    """Run a built variant on all of `planes`, x (..., in_dims); Metal only, or export tracing."""
    x2 = x.reshape(-1, x.shape[-1])
    rows, out_dims = x2.shape[0], planes[0]["scales"].shape[0]
    out_dtype = result_dtype(x, planes, bias)
    inputs = [x2] + [p[k] for p in planes for k in ("weight", "scales", "biases")]
    template = (
        [("T", out_dtype)]
        + [(f"BITS{i}", b) for i, b in enumerate(plane_bits)]
        + [("GROUP_SIZE", group_size), ("RESULTS", RESULTS_PER_SIMD)]
    )
    threads = 32 * SIMDS_PER_GROUP
    # dispatchThreads: the grid counts threads; y walks blocks of BLOCK_ROWS outputs, z the x rows.
    y = kernel(
        inputs=inputs + ([bias] if bias is not None else []),
        template=template,
        grid=(threads, -(-out_dims // BLOCK_ROWS), rows),
        threadgroup=(threads, 1, 1),
        output_shapes=[(rows, out_dims)],
        output_dtypes=[out_dtype],
        verbose=verbose,
    )[0]
    return y.reshape(*x.shape[:-1], out_dims)


_KERNELS: dict = {}  # (planes, bias?) → the built variant


def kernel_available() -> bool:
    """Whether the fused Metal kernel can run on this machine (the route found Metal)."""
    return current_route().metal


def _kernel(n_planes: int, has_bias: bool):
    if not kernel_available():
        raise RuntimeError("the fused nested-gear kernel needs the Metal backend")
    key = (n_planes, has_bias)
    if key not in _KERNELS:
        _KERNELS[key] = make_kernel(n_planes, has_bias)
    return _KERNELS[key]


def metal_nested_matmul(x, planes, plane_bits, group_size, active, bias=None) -> mx.array:
    """The fused Metal mat-vec over the first `active` planes (Metal only)."""
    if not kernel_available():
        raise RuntimeError("the fused nested-gear kernel needs the Metal backend")
    used, bits = _active(planes, plane_bits, active)
    return launch(_kernel(len(used), bias is not None), x, used, bits, group_size, bias)


def synthetic_planes(out_dims, in_dims, plane_bits, group_size, dtype=mx.float32, seed=0):
    """Residual planes q(W), q(W − W₁), … of a random W, scales/biases cast to `dtype`."""
    key = mx.random.key(seed)
    residual = mx.random.normal((out_dims, in_dims), key=key) * 0.05
    planes = []
    for bits in plane_bits:
        q, s, b = mx.quantize(residual, group_size=group_size, bits=bits)
        s, b = s.astype(dtype), b.astype(dtype)
        residual = residual - mx.dequantize(
            q, s.astype(mx.float32), b.astype(mx.float32), group_size=group_size, bits=bits
        )
        planes.append({"weight": q, "scales": s, "biases": b})
    mx.eval(planes)
    return planes


def fp32_truth(x, planes, plane_bits, group_size, active, bias=None) -> mx.array:
    """The reference on fp32 copies of every input: the exact answer for the rounded inputs."""
    wide = [
        {**p, "scales": p["scales"].astype(mx.float32), "biases": p["biases"].astype(mx.float32)}
        for p in planes
    ]
    return reference_nested_matmul(
        x.astype(mx.float32),
        wide,
        plane_bits,
        group_size,
        active,
        None if bias is None else bias.astype(mx.float32),
    )


def check_kernel_case(
    run,
    plane_bits,
    group_size,
    x_dtype,
    scale_dtype,
    bias_dtype,
    out_dims=2 * BLOCK_ROWS + 3,
    in_dims=None,
    rows=3,
    seed=0,
) -> float:
    """Relative max error of `run(x, planes, bits, gs, active, bias)` against the fp32 truth."""
    in_dims = in_dims or 384 + group_size  # > 32 chunks: some lanes take 2 chunks, some 3
    planes = synthetic_planes(out_dims, in_dims, plane_bits, group_size, scale_dtype, seed)
    key = mx.random.key(seed + 1)
    x = mx.random.normal((rows, in_dims), key=key).astype(x_dtype)
    bias = None if bias_dtype is None else mx.random.normal((out_dims,), key=key).astype(bias_dtype)
    n = len(plane_bits)
    got = run(x, planes, plane_bits, group_size, n, bias)
    return relative_max_error(got, fp32_truth(x, planes, plane_bits, group_size, n, bias))


# (plane bits, group size, x dtype, scale dtypes, bias dtype, out_dims % BLOCK_ROWS) → passed?
_CHECKED: dict[tuple, bool] = {}


def _check_key(x, planes, bits, group_size, bias) -> tuple:
    return (
        bits,
        group_size,
        x.dtype,
        tuple(p["scales"].dtype for p in planes),
        tuple(p["biases"].dtype for p in planes),
        None if bias is None else bias.dtype,
        planes[0]["scales"].shape[0] % BLOCK_ROWS,
    )


def _first_use_check(key: tuple) -> bool:
    # The kernel cannot run where it is developed (Linux): on a user's Mac the first call per
    # shape class and dtypes compares it with the fp32 truth on a small case of the same class
    # (same planes, dtypes, bias, output tail), and falls back to the reference for good on a
    # mismatch or an error rather than decode on wrong numbers. The case never touches the
    # caller's arrays, so it can be evaluated even while mx.compile traces the caller.
    bits, group_size, x_dtype, scale_dtypes, _, bias_dtype, tail = key
    try:
        error = check_kernel_case(
            metal_nested_matmul,
            bits,
            group_size,
            x_dtype,
            scale_dtypes[0],
            bias_dtype,
            out_dims=2 * BLOCK_ROWS + tail,
        )
        problem = f"max relative error {error:.2e}"
        out_dtype = _promoted(x_dtype, *scale_dtypes, *([bias_dtype] if bias_dtype else []))
        if error <= _TOLERANCE[out_dtype]:
            return True
    except Exception as exc:  # a compile error or a pipeline limit: never crash decoding
        problem = str(exc).splitlines()[0][:160]
    warnings.warn(
        f"fused nested-gear kernel disabled for planes {bits}, group size {group_size}, "
        f"{x_dtype} ({problem}); using quantized_matmul",
        RuntimeWarning,
        stacklevel=3,
    )
    return False


def _kernel_fits(x, planes, bits, group_size, bias, rows) -> bool:
    return (
        rows <= METAL_MAX_ROWS
        and len(planes) >= 2
        and group_size in SUPPORTED_GROUP_SIZES
        and all(b in SUPPORTED_BITS for b in bits)
        and x.dtype in _FLOAT_DTYPES
        and all(
            p["weight"].dtype == mx.uint32
            and p["weight"].ndim == 2
            and p["scales"].dtype in _FLOAT_DTYPES
            and p["biases"].dtype in _FLOAT_DTYPES
            for p in planes
        )
        and (bias is None or bias.dtype in _FLOAT_DTYPES)
    )


def nested_matmul(x, planes, plane_bits, group_size, active, bias=None) -> mx.array:
    """x · (Σ first `active` planes)ᵀ (+ bias) by the fastest route that is right on this device."""
    # The route decides (kernels/route.py). GPU: the fused mat-vec for 2+ planes and
    # ≤ METAL_MAX_ROWS rows once it passed its check, else the reference. CPU: cpu_route's rule;
    # its NumPy route evaluates x (a sync point) and passes no gradient, so MLXSWITCH_KERNELS=mx
    # keeps a model lazy and differentiable.
    route = current_route()
    if route.force_reference:
        return reference_nested_matmul(x, planes, plane_bits, group_size, active, bias)
    rows = x.size // x.shape[-1]
    if route.on_gpu:
        # One plane is MLX's own quantized mat-vec already: nothing to fuse.
        used, bits = _active(planes, plane_bits, active)
        if route.nested == "metal-kernel" and _kernel_fits(x, used, bits, group_size, bias, rows):
            key = _check_key(x, used, bits, group_size, bias)
            if key not in _CHECKED:
                _CHECKED[key] = _first_use_check(key)
            if _CHECKED[key]:
                return metal_nested_matmul(x, planes, plane_bits, group_size, active, bias)
        return reference_nested_matmul(x, planes, plane_bits, group_size, active, bias)
    if route.nested == "quant-kernel":
        used, bits = _active(planes, plane_bits, active)
        views = quant_views(used, bits, group_size)
        y = None if views is None else quant_matmul(x, views.weights, bias)
        if y is not None:
            return y
    cpu = cpu_route(rows, active)
    if cpu == "reference":
        return reference_nested_matmul(x, planes, plane_bits, group_size, active, bias)
    return dense_nested_matmul(x, planes, plane_bits, group_size, active, bias, use_numpy=cpu == "blas")


def quantized_matmul_rows(
    x, w, scales, biases, group_size, bits, bias=None, mode: str = "affine"
) -> mx.array:
    """x · Wᵀ (+ bias) for one nn.QuantizedLinear's arrays, with the multi-row CPU route."""
    if mode != "affine" or biases is None:
        y = mx.quantized_matmul(
            x, w, scales, biases, transpose=True, group_size=group_size, bits=bits, mode=mode
        )
        return y if bias is None else y + bias
    return nested_matmul(x, [{"weight": w, "scales": scales, "biases": biases}], (bits,), group_size, 1, bias)


def nested_self_check() -> list:
    """Doctor lines: CPU routes and the Metal kernel against the fp32 truth, and the CPU rule."""

    def verdict(worst: float, limit: float) -> str:
        return f"{'ok' if worst <= limit else 'mismatch'} (max err {worst:.1e})"

    worst = 0.0
    for bits in ((4,), (4, 4, 8), (2, 3, 5, 6)):
        for use_numpy in (True, False):

            def route(x, p, b, g, a, bias, use_numpy=use_numpy):
                return dense_nested_matmul(x, p, b, g, a, bias, use_numpy=use_numpy)

            worst = max(
                worst, check_kernel_case(route, bits, 64, mx.float32, mx.float32, mx.float32, rows=37)
            )
    checks = [
        KernelCheck("nested_matmul_dense", "cpu", f"{verdict(worst, 1e-4)}; rule: {describe_cpu_rule()}")
    ]
    name = f"{KERNEL_PREFIX}_{KERNEL_VERSION}"
    if not kernel_available():
        return checks + [KernelCheck(name, "metal", "unavailable: no Metal backend")]
    worst_by_dtype: dict[mx.Dtype, float] = dict.fromkeys(_FLOAT_DTYPES, 0.0)
    failures: list[str] = []
    with mx.stream(mx.gpu):  # metal_kernel runs on GPU streams only, whatever the default
        for metal_bits, group_size in (((4, 4), 64), ((4, 4, 8), 64), ((2, 2), 32), ((3, 5, 6), 128)):
            for dtype in _FLOAT_DTYPES:
                try:
                    error = check_kernel_case(
                        metal_nested_matmul, metal_bits, group_size, dtype, dtype, dtype
                    )
                    worst_by_dtype[dtype] = max(worst_by_dtype[dtype], error)
                except Exception as exc:  # report, never crash doctor
                    failures.append(f"{metal_bits} {dtype}: {str(exc).splitlines()[0][:100]}")
    if failures:
        return checks + [KernelCheck(name, "metal", "failed: " + "; ".join(failures[:2]))]
    ok = all(worst_by_dtype[d] <= _TOLERANCE[d] for d in _FLOAT_DTYPES)
    errors = ", ".join(f"{str(d).rsplit('.', 1)[-1]} {worst_by_dtype[d]:.1e}" for d in _FLOAT_DTYPES)
    return checks + [KernelCheck(name, "metal", f"{'ok' if ok else 'mismatch'} (max err {errors})")]
