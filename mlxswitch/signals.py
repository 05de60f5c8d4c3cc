"""Per-token signals the engine reads: entropy in bits (the router's input), varentropy, margin."""

from __future__ import annotations

import math

import mlx.core as mx

from .kernels.entropy import fused_token_signals, reference_token_signals

__all__ = ["token_signals", "reference_token_signals", "max_entropy_bits"]


def token_signals(logits: mx.array) -> mx.array:
    """Lazy fp32 [entropy bits, varentropy bits², p1 − p2] of raw logits (before temperature)."""
    return fused_token_signals(logits)


def max_entropy_bits(vocab_size: int) -> float:
    """Entropy of the uniform distribution over the vocabulary: log2 V."""
    return math.log2(vocab_size)
