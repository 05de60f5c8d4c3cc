"""NumPy's BLAS on a few rows: one sgemm against one sgemv per row, over a model's layer shapes.

x (rows, in) · Wᵀ with W a resident fp32 (out, in) weight, as our CPU route for a quantized linear
computed it before it kept Wᵀ (bench_threads.py --layout compares the two), on one BLAS thread.
OpenBLAS's sgemm is slow for a handful of rows (a 2-row product can cost several 1-row ones), which
is what a verification pass of 1-3 drafted tokens or a short catch-up feeds it. Median ms per call
over rounds, the routes interleaved.

    uv run python bench/bench_small_rows.py [--shapes OUTxIN,…] [--rows 1,2,3,4,5,6,8,16]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
from bench_row_routes import timed_ms  # this folder is on sys.path when run as a script
from bench_threads import row_by_row

from mlxswitch.kernels._common import single_threaded_blas

QWEN_1_5B = "256x1536,1536x1536,8960x1536,1536x8960"  # k/v, q/o, gate/up, down of Qwen2.5-1.5B


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default=QWEN_1_5B, help="OUTxIN,… (default: Qwen2.5-1.5B's linears)")
    parser.add_argument("--rows", default="1,2,3,4,5,6,8,16")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print("layer | rows | sgemm ms | sgemv per row ms | per row / sgemm")
    with single_threaded_blas():
        for shape in args.shapes.split(","):
            out_dims, in_dims = (int(v) for v in shape.split("x"))
            weight = rng.standard_normal((out_dims, in_dims), dtype=np.float32)
            for rows in (int(r) for r in args.rows.split(",")):
                x = rng.standard_normal((rows, in_dims), dtype=np.float32)
                assert np.allclose(x @ weight.T, row_by_row(x, weight), rtol=1e-4, atol=1e-3)
                gemm, gemv = [], []
                for _ in range(args.rounds):
                    gemm.append(timed_ms(lambda x=x, w=weight: x @ w.T, args.repeats))
                    gemv.append(timed_ms(lambda x=x, w=weight: row_by_row(x, w), args.repeats))
                a, b = statistics.median(gemm), statistics.median(gemv)
                print(f"{out_dims}×{in_dims} | {rows} | {a:.3f} | {b:.3f} | {b / a:.2f}", flush=True)


if __name__ == "__main__":
    main()
