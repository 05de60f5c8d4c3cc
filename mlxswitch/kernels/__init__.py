"""Custom kernels: each family keeps a plain-mx reference, a kernel built once, and a dispatcher."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

SELF_CHECK_VOCABS = (4099, 49152, 151936)


@dataclass(frozen=True)
class KernelCheck:
    """One line of `mlxswitch doctor`'s kernel self-check."""

    name: str
    backend: str
    status: str


def float64_token_signals(logits: np.ndarray) -> np.ndarray:
    """[entropy bits, varentropy bits², p1 − p2] of one logits vector in float64 NumPy (the truth)."""
    x = np.asarray(logits, dtype=np.float64).reshape(-1)
    z = np.exp(x - x.max())
    p = z / z.sum()
    logp = np.log(p, where=p > 0, out=np.zeros_like(p))  # p = 0 adds 0 (masked tokens)
    entropy = -(p * logp).sum()
    varentropy = (p * logp * logp).sum() - entropy**2
    top = np.sort(p)[-2:] if p.size > 1 else np.array([0.0, p[0]])
    return np.array([entropy / np.log(2), varentropy / np.log(2) ** 2, top[1] - top[0]])


def _entropy_checks(rng: np.random.Generator) -> list[KernelCheck]:
    from . import entropy

    cases = [rng.normal(0, 3, size=v).astype(np.float32) for v in SELF_CHECK_VOCABS]
    worst = max(entropy.signals_error(entropy.reference_token_signals(mx.array(c)).tolist(),
                                      float64_token_signals(c)) for c in cases)
    checks = [KernelCheck("token_signals_reference", "mx ops",
                          "ok" if worst < 1e-3 else f"mismatch vs float64 (max err {worst:.2e})")]
    if not entropy.kernel_available():
        checks.append(KernelCheck(entropy.KERNEL_NAME, "metal", "unavailable: no Metal backend"))
        return checks
    worst, threads, failures = 0.0, None, []
    for size in entropy.THREADGROUP_SIZES:
        try:
            for case in cases:
                for dtype in (mx.float32, mx.bfloat16):
                    x = mx.array(case).astype(dtype)
                    got = entropy.metal_token_signals(x, size)
                    want = entropy.reference_token_signals(x)
                    mx.eval(got, want)
                    worst = max(worst, entropy.signals_error(got.tolist(), want.tolist()))
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
    checks.append(KernelCheck(entropy.KERNEL_NAME, "metal", status))
    return checks


def kernel_self_check() -> list[KernelCheck]:
    """Compare every kernel with its reference (and each reference with float64) on random inputs."""
    rng = np.random.default_rng(0)
    return _entropy_checks(rng)
