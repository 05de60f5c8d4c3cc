"""Per-token signals the engine reads: entropy in bits (the router's input), varentropy, margin.

All three are taken from the raw logits (before temperature) over the full vocabulary and
reduced in float32 whatever the logits' dtype. Two ways to get them:

- `token_signals` (lazy mx): the fused Metal kernel on Apple GPUs, the mx-ops reference elsewhere;
  the engine `async_eval`s it together with the sampled token.
- `token_signals_numpy` (eager, from the logits as NumPy reads them): the compiled pass operations'
  reduction where the route has them (kernels/pass_ops.c), else NumPy's; several times faster than
  MLX's ops on the Linux CPU backend (bench/bench_signals.py), but converting an mx array waits for
  it to be computed.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..kernels.entropy import fused_token_signals
from ..kernels.pass_ops import pass_ops
from ..kernels.route import current_route
from ..kernels.signals_numpy import numpy_token_signals


def read_time_signals(logits: mx.array) -> LazySignals:
    """The signals of one logits vector, to be read once it is computed: the fastest correct way here.

    On a GPU they are part of the lazy graph (the fused kernel, or the reference). On a CPU the
    graph carries only the logits and NumPy reduces them when the loop reads them — after the
    next step is already queued, so the pipeline stays full — several times faster than MLX's
    ops there (bench/bench_signals.py). MLXSWITCH_KERNELS=reference|mx keep the mx reference.
    The route (kernels/route.py, its `signals`) decides.
    """
    if current_route().signals not in ("compiled", "numpy"):
        return LazySignals(token_signals(logits), None)
    return LazySignals(None, logits)


class LazySignals:
    """[entropy bits, varentropy bits², p1 − p2], computed by mx or read from logits by NumPy."""

    def __init__(self, signals: mx.array | None, logits: mx.array | None):
        array = signals if signals is not None else logits  # what async_eval must compute
        if array is None:
            raise ValueError("LazySignals needs the signals or the logits")
        self.array: mx.array = array
        self._signals, self._logits = signals, logits
        self._values: list[float] | None = None

    def values(self) -> list[float]:
        """The three numbers (the first call waits for the computation)."""
        if self._values is None:
            if self._signals is not None:
                values: list[float] = self._signals.tolist()  # type: ignore[assignment]  # mlx: any nesting
            else:
                assert self._logits is not None  # one of the two is always given
                values = [float(v) for v in token_signals_numpy(self._logits)]
            self._values = values
        return self._values


def token_signals(logits: mx.array) -> mx.array:
    """Lazy fp32 [entropy bits, varentropy bits², p1 − p2] of one (V,) or (1, V) logits vector."""
    return fused_token_signals(logits)


def token_signals_numpy(logits: np.ndarray | mx.array) -> np.ndarray:
    """Eager fp32 [entropy bits, varentropy bits², p1 − p2] from the logits on the CPU: by the compiled
    pass operations where the route has them (its signals "compiled"), else by NumPy."""
    if isinstance(logits, mx.array):
        # NumPy has no bfloat16: widen in MLX. np.asarray is then a zero-copy view, but it
        # evaluates the array (and everything it depends on) first.
        logits = np.asarray(logits.astype(mx.float32))
    x = np.asarray(logits, dtype=np.float32)
    if x.size != x.shape[-1]:
        raise ValueError(f"token signals take one logits vector, (V,) or (1, V); got {x.shape}")
    row = x.reshape(1, -1)
    # The compiled reduction makes two passes over the row where NumPy's makes ~10 (0.33 ms at 151,936 ids).
    ops = pass_ops() if current_route().signals == "compiled" else None
    return ops.token_signals(row)[0] if ops is not None else numpy_token_signals(row)[0]
