"""Loading models in a fresh process: where the seconds go, and the memory they hold.

    uv run --extra qwen-coder python bench/bench_load.py package:qwen2.5-coder-0.5b-instruct [more specs]

Imports, then each spec loaded as `chat` loads it (sources.load_model), the models kept; the
seconds in mlx-lm's model and tokenizer loads, the float cast and the CPU routes' setup
(use_fast_rows), the resident set after loading, MLX's active memory and the peak RSS. Run it in
turns against another checkout (PYTHONPATH=that checkout) for an A/B.
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

started = time.perf_counter()
import mlx.core as mx  # noqa: E402
import mlx_lm.utils  # noqa: E402

from mlxswitch.models import loading  # noqa: E402
from mlxswitch.models.sources import load_model  # noqa: E402

imports_s = time.perf_counter() - started
phases: dict[str, float] = {}


def timed(name, function):
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            phases[name] = phases.get(name, 0.0) + time.perf_counter() - t

    return wrapper


# Wrapped where loading.py calls them (mlx_lm.utils.load reads its own module's names).
mlx_lm.utils.load_model = timed("mlx-lm model", mlx_lm.utils.load_model)
mlx_lm.utils.load_tokenizer = timed("mlx-lm tokenizer", mlx_lm.utils.load_tokenizer)
loading.cast_floats = timed("cast floats", loading.cast_floats)
loading.use_fast_rows = timed("use_fast_rows", loading.use_fast_rows)
started = time.perf_counter()
kept = [load_model(spec) for spec in sys.argv[1:]]
load_s = time.perf_counter() - started
status = Path("/proc/self/status").read_text().splitlines()
resident_kb = next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))
peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
cells = ", ".join(f"{name} {seconds:.2f}" for name, seconds in phases.items())
print(
    f"{len(kept)} model(s): imports {imports_s:.2f} s, load {load_s:.2f} s ({cells}); resident "
    f"{resident_kb / 1e6:.2f} GB, MLX active {mx.get_active_memory() / 1e9:.2f} GB, peak RSS {peak_gb:.2f} GB"
)
