"""One-row (decode) routes for a quantized linear on this machine, over a model's layer shapes.

For each distinct (out, in, bits) of the model's quantized linears, x (1 row, fp32) · Wᵀ by:
MLX's quantized mat-vec (what decoding uses), MLX's dense fp32 matmul on the dequantized weight,
and NumPy's BLAS on the same fp32 weight (the dense routes hold 4 bytes a parameter instead of
~0.6). Median ms per call over rounds, interleaved; GB/s of weight bytes each route reads.

    uv run python bench/bench_row_routes.py --model package:qwen2.5-coder-1.5b-instruct
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlxswitch.models.sources import load_model


def timed_ms(call, repeats: int) -> float:
    """Mean ms per call over `repeats` calls, after one warm-up call."""
    call()
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - start) / repeats * 1e3


def _routes(layer, bits: int, x, dense, x_np, dense_np) -> dict[str, Callable[[], object]]:
    """The three ways to multiply one row by the layer, each a call to time."""
    return {
        "mlx quantized mat-vec": lambda: mx.eval(
            mx.quantized_matmul(
                x,
                layer.weight,
                layer.scales,
                layer.biases,
                transpose=True,
                group_size=layer.group_size,
                bits=bits,
            )
        ),
        "mlx dense fp32": lambda: mx.eval(x @ dense.T),
        "numpy fp32 (BLAS)": lambda: x_np @ dense_np.T,
    }


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="package:qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    loaded = load_model(args.model)
    shapes: dict[tuple, nn.Module] = {}
    for _, module in loaded.model.named_modules():
        if isinstance(module, nn.QuantizedLinear):
            shapes.setdefault(
                (module.weight.shape[0], module.weight.shape[1] * 32 // module.bits, module.bits), module
            )
    rows = []
    for (out_dim, in_dim, bits), layer in sorted(shapes.items()):
        dense = mx.dequantize(
            layer.weight, layer.scales, layer.biases, group_size=layer.group_size, bits=bits
        )
        dense_np = np.array(dense)
        x = mx.random.normal((1, in_dim))
        x_np = np.array(x)
        routes = _routes(layer, bits, x, dense, x_np, dense_np)
        times: dict[str, list[float]] = {route: [] for route in routes}
        for _ in range(args.rounds):  # interleaved, so drift hits every route alike
            for route, call in routes.items():
                times[route].append(timed_ms(call, args.repeats))
        quantized_bytes = layer.weight.nbytes + layer.scales.nbytes + layer.biases.nbytes
        for route, samples in times.items():
            ms = statistics.median(samples)
            read = quantized_bytes if route.startswith("mlx quantized") else dense_np.nbytes
            rows.append(
                {
                    "shape": [out_dim, in_dim],
                    "bits": bits,
                    "route": route,
                    "ms": ms,
                    "gb_per_s": read / ms / 1e6,
                }
            )
            print(
                f"{out_dim:>7}×{in_dim:<5} {bits}-bit  {route:<22} {ms:8.3f} ms  {read / ms / 1e6:6.2f} GB/s"
            )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(
                {"command": " ".join(["bench/bench_row_routes.py", *argv]), "rows": rows}, handle, indent=1
            )


if __name__ == "__main__":
    main(sys.argv[1:])
