"""Cost of the per-token signals (entropy, varentropy, margin) on large vocabularies, one run.

    uv run python bench/bench_signals.py

Times the plain-mx reference (what runs on CPU/CUDA), the fused Metal kernel where Metal exists,
and a naive one-pass MLX formulation, per call in milliseconds (median of 50).
"""

from __future__ import annotations

import math
import statistics
import time

import mlx.core as mx

from mlxswitch.kernels import entropy


def naive_signals(logits: mx.array) -> mx.array:
    """Softmax then Σ p·log p with MLX's own reductions (less accurate on CPU: sequential sums)."""
    x = logits.astype(mx.float32)
    logp = x - mx.logsumexp(x)
    p = mx.exp(logp)
    return -mx.sum(p * logp) / math.log(2)


def time_ms(fn, x, repeats: int = 50) -> float:
    """Median milliseconds of fn(x), evaluated."""
    mx.eval(fn(x))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(fn(x))
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def main() -> None:
    """Print one row per vocabulary size."""
    paths = {"naive mx": naive_signals, "reference": entropy.reference_token_signals}
    if entropy.kernel_available():
        paths["metal kernel"] = entropy.metal_token_signals
    print(f"device {mx.default_device()}")
    print(f"{'vocab':>8} " + " ".join(f"{name:>13}" for name in paths))
    for vocab in (49152, 151936):
        x = mx.random.normal((vocab,)) * 3
        print(f"{vocab:>8} " + " ".join(f"{time_ms(fn, x):>10.3f} ms" for fn in paths.values()))


if __name__ == "__main__":
    main()
