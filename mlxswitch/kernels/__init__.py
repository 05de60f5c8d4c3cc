"""Custom kernels: each family keeps a plain-mx reference, a kernel built once, and a dispatcher."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np


@dataclass(frozen=True)
class KernelCheck:
    """One line of `mlxswitch doctor`'s kernel self-check."""

    name: str
    backend: str
    status: str


def _float64_signals(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64) - logits.max()
    p = np.exp(z) / np.exp(z).sum()
    logp = np.log(p, where=p > 0, out=np.zeros_like(p))
    entropy = -(p * logp).sum()
    varentropy = (p * logp * logp).sum() - entropy ** 2
    top = np.sort(p)[-2:]
    return np.array([entropy / np.log(2), varentropy / np.log(2) ** 2, top[1] - top[0]])


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """Largest error, relative to the value where it exceeds 1 (bits and bits² both)."""
    return float((np.abs(got - want) / np.maximum(1.0, np.abs(want))).max())


def kernel_self_check(vocab_sizes: tuple[int, ...] = (49152, 151936)) -> list[KernelCheck]:
    """Compare each kernel with its reference (and the reference with float64) on random logits."""
    from . import entropy

    rng = np.random.default_rng(0)
    cases = [rng.normal(0, 3, size=v).astype(np.float32) for v in vocab_sizes]
    worst = max(relative_error(np.array(entropy.reference_token_signals(mx.array(c))),
                               _float64_signals(c)) for c in cases)
    checks = [KernelCheck("token signals (reference)", "mx ops",
                          "ok" if worst < 1e-3 else f"mismatch vs float64 (max err {worst:.2e})")]
    if not entropy.kernel_available():
        checks.append(KernelCheck(entropy.KERNEL_NAME, "metal", "unavailable: no Metal backend"))
        return checks
    try:
        worst = 0.0
        for case in cases:
            for dtype in (mx.float32, mx.bfloat16):
                x = mx.array(case).astype(dtype)
                got = np.array(entropy.metal_token_signals(x))
                want = np.array(entropy.reference_token_signals(x))
                worst = max(worst, relative_error(got, want))
        status = "ok" if worst < 1e-3 else f"mismatch (max err {worst:.2e})"
    except Exception as exc:  # a compile error on this GPU: report, do not crash doctor
        status = f"failed: {str(exc).splitlines()[0][:120]}"
    checks.append(KernelCheck(entropy.KERNEL_NAME, "metal", status))
    return checks
