"""The quantized kernel alone on the Qwen 1.5B's layer shapes: fp32 against int8 activations.

    uv run python bench/bench_quant_kernel.py [--rows 1,2,4,8,16,33] [--sources a.c,b.c] [--wide]

Per shape, as many distinct random weights as the 1.5B has layers of it (a model's weights do not
sit in cache between steps), each product timed over all of them; fp32 (`exact`) and int8
activations (the CPU default) interleaved round by round, the minimum of the
rounds per weight printed. Rows from 12 on take the fp32 panel path, as a prefill does; int8 takes
every row count it is given. --sources compares the int8 path of other builds of quant_rows.c
(kernel work: each is compiled into the kernel cache like the shipped one). --wide adds an arm
with int16 activations (the default's down projections on 4-bit codes).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from mlxswitch.kernels.cbuild import compile_source
from mlxswitch.kernels.quant_cpu import COMPILE_FLAGS, SOURCE, QuantKernel
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,2,4,8,16,33")
    parser.add_argument("--sources", default=str(SOURCE), help="builds of quant_rows.c, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--wide", action="store_true", help="an arm on int16 activations")
    args = parser.parse_args()
    sources = [Path(s) for s in args.sources.split(",")]
    kernels = []
    for source in sources:
        built = compile_source(source, COMPILE_FLAGS)
        assert not isinstance(built, str), built
        kernels.append(QuantKernel(built.library, built.flags))
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
