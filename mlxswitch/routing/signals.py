"""Per-token signals the engine reads: entropy in bits (the router's input), varentropy, margin.

All three are taken from the raw logits (before temperature) over the full vocabulary and
reduced in float32 whatever the logits' dtype. Two ways to get them:

- `token_signals` (lazy mx): the fused Metal kernel on Apple GPUs, the mx-ops reference elsewhere;
  the engine `async_eval`s it together with the sampled token.
- `token_signals_numpy` (eager NumPy): several times faster than MLX's ops on the Linux CPU
  backend (bench/bench_signals.py), but converting an mx array waits for it to be computed.
"""

from __future__ import annotations

import math
import threading

import mlx.core as mx
import numpy as np

from ..kernels._common import numpy_routes_allowed, on_gpu
from ..kernels.entropy import fused_token_signals, reference_token_signals
from .router import max_entropy_bits

__all__ = [
    "entropy_bits",
    "max_entropy_bits",
    "reference_token_signals",
    "token_signals",
    "token_signals_numpy",
]

_LN2 = math.log(2.0)
# e^d is exactly 0 in fp32 below this (as in kernels/entropy.py): clamping there changes nothing.
_D_FLOOR = -1000.0
_SCRATCH = threading.local()


def read_time_signals(logits: mx.array) -> "LazySignals":
    """The signals of one logits vector, to be read once it is computed: the fastest correct way here.

    On a GPU they are part of the lazy graph (the fused kernel, or the reference). On a CPU the
    graph carries only the logits and NumPy reduces them when the loop reads them — after the
    next step is already queued, so the pipeline stays full — several times faster than MLX's
    ops there (bench/bench_signals.py). MLXSWITCH_KERNELS=reference|mx keep the mx reference.
    """
    if on_gpu() or not numpy_routes_allowed():
        return LazySignals(token_signals(logits), None)
    return LazySignals(None, logits)


class LazySignals:
    """[entropy bits, varentropy bits², p1 − p2], computed by mx or read from logits by NumPy."""

    def __init__(self, signals: mx.array | None, logits: mx.array | None):
        self.array = signals if signals is not None else logits  # what async_eval must compute
        self._signals, self._logits, self._values = signals, logits, None

    def values(self) -> list[float]:
        """The three numbers (the first call waits for the computation)."""
        if self._values is None:
            if self._signals is not None:
                self._values = self._signals.tolist()
            else:
                self._values = [float(v) for v in token_signals_numpy(self._logits)]
        return self._values


def token_signals(logits: mx.array) -> mx.array:
    """Lazy fp32 [entropy bits, varentropy bits², p1 − p2] of one (V,) or (1, V) logits vector."""
    return fused_token_signals(logits)


def entropy_bits(logits: mx.array) -> mx.array:
    """Lazy fp32 scalar: Shannon entropy in bits of softmax(logits)."""
    return token_signals(logits)[0]


def _scratch(size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # Fresh 600 KB temporaries per token cost page faults (past malloc's mmap threshold) that
    # outweigh the reduction itself; reuse three per thread instead (bench/results/signals.txt).
    buffers = getattr(_SCRATCH, "buffers", None)
    if buffers is None or buffers[0].size != size:
        buffers = _SCRATCH.buffers = tuple(np.empty(size, dtype=np.float32) for _ in range(3))
    return buffers


def token_signals_numpy(logits: np.ndarray | mx.array) -> np.ndarray:
    """Eager fp32 [entropy bits, varentropy bits², p1 − p2] computed with NumPy."""
    if isinstance(logits, mx.array):
        # NumPy has no bfloat16: widen in MLX. np.asarray is then a zero-copy view, but it
        # evaluates the array (and everything it depends on) first.
        logits = np.asarray(logits.astype(mx.float32))
    x = np.asarray(logits, dtype=np.float32)
    if x.size != x.shape[-1]:
        raise ValueError(f"token signals take one logits vector, (V,) or (1, V); got {x.shape}")
    x = x.reshape(-1)
    # Same identities as the kernel and the reference; NumPy's sums are pairwise, so fp32 is
    # accurate here without the reference's two-level trick. −inf − (−inf) and +inf − +inf make
    # NaN on purpose (fully masked or broken logits): silence the warnings, keep the NaN.
    d, e, t = _scratch(x.size)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        top = x.max()  # NaN if any logit is NaN
        np.subtract(x, top, out=d)
        np.maximum(d, _D_FLOOR, out=d)  # masked tokens: e = 0 and e·d = 0, not NaN
        np.exp(d, out=e)
        s = float(e.sum())
        np.multiply(e, d, out=t)
        s1 = float(t.sum())
        np.multiply(t, d, out=t)
        s2 = float(t.sum())
        # Second largest: knock out one largest entry (a tie leaves another 0 behind).
        d[int(np.argmax(d))] = -np.inf
        second = float(d.max()) if d.size > 1 else -math.inf
    if not s > 0.0 or math.isnan(s1) or math.isnan(s2):
        return np.full(3, np.nan, dtype=np.float32)
    mean_d = s1 / s
    entropy = math.log(s) - mean_d
    varentropy = max(s2 / s - mean_d * mean_d, 0.0)
    margin = (1.0 - math.exp(second)) / s
    return np.array([entropy / _LN2, varentropy / (_LN2 * _LN2), margin], dtype=np.float32)
