"""A whole model's pass by row count, on the route this process resolved: what a check costs.

    uv run --extra qwen-coder python bench/bench_model_rows.py [--model NAME]           # quantized kernel
    MLXSWITCH_KERNELS=fp32 uv run --extra qwen-coder python bench/bench_model_rows.py   # fp32 copies

After a 96-token prefill, passes of k rows are fed on the KV cache and trimmed off again, the row
counts interleaved round by round; the median of the rounds is printed, and each as a multiple of
the one-row pass (a decoding step). Run the settings one after another, alone.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from mlxswitch.kernels.route import current_route
from mlxswitch.models.sources import load_model

ROWS = (1, 2, 3, 4, 6, 8, 16, 32)
PROMPT_IDS = [151644, 8948, 198, 2610, 525, 1207, 16948, 11, 3465, 553, 54364, 14817, 13, 1446, 525, 264] * 6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct", help="a packaged model's name")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    started = time.perf_counter()
    loaded = load_model(f"package:{args.model}")
    load_seconds = time.perf_counter() - started
    model = loaded.model
    cache = make_prompt_cache(model)
    ids = mx.array([PROMPT_IDS])
    started = time.perf_counter()
    mx.eval(model(ids, cache=cache))
    prefill = time.perf_counter() - started
    seconds: dict[int, list[float]] = {k: [] for k in ROWS}
    for _ in range(args.rounds):
        for rows in ROWS:
            started = time.perf_counter()
            mx.eval(model(ids[:, :rows], cache=cache))
            seconds[rows].append(time.perf_counter() - started)
            trim_prompt_cache(cache, rows)
    route = current_route()
    print(
        f"{args.model}: kernels={route.kernels}, linears {loaded.linears}, resident product "
        f"{route.resident_product}, {route.blas_threads} threads; median of {args.rounds} rounds"
    )
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB on Linux
    print(f"load {load_seconds:.1f} s (conversion cached), peak RSS {peak_rss:.2f} GB")
    print(f"prefill of {len(PROMPT_IDS)} tokens: {1e3 * prefill:.0f} ms")
    one = statistics.median(seconds[1])
    print(f"{'rows':>5s}{'ms':>9s}{'× 1 row':>9s}")
    for rows in ROWS:
        median = statistics.median(seconds[rows])
        print(f"{rows:5d}{1e3 * median:9.0f}{median / one:9.2f}")


if __name__ == "__main__":
    main()
