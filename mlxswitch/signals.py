"""Per-token signals from logits: entropy (bits), varentropy, top-1/top-2 margin."""

from __future__ import annotations

import math

import mlx.core as mx

_LN2 = math.log(2.0)


def token_signals(logits: mx.array) -> mx.array:
    """Lazy fp32 [entropy bits, varentropy bits², p1 − p2] of logits, before temperature."""
    x = logits.reshape(-1).astype(mx.float32)
    logp = x - mx.logsumexp(x)
    p = mx.exp(logp)
    plogp = mx.where(p > 0, p * logp, 0.0)
    h = -mx.sum(plogp)
    var = mx.sum(mx.where(p > 0, p * logp * logp, 0.0)) - h * h
    top2 = mx.topk(p, 2) if p.size > 1 else mx.concatenate([p, mx.zeros((1,))])
    margin = mx.abs(top2[1] - top2[0]) if p.size > 1 else top2[0]
    return mx.stack([h / _LN2, var / (_LN2 * _LN2), margin])
