"""Cost of the per-token signals (entropy, varentropy, margin) on large vocabularies.

    .venv/bin/python bench/bench_signals.py [--repeats N]

Median milliseconds per call, one logits vector, already computed (so only the signals are
timed), for each way the engine can get them:

- mx reference: `reference_token_signals`, lazy, timed through `mx.eval` (what CPU/CUDA run).
- metal kernel: the fused one-threadgroup kernel (Apple GPUs only).
- numpy: `token_signals_numpy` on a NumPy fp32 array (compute only).
- numpy from mx: the same from the mx array: bf16 widened in MLX, then a zero-copy view.
  Here the logits are already evaluated; in the engine the conversion also waits for the
  forward pass that produces them, which a lazy path would overlap with the next step.
- mx → numpy: that conversion alone.
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx
import numpy as np

from mlxswitch.kernels import entropy
from mlxswitch.routing.signals import token_signals_numpy

VOCABS = (49152, 151936)


def time_ms(fn, repeats: int) -> float:
    """Median milliseconds of fn(), whose mx results are evaluated inside the timing."""

    def once():
        result = fn()
        if isinstance(result, mx.array):
            mx.eval(result)

    for _ in range(3):
        once()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        once()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def paths(x: mx.array) -> dict[str, object]:
    """The timed calls for one evaluated logits vector."""
    x_np = np.array(x.astype(mx.float32))
    calls = {"mx reference": lambda: entropy.reference_token_signals(x)}
    if entropy.kernel_available():
        calls["metal kernel"] = lambda: entropy.metal_token_signals(x)
    calls["numpy"] = lambda: token_signals_numpy(x_np)
    calls["numpy from mx"] = lambda: token_signals_numpy(x)
    calls["mx → numpy"] = lambda: np.asarray(x.astype(mx.float32))
    return calls


def main() -> None:
    """Print one row per vocabulary size and input dtype."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=100)
    args = parser.parse_args()
    print(
        f"mlx {mx.__version__}, numpy {np.__version__}, device {mx.default_device()}, "
        f"metal kernel {'built' if entropy.kernel_available() else 'unavailable'}; "
        f"median ms of {args.repeats}"
    )
    header = None
    for vocab in VOCABS:
        for dtype in (mx.float32, mx.bfloat16):
            x = (mx.random.normal((vocab,), key=mx.random.key(vocab)) * 3).astype(dtype)
            mx.eval(x)
            calls = paths(x)
            if header is None:
                header = f"{'vocab':>7} {'dtype':>8} " + " ".join(f"{n:>14}" for n in calls)
                print(header)
            times = [time_ms(fn, args.repeats) for fn in calls.values()]
            print(f"{vocab:>7} {str(dtype).rsplit('.', 1)[-1]:>8} " + " ".join(f"{t:>14.3f}" for t in times))


if __name__ == "__main__":
    main()
