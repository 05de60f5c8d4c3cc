"""The next-token signals' reduction in NumPy (entropy, varentropy, top-1/top-2 margin): the CPU
route's where the compiled pass operations are not (kernels/pass_ops.c has the same in two passes),
teacher forcing's, and the truth the others are checked against (float64). Apart from entropy.py
so that the pass operations' check reads it without importing the route."""

from __future__ import annotations

import math
import threading

import numpy as np

LN2 = math.log(2.0)
# Below this, e^d is exactly 0 in fp32 (the smallest subnormal is e^-103.3): clamping d there
# changes no probability, and keeps 0 · (−inf) = NaN out of the masked tokens' terms.
D_FLOOR = -1000.0
_SCRATCH = threading.local()


def _scratch(shape: tuple[int, ...], dtype) -> tuple[np.ndarray, ...]:
    # Fresh 600 KB temporaries per token cost page faults (1.4 ms instead of 0.5 ms at 152k,
    # depending on malloc's mmap threshold); the token loop's one row reuses three per thread.
    if shape[0] != 1:
        return tuple(np.empty(shape, dtype=dtype) for _ in range(3))
    buffers = getattr(_SCRATCH, "buffers", None)
    if buffers is None or buffers[0].shape != shape or buffers[0].dtype != dtype:
        buffers = _SCRATCH.buffers = tuple(np.empty(shape, dtype=dtype) for _ in range(3))
    return buffers


def numpy_token_signals(rows: np.ndarray, dtype=np.float32) -> np.ndarray:
    """Eager (n, 3) [entropy bits, varentropy bits², p1 − p2] of each logits row (n, V), in NumPy.

    The kernel's identities in `dtype` (float32: the engine's CPU route; float64: the teacher and
    the truth the references are checked against). NaN where a row is broken or fully masked.
    """
    x = np.asarray(rows, dtype=dtype)
    # NumPy's sums are pairwise, so fp32 is accurate here without the reference's two-level trick.
    # −inf − (−inf) and +inf − +inf make NaN on purpose (fully masked or broken logits): silence
    # the warnings, keep the NaN.
    d, e, t = _scratch(x.shape, x.dtype)
    with np.errstate(invalid="ignore", over="ignore", under="ignore", divide="ignore"):
        top = x.max(axis=-1, keepdims=True)  # NaN if any logit is NaN
        np.subtract(x, top, out=d)
        np.maximum(d, D_FLOOR, out=d)  # masked tokens: e = 0 and e·d = 0, not NaN
        np.exp(d, out=e)
        s = e.sum(axis=-1).astype(np.float64)
        np.multiply(e, d, out=t)
        s1 = t.sum(axis=-1).astype(np.float64)
        np.multiply(t, d, out=t)
        s2 = t.sum(axis=-1).astype(np.float64)
        # Second largest: knock out one largest entry per row (a tie leaves another 0 behind).
        d[np.arange(len(d)), np.argmax(d, axis=-1)] = -np.inf
        second = d.max(axis=-1).astype(np.float64) if d.shape[-1] > 1 else np.full(len(d), -np.inf)
        mean_d = s1 / s
        entropy = np.log(s) - mean_d
        varentropy = np.maximum(s2 / s - mean_d * mean_d, 0.0)
        margin = (1.0 - np.exp(second)) / s
    out = np.stack([entropy / LN2, varentropy / (LN2 * LN2), margin], axis=-1).astype(dtype)
    out[~(s > 0.0) | np.isnan(s1) | np.isnan(s2)] = np.nan
    return out


def float64_token_signals(logits: np.ndarray) -> np.ndarray:
    """[entropy bits, varentropy bits², p1 − p2] of one logits vector in float64 (the truth)."""
    return numpy_token_signals(np.asarray(logits).reshape(1, -1), np.float64)[0]
