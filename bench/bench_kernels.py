"""Cost of the nested-gear matmul routes, per layer shape, row count and plane set.

    uv run python bench/bench_kernels.py [--shapes smollm2,qwen0.5b,qwen7b] [--rows 1,8,37,200]
                                         [--planes 4,4+4,4+4+8] [--cell-budget 3]

Best-of-N milliseconds for one call (inputs evaluated beforehand, result evaluated inside):

- reference: Σ mx.quantized_matmul over the active planes (what NestedLinear did);
- mx dense: dequantize the active planes to one fp32 weight, one MLX matmul;
- blas dense: the same weight, the matmul in NumPy's BLAS (evaluates x first);
- metal: the fused mat-vec (Apple GPUs only);
- auto: `nested_matmul`, whichever route the rule picks (named in `route`);
- builtin: the plain model of the same bits in MLX: one quantized_matmul at 4 or 8 bits, or an
  fp32 matmul with the dense weight resident (gear 16), no planes at all.

A cell whose predicted time exceeds --cell-budget seconds (from the previous row count) is
skipped ("-"). The CPU here is shared and runs MLX on one thread: compare within a run.
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx

from mlxswitch.kernels import nested, nested_cpu
from mlxswitch.kernels.route import current_route

# (name, out_dims, in_dims)
SHAPES = {
    "smollm2": [("smollm2 up 576→1536", 1536, 576), ("smollm2 down 1536→576", 576, 1536)],
    "qwen0.5b": [("qwen2.5-0.5b up 896→4864", 4864, 896)],
    "qwen7b": [("qwen2.5-7b up 3584→18944", 18944, 3584)],
}
GROUP_SIZE = 64


def best_ms(fn, budget_s: float = 0.4, most: int = 5) -> float:
    """Best of up to `most` runs after a warm-up, stopping once `budget_s` is spent."""
    start = time.perf_counter()
    mx.eval(fn())
    first = time.perf_counter() - start
    if first > budget_s:  # a slow cell: nothing to warm up (MLX compiles nothing on CPU)
        return first * 1000
    best, spent, runs = first, 0.0, 0
    while runs < most and (runs == 0 or spent < budget_s):
        start = time.perf_counter()
        mx.eval(fn())
        elapsed = time.perf_counter() - start
        best, spent, runs = min(best, elapsed), spent + elapsed, runs + 1
    return best * 1000


def builtin_call(weight: mx.array, bits: int):
    """The plain model of `bits` bits in MLX: one quantized layer, or the fp32 weight itself."""
    if bits <= 8:
        q, s, b = mx.quantize(weight, group_size=GROUP_SIZE, bits=bits)
        mx.eval(q, s, b)
        return lambda x: mx.quantized_matmul(x, q, s, b, transpose=True, group_size=GROUP_SIZE, bits=bits)
    return lambda x: x @ weight.T


def make_routes(planes, plane_bits, weight) -> dict:
    """The timed calls for one plane set: name → fn(x)."""
    n = len(plane_bits)
    routes = {
        "reference": lambda x: nested.reference_nested_matmul(x, planes, plane_bits, GROUP_SIZE, n),
        "mx dense": lambda x: nested_cpu.dense_nested_matmul(
            x, planes, plane_bits, GROUP_SIZE, n, use_numpy=False
        ),
        "blas dense": lambda x: nested_cpu.dense_nested_matmul(
            x, planes, plane_bits, GROUP_SIZE, n, use_numpy=True
        ),
        "auto": lambda x: nested.nested_matmul(x, planes, plane_bits, GROUP_SIZE, n),
        "builtin": builtin_call(weight, sum(plane_bits)),
    }
    if nested.kernel_available():
        routes["metal"] = lambda x: nested.metal_nested_matmul(x, planes, plane_bits, GROUP_SIZE, n)
    return routes


def bench_shape(label, out_dims, in_dims, rows_list, plane_sets, budget) -> list[list[str]]:
    """Table rows for one layer shape."""
    table = []
    top = max(plane_sets, key=len)
    planes = nested.synthetic_planes(out_dims, in_dims, top, GROUP_SIZE)
    weight = nested_cpu.dense_weight(planes, top, GROUP_SIZE, len(top))  # a stand-in fp32 source
    mx.eval(weight)
    for plane_bits in plane_sets:
        if plane_bits != top[: len(plane_bits)]:
            planes = nested.synthetic_planes(out_dims, in_dims, plane_bits, GROUP_SIZE)
        routes = make_routes(planes, plane_bits, weight)
        last: dict[str, tuple[int, float]] = {}
        for rows in rows_list:
            x = mx.random.normal((rows, in_dims), key=mx.random.key(rows))
            mx.eval(x)
            cells = {}
            for name, fn in routes.items():
                if name == "metal" and rows > nested.METAL_MAX_ROWS:
                    cells[name] = "-"
                    continue
                if name in last and last[name][1] * rows / last[name][0] > budget * 1000:
                    cells[name] = "-"
                    continue
                ms = best_ms(lambda fn=fn, x=x: fn(x))
                last[name] = (rows, ms)
                cells[name] = f"{ms:.2f}"
            ref, auto = last.get("reference"), last.get("auto")
            fresh = ref and auto and ref[0] == auto[0] == rows
            speedup = f"{ref[1] / auto[1]:.1f}x" if fresh else "-"
            table.append(
                [
                    label,
                    "+".join(map(str, plane_bits)),
                    str(rows),
                    *[cells.get(k, "") for k in routes],
                    nested_cpu.cpu_route(rows, len(plane_bits)) if not current_route().on_gpu else "gpu",
                    speedup,
                ]
            )
            print(" | ".join(table[-1]), flush=True)
    return table


def main() -> None:
    """Parse arguments, run every shape, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="smollm2,qwen0.5b,qwen7b")
    parser.add_argument("--rows", default="1,8,37,200")
    parser.add_argument("--planes", default="4,4+4,4+4+8")
    parser.add_argument(
        "--cell-budget",
        type=float,
        default=3.0,
        help="skip a cell predicted to take longer than this (seconds)",
    )
    args = parser.parse_args()
    rows_list = [int(r) for r in args.rows.split(",")]
    plane_sets = [tuple(int(b) for b in p.split("+")) for p in args.planes.split(",")]
    start = time.perf_counter()
    print(f"device {mx.default_device()}, MLX {mx.__version__}; CPU rule: {nested_cpu.describe_cpu_rule()}")
    header = ["layer", "planes", "rows", "reference", "mx dense", "blas dense", "auto", "builtin"]
    header += ["metal"] if nested.kernel_available() else []
    print(" | ".join(header + ["route", "auto vs ref"]))
    for key in args.shapes.split(","):
        for label, out_dims, in_dims in SHAPES[key]:
            bench_shape(label, out_dims, in_dims, rows_list, plane_sets, args.cell_budget)
    print(f"(ms, best of ≤5; total {time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
