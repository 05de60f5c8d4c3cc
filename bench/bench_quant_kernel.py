"""The quantized kernel alone on the Qwen 1.5B's layer shapes: fp32 against int8 activations.

    uv run python bench/bench_quant_kernel.py [--rows 1,2,4,8,16,33] [--sources a.c,b.c] [--wide]
    uv run python bench/bench_quant_kernel.py --tiles [--rows 1,4,8]

Per shape, as many distinct random weights as the 1.5B has layers of it (a model's weights do not
sit in cache between steps), each product timed over all of them; fp32 (`exact`) and int8
activations (the CPU default) interleaved round by round, the minimum of the
rounds per weight printed. Rows from 12 on take the fp32 panel path, as a prefill does; int8 takes
every row count it is given. --sources compares the int8 path of other builds of quant_rows.c
(kernel work: each is compiled into the kernel cache like the shipped one). --wide adds an arm
with int16 activations (the default's down projections on 4-bit codes). --tiles instead times
each of the 1.5B's products as the default now multiplies it (laid out as tiles at load:
kernels/quant_tiles.py) against the same weights in MLX's layout (or Q6_K blocks as stored) on the
few-row path, every row count on integer activations as a decoding pass takes them.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from mlxswitch.kernels.cbuild import compile_source
from mlxswitch.kernels.quant_cpu import COMPILE_FLAGS, SOURCE
from mlxswitch.kernels.quant_library import QuantKernel
from mlxswitch.kernels.quant_tiles import tiled_q6k_weight, tiled_weight
from mlxswitch.kernels.quant_weights import QuantWeight

# (out, in, bits, distinct weights cycled): the 1.5B's 4-bit gate/up, down (4-bit: int16
# activations on the default; its other 14, 8-bit from Q6_K, keep fp32), q/o projections and its
# 8-bit tied head (from Q6_K).
SHAPES = (
    (8960, 1536, 4, 28),
    (1536, 8960, 4, 14),
    (1536, 8960, 8, 14),
    (1536, 1536, 4, 28),
    (151936, 1536, 8, 1),
)


# (name, out, in, Q6_K or 4-bit codes, int16 rows, distinct weights cycled): the 1.5B's products.
TILED_SHAPES = (
    ("gate/up", 8960, 1536, False, False, 28),
    ("down 4-bit", 1536, 8960, False, True, 14),
    ("down Q6_K", 1536, 8960, True, True, 14),
    ("q/o", 1536, 1536, False, False, 28),
    ("head Q6_K", 151936, 1536, True, False, 1),
)


def compare_tiles(kernel: QuantKernel, rows_list: list[int], rounds: int) -> None:
    """--tiles: each shape's weights laid out as tiles against MLX's layout (few-row path)."""
    rng = np.random.default_rng(0)
    print(f"ms a product (min of {rounds} rounds, arms interleaved), 2 threads: as stored | as tiles")
    for name, out_dims, in_dims, q6k, wide, count in TILED_SHAPES:
        stored, tiles = [], []
        for _ in range(count):
            if q6k:
                blocks = rng.integers(0, 256, size=(out_dims, in_dims // 256, 210), dtype=np.uint8)
                d = (rng.standard_normal(blocks.shape[:2]) * 1e-3).astype(np.float16)
                blocks[..., 208:] = d.view(np.uint8).reshape(*blocks.shape[:2], 2)
                weight = QuantWeight.from_q6k(mx.array(blocks.reshape(out_dims, -1)), in_dims)
                tiled = tiled_q6k_weight(kernel, weight)
            else:
                w = mx.array(rng.standard_normal((out_dims, in_dims)).astype(np.float32) * 0.02)
                q, scales, biases = mx.quantize(w, group_size=32, bits=4)
                weight = QuantWeight.from_arrays(
                    q, scales.astype(mx.float16), biases.astype(mx.float16), 32, 4
                )
                tiled = tiled_weight(kernel, weight)
            stored.append(weight)
            tiles.append(tiled)
        for rows in rows_list:
            x = rng.standard_normal((rows, in_dims)).astype(np.float32)
            seconds: dict[str, list[float]] = {"stored": [], "tiles": []}
            for _ in range(rounds):
                for arm, weights in (("stored", stored), ("tiles", tiles)):
                    started = time.perf_counter()
                    for weight in weights:
                        kernel.times(x, weight, 2, rows + 1, int8=True, wide=wide)
                    seconds[arm].append((time.perf_counter() - started) / count)
            before, after = (1e3 * min(seconds[arm]) for arm in ("stored", "tiles"))
            shape = f"{name} {out_dims}x{in_dims}, {rows:2d} rows"
            print(f"{shape}: {before:.2f} | {after:.2f} ({before / after:.2f}x)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,2,4,8,16,33")
    parser.add_argument("--sources", default=str(SOURCE), help="builds of quant_rows.c, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--wide", action="store_true", help="an arm on int16 activations")
    parser.add_argument("--tiles", action="store_true", help="tiles laid out at load against MLX's layout")
    args = parser.parse_args()
    sources = [Path(s) for s in args.sources.split(",")]
    kernels = []
    for source in sources:
        built = compile_source(source, COMPILE_FLAGS)
        assert not isinstance(built, str), built
        kernels.append(QuantKernel(built.library, built.flags))
    if args.tiles:
        compare_tiles(kernels[0], [int(r) for r in args.rows.split(",")], args.rounds)
        return
    rng = np.random.default_rng(0)
    names = ", ".join(s.name for s in sources)
    print(f"ms a product (min of {args.rounds} rounds), 2 threads; int8 per build: {names}")
    wide = [(kernels[0], True, True)] if args.wide else []
    for out_dims, in_dims, bits, count in SHAPES:
        weights = []
        for _ in range(count):
            w = mx.array(rng.standard_normal((out_dims, in_dims)).astype(np.float32) * 0.02)
            weights.append(QuantWeight.from_arrays(*mx.quantize(w, group_size=32, bits=bits), 32, bits))
        for rows in (int(r) for r in args.rows.split(",")):
            x = rng.standard_normal((rows, in_dims)).astype(np.float32)
            arms = [(kernels[0], False, False)] + [(kernel, True, False) for kernel in kernels] + wide
            seconds: list[list[float]] = [[] for _ in arms]
            for _ in range(args.rounds):
                for arm, (kernel, int8, int16) in enumerate(arms):
                    started = time.perf_counter()
                    for weight in weights:
                        kernel.times(x, weight, 2, int8=int8, wide=int16)
                    seconds[arm].append((time.perf_counter() - started) / count)
            fp32, *integer = (1e3 * min(s) for s in seconds)
            labels = ["int8"] * len(kernels) + ["int16"] * len(wide)
            cells = "  ".join(
                f"{label} {ms:.2f} ({fp32 / ms:.2f}x)" for label, ms in zip(labels, integer, strict=True)
            )
            print(f"{out_dims}x{in_dims} {bits}-bit, {rows:2d} rows: fp32 {fp32:.2f}  {cells}", flush=True)


if __name__ == "__main__":
    main()
