"""Next-token signals (entropy, varentropy, top-1/top-2 margin): the Metal kernel, its plain-mx
reference and a dispatcher. The same reduction in NumPy (the CPU route, teacher forcing, the truth)
is signals_numpy.py's, in C pass_ops.c's."""

from __future__ import annotations

import math
import warnings

import mlx.core as mx
import numpy as np

from ..resources import metal_source
from ._common import KernelCheck
from .route import current_route
from .signals_numpy import D_FLOOR, LN2, float64_token_signals

# Bump the suffix whenever metal/entropy.metal changes: MLX caches compiled libraries by name.
KERNEL_NAME = "mlxswitch_token_signals_onegroup_v2"
# A pipeline may allow fewer than 1024 threads a threadgroup (register pressure); MLX then raises
# at evaluation. The first use tries these sizes in order and keeps the first that works.
THREADGROUP_SIZES = (1024, 256)
_FLOAT_DTYPES = (mx.float32, mx.float16, mx.bfloat16)
_SUM_ROWS = 256


def _flat(logits: mx.array) -> mx.array:
    if logits.size != logits.shape[-1]:
        raise ValueError(f"token signals take one logits vector, (V,) or (1, V); got {logits.shape}")
    return logits.reshape(-1)


def _accurate_sum(values: mx.array) -> mx.array:
    # MLX's CPU reduction accumulates in long sequential runs (2e-4 relative error on a 152k
    # softmax); summing 256 rows first, then the row sums, brings it to ~1e-6 at no extra cost.
    whole = values.size - values.size % _SUM_ROWS
    if whole == 0:
        return values.sum()
    total = values[:whole].reshape(_SUM_ROWS, -1).sum(axis=1).sum()
    return total + values[whole:].sum() if whole < values.size else total


def reference_token_signals(logits: mx.array) -> mx.array:
    """Lazy fp32 [entropy bits, varentropy bits², p1 − p2] in plain mx ops (any backend)."""
    # The kernel's identities (metal/entropy.metal), with d = x − max and s = Σe^d:
    # H = log s − Σe^d·d / s, varentropy = Σe^d·d² / s − (Σe^d·d / s)², p1 − p2 = (1 − e^(t2 − max)) / s.
    x = _flat(logits).astype(mx.float32)
    top = mx.max(x)  # NaN when any logit is NaN, and then every signal is NaN
    d = mx.maximum(x - top, D_FLOOR)  # masked −inf tokens: e = 0 and e·d = 0, not NaN
    e = mx.exp(d)
    ed = e * d
    s, s1, s2 = _accurate_sum(e), _accurate_sum(ed), _accurate_sum(ed * d)
    # Second largest logit without a sort (a top-k over the vocabulary costs more on a CPU than
    # this one masked max); a tie for the largest makes it the largest (margin 0).
    below = mx.max(mx.where(x < top, x, -math.inf))
    second = mx.where(mx.sum(x == top) > 1, top, below)
    mean_d = s1 / s
    entropy = mx.log(s) - mean_d
    varentropy = mx.maximum(s2 / s - mean_d * mean_d, 0.0)
    margin = (1.0 - mx.exp(second - top)) / s
    return mx.stack([entropy / LN2, varentropy / (LN2 * LN2), margin])


def _split_source() -> tuple[str, str]:
    # One file holds both pieces: helpers (header, outside the kernel) and the kernel body.
    text = metal_source("entropy")
    rest, body = text.split("// ---- body ----", 1)
    return rest.split("// ---- header ----", 1)[1], body


def _make_kernel():
    # Building only records the source (it compiles on first call): this works on any backend.
    header, body = _split_source()
    return mx.fast.metal_kernel(
        name=KERNEL_NAME,
        input_names=["logits"],
        output_names=["out"],
        source=body,
        header=header,
        # IEEE special values: exp(−inf) = 0 and isnan are what the masking and NaN guard use.
        compile_options={"math_mode": "safe"},
    )


def _build_kernel():
    try:
        return _make_kernel()
    except Exception:  # an MLX without this API: the reference still works
        return None


def _launch(kernel, flat: mx.array, threads: int, verbose: bool = False) -> mx.array:
    # One threadgroup: grid == threadgroup (dispatchThreads semantics: the grid counts threads).
    return kernel(
        inputs=[flat],
        template=[("T", flat.dtype)],
        grid=(threads, 1, 1),
        threadgroup=(threads, 1, 1),
        output_shapes=[(3,)],
        output_dtypes=[mx.float32],
        verbose=verbose,
    )[0]


_KERNEL = None  # built on first need where the route found Metal (_get_kernel)
_BUILT = False  # whether the build was tried (it fails only on an MLX without metal_kernel)
# dtype → the threadgroup size that passed the first-use check, or None when the kernel failed.
_CHECKED: dict[mx.Dtype, int | None] = {}


def _get_kernel():
    global _KERNEL, _BUILT
    if _KERNEL is None and not _BUILT and current_route().metal:
        _KERNEL, _BUILT = _build_kernel(), True
    return _KERNEL


def kernel_available() -> bool:
    """Whether the fused Metal kernel was built on this machine."""
    return _get_kernel() is not None


def metal_token_signals(logits: mx.array, threads: int = THREADGROUP_SIZES[0]) -> mx.array:
    """Lazy fp32 signals from the fused Metal kernel, one threadgroup of `threads` (Metal only)."""
    kernel = _get_kernel()
    if kernel is None:
        raise RuntimeError("the fused token-signals kernel needs the Metal backend")
    return _launch(kernel, _flat(logits), threads)


def signals_error(got, want) -> float:
    """Largest absolute error, relative where a value exceeds 1 (bits and bits² alike)."""
    worst = 0.0
    for g, w in zip(list(got), list(want), strict=True):
        g, w = float(g), float(w)
        if math.isnan(g) or math.isnan(w):
            if not (math.isnan(g) and math.isnan(w)):
                return math.inf
            continue
        worst = max(worst, abs(g - w) / max(1.0, abs(w)))
    return worst


def _first_use_check(dtype: mx.Dtype) -> int | None:
    # The kernel cannot be tested where it is developed (Linux): on a user's Mac, the first call
    # per dtype compares it with the reference on a vocabulary that is not a multiple of the
    # threadgroup, and falls back to the reference for good rather than route on wrong numbers.
    logits = (mx.random.normal((4099,), key=mx.random.key(0)) * 4).astype(dtype)
    want = reference_token_signals(logits)
    problem = "mismatch"
    for threads in THREADGROUP_SIZES:
        try:
            got = metal_token_signals(logits, threads)
            mx.eval(got, want)
        except Exception as exc:  # pipeline limit below `threads`, or a compile error
            problem = str(exc).splitlines()[0][:160]
            continue
        if signals_error(got.tolist(), want.tolist()) < 1e-3:
            return threads
    warnings.warn(
        f"fused token-signals kernel disabled for {dtype} ({problem}); using the mx-ops reference",
        RuntimeWarning,
        stacklevel=3,
    )
    return None


def fused_token_signals(logits: mx.array) -> mx.array:
    """Lazy signals: the fused Metal kernel where the route takes it and it passed its check, else
    the reference (always with MLXSWITCH_KERNELS=reference)."""
    # The route's "metal-kernel" means a Metal default device: metal_kernel runs on GPU streams only.
    if (
        current_route().signals == "metal-kernel"
        and logits.dtype in _FLOAT_DTYPES
        and _get_kernel() is not None
    ):
        if logits.dtype not in _CHECKED:
            _CHECKED[logits.dtype] = _first_use_check(logits.dtype)
        threads = _CHECKED[logits.dtype]
        if threads is not None:
            return metal_token_signals(logits, threads)
    return reference_token_signals(logits)


SELF_CHECK_VOCABS = (4099, 49152, 151936)


def entropy_self_check(rng: np.random.Generator) -> list[KernelCheck]:
    """Doctor lines: the reference against float64, and the Metal kernel against the reference."""
    cases = [rng.normal(0, 3, size=v).astype(np.float32) for v in SELF_CHECK_VOCABS]
    worst = max(
        signals_error(reference_token_signals(mx.array(c)).tolist(), float64_token_signals(c)) for c in cases
    )
    checks = [
        KernelCheck(
            "token_signals_reference",
            "mx ops",
            "ok" if worst < 1e-3 else f"mismatch vs float64 (max err {worst:.2e})",
        )
    ]
    if not kernel_available():
        checks.append(KernelCheck(KERNEL_NAME, "metal", "unavailable: no Metal backend"))
        return checks
    worst, threads, failures = 0.0, None, []
    for size in THREADGROUP_SIZES:
        try:
            for case in cases:
                for dtype in (mx.float32, mx.bfloat16):
                    x = mx.array(case).astype(dtype)
                    got = metal_token_signals(x, size)
                    want = reference_token_signals(x)
                    mx.eval(got, want)
                    worst = max(worst, signals_error(got.tolist(), want.tolist()))
            threads = size
            break
        except Exception as exc:  # pipeline limit or compile error: report, never crash doctor
            failures.append(f"{size} threads: {str(exc).splitlines()[0][:100]}")
    if threads is None:
        status = "failed: " + "; ".join(failures)
    elif worst < 1e-3:
        status = "ok"
    else:
        status = f"mismatch (max err {worst:.2e}, {threads} threads)"
    checks.append(KernelCheck(KERNEL_NAME, "metal", status))
    return checks
