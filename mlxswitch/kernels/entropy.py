"""Next-token signals (entropy, varentropy, top-1/top-2 margin): reference, Metal kernel, dispatcher."""

from __future__ import annotations

import math

import mlx.core as mx

from ..resources import metal_source

KERNEL_NAME = "mlxswitch_token_signals_v1"
_THREADS = 1024
_LN2 = math.log(2.0)


def _accurate_sum(values: mx.array, rows: int = 256) -> mx.array:
    # MLX's CPU reduction accumulates sequentially: 6e-3 bits of error on a uniform 49k vector.
    # Summing rows first, then the row sums, brings it to ~1e-6.
    pad = (-values.size) % rows
    if pad:
        values = mx.concatenate([values, mx.zeros((pad,), values.dtype)])
    return values.reshape(rows, -1).sum(axis=1).sum()


def reference_token_signals(logits: mx.array) -> mx.array:
    """[entropy bits, varentropy bits², p1 − p2] in plain mx ops, reduced in float32."""
    # Same statistics as the kernel: with d = x − max, e = e^d, s = Σe, H = log s − Σe·d / s.
    x = logits.reshape(-1).astype(mx.float32)
    top = mx.topk(x, 2) if x.size > 1 else mx.concatenate([x, mx.array([-math.inf])])
    m = mx.max(top)
    d = x - m
    e = mx.exp(d)
    # Masked (-inf) tokens have e = 0 and must add 0, not 0 · (−inf) = NaN.
    ed = mx.where(e > 0, e * d, 0.0)
    s, s1, s2 = _accurate_sum(e), _accurate_sum(ed), _accurate_sum(mx.where(e > 0, ed * d, 0.0))
    mean_d = s1 / s
    entropy = mx.log(s) - mean_d
    varentropy = mx.maximum(s2 / s - mean_d * mean_d, 0.0)
    margin = (1.0 - mx.exp(mx.min(top) - m)) / s
    return mx.stack([entropy / _LN2, varentropy / (_LN2 * _LN2), margin])


def _split_source() -> tuple[str, str]:
    text = metal_source("entropy")
    header, body = text.split("// ---- body ----", 1)
    return header.split("// ---- header ----", 1)[1], body


def _build_kernel():
    if not mx.metal.is_available():
        return None
    try:
        header, body = _split_source()
        return mx.fast.metal_kernel(name=KERNEL_NAME, input_names=["logits"], output_names=["out"],
                                    source=body, header=header)
    except Exception:  # an old MLX without metal_kernel: the reference still works
        return None


_KERNEL = _build_kernel()


def kernel_available() -> bool:
    """Whether the fused Metal kernel is built on this machine."""
    return _KERNEL is not None


def metal_token_signals(logits: mx.array) -> mx.array:
    """The fused Metal kernel's signals (Metal only)."""
    flat = logits.reshape(-1)
    return _KERNEL(inputs=[flat], template=[("T", flat.dtype)], grid=(_THREADS, 1, 1),
                   threadgroup=(_THREADS, 1, 1), output_shapes=[(3,)],
                   output_dtypes=[mx.float32])[0]


def fused_token_signals(logits: mx.array) -> mx.array:
    """Signals from the fused kernel where Metal runs, from the reference elsewhere."""
    if _KERNEL is not None and logits.dtype in (mx.float32, mx.float16, mx.bfloat16):
        return metal_token_signals(logits)
    return reference_token_signals(logits)
