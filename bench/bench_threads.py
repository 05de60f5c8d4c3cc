"""BLAS threads on the CPU route: one vs every core, by row count, on a model's own layer shapes.

    uv run python bench/bench_threads.py [--shapes qwen1.5b] [--rounds 7]
        [--padding | --layout | --panels | --small-rows]

The resident fp32 route multiplies rows by each layer's weight, kept transposed (in × out),
through NumPy's OpenBLAS (kernels/nested_cpu.py). A one-row step is a mat-vec (memory-bound), a
prefill, a check or a catch-up is a matrix product (compute-bound on one core here). This times
both thread counts on the same arrays, interleaved round by round, best of the rounds, summed over
one decoder layer's linears (and the output head), and prints each row count's time as a multiple of one row.
With --padding it compares instead, on every core, products whose rows are zero-padded to a
multiple of nested_cpu.SGEMM_ROW_MULTIPLE (the route's) against the same products unpadded.
With --layout it compares, on every core, the route (Wᵀ kept) against the out × in layout it kept
before (`out_by_in_rows_times` here), each with its own sgemv/sgemm rule.
With --panels it compares, on every core, NumPy's BLAS on Wᵀ (MLXSWITCH_KERNELS=blas) against the
compiled panel kernel on W in panels (kernels/panel_cpu.py, the route under "auto").
With --small-rows it compares, on one BLAS thread, one sgemm of a few rows against one sgemv a row
(W kept out × in) on each distinct linear shape: OpenBLAS's sgemm is slow for a handful of rows
(a 2-row product can cost several 1-row ones), what a check of 1-3 drafted tokens feeds it; the
mean ms of 10 calls after a warm-up, the median of the rounds (it was bench/bench_small_rows.py).
Run it alone: a timing taken while another process shares the cores is not a measurement.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from mlxswitch.kernels import nested_cpu
from mlxswitch.kernels._common import _openblas_threads, available_cores, single_threaded_blas
from mlxswitch.kernels.nested_cpu import resident_rows_times, sgemm_rows
from mlxswitch.kernels.panel_cpu import build_panel_kernel, panel_copy

# (out, in) of one decoder layer's linears and the head: Qwen2.5-Coder-1.5B and -0.5B.
SHAPES = {
    "qwen1.5b": [
        (1536, 1536),
        (256, 1536),
        (256, 1536),
        (1536, 1536),
        (8960, 1536),
        (8960, 1536),
        (1536, 8960),
        (151936 // 8, 1536),
    ],  # the head, an eighth of it (memory)
    "qwen0.5b": [
        (896, 896),
        (128, 896),
        (128, 896),
        (896, 896),
        (4864, 896),
        (4864, 896),
        (896, 4864),
        (151936 // 8, 896),
    ],
}
ROWS = (1, 2, 3, 4, 5, 8, 12, 16, 24, 33, 64)
PADDING_ROWS = (1, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 16, 17, 19, 20, 24, 33, 36)
LAYOUT_ROWS = (1, 2, 3, 4, 5, 6, 8, 9, 12, 13, 16, 24, 33, 48, 64)
OPENBLAS_SPIN_S = 0.3  # longer than OpenBLAS's workers spin after a product before they sleep
BACK_TO_BACK = 3
PANEL_ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 24, 33, 47, 64, 128)
SMALL_ROWS = (1, 2, 3, 4, 5, 6, 8, 16)
SMALL_ROWS_CALLS = 10
# The rule of the out × in layout the resident route kept before: one sgemv a row up to 3 rows,
# where its sgemm was slow (--small-rows below, bench/results/small-rows-qwen1.5b.txt).
OUT_BY_IN_GEMV_MAX_ROWS = 3


def row_by_row(xs: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """xs · Wᵀ (W: out × in) as one sgemv a row."""
    out = np.empty((xs.shape[0], weight.shape[0]), dtype=np.result_type(xs, weight))
    for i, row in enumerate(xs):
        np.matmul(weight, row, out=out[i])
    return out


def out_by_in_rows_times(xs: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """xs · Wᵀ on W kept out × in, by the rule the resident route had for that layout."""
    return row_by_row(xs, weight) if 1 < xs.shape[0] <= OUT_BY_IN_GEMV_MAX_ROWS else sgemm_rows(xs, weight)


def _time_rows(weights_t, xs_by_rows, rows: int, product=resident_rows_times) -> float:
    started = time.perf_counter()
    for x, w in zip(xs_by_rows[rows], weights_t, strict=True):
        product(x, w)
    return time.perf_counter() - started


def compare_layout(weights, rounds: int, rng) -> None:
    """The route (Wᵀ kept, in × out) against W as out × in, every core, interleaved, best of rounds."""
    weights_t = [np.ascontiguousarray(w.T) for w in weights]
    xs = {r: [rng.standard_normal((r, w.shape[1]), dtype=np.float32) for w in weights] for r in LAYOUT_ROWS}
    arms = {"out × in": (weights, out_by_in_rows_times), "route": (weights_t, resident_rows_times)}
    best = {(a, r): float("inf") for a in arms for r in LAYOUT_ROWS}
    for _ in range(rounds):
        for rows in LAYOUT_ROWS:
            for arm, (ws, product) in arms.items():
                best[(arm, rows)] = min(best[(arm, rows)], _time_rows(ws, xs, rows, product))
    print(f"{'rows':>5s}{'out×in ms':>12s}{'× 1 row':>9s}{'route ms':>12s}{'× 1 row':>9s}{'gain':>7s}")
    one = best[("out × in", 1)]
    for rows in LAYOUT_ROWS:
        old, new = best[("out × in", rows)], best[("route", rows)]
        print(f"{rows:5d}{1e3 * old:12.2f}{old / one:9.2f}{1e3 * new:12.2f}{new / one:9.2f}{old / new:7.2f}")


def compare_panels(weights, rounds: int, rng) -> None:
    """NumPy's BLAS on Wᵀ against the panel kernel, every core, interleaved, best of rounds."""
    build = build_panel_kernel()
    if build.kernel is None:
        raise SystemExit(f"the panel kernel did not build: {build.detail}")
    kernel, threads = build.kernel, available_cores()
    panels = [panel_copy(lambda r0, r1, w=w: w[r0:r1], *w.shape) for w in weights]
    weights_t = [np.ascontiguousarray(w.T) for w in weights]
    xs = {r: [rng.standard_normal((r, w.shape[1]), dtype=np.float32) for w in weights] for r in PANEL_ROWS}
    arms = {
        "blas": (weights_t, resident_rows_times),
        "panels": (panels, lambda x, p: kernel.times(x, p, threads)),
    }
    best = {(a, r): float("inf") for a in arms for r in PANEL_ROWS}
    for _ in range(rounds):
        for rows in PANEL_ROWS:
            for arm, (ws, product) in arms.items():
                # OpenBLAS's workers spin for a while after a product and would take the panel
                # threads' cores; a decoding step on the panel route makes no BLAS call at all.
                # Then passes back to back, as decoding runs them (the first wakes the threads).
                time.sleep(OPENBLAS_SPIN_S)
                for _ in range(BACK_TO_BACK):
                    best[(arm, rows)] = min(best[(arm, rows)], _time_rows(ws, xs, rows, product))
    print(f"kernel: {build.detail}")
    print(f"{'rows':>5s}{'blas ms':>10s}{'× 1 row':>9s}{'panels ms':>11s}{'× 1 row':>9s}{'gain':>7s}")
    one = best[("blas", 1)]
    for rows in PANEL_ROWS:
        old, new = best[("blas", rows)], best[("panels", rows)]
        print(f"{rows:5d}{1e3 * old:10.2f}{old / one:9.2f}{1e3 * new:11.2f}{new / one:9.2f}{old / new:7.2f}")


def compare_small_rows(weights, rounds: int, rng) -> None:
    """One sgemm against one sgemv a row (W out × in), one BLAS thread, each distinct shape."""

    def mean_ms(call) -> float:
        call()  # a warm-up call
        started = time.perf_counter()
        for _ in range(SMALL_ROWS_CALLS):
            call()
        return (time.perf_counter() - started) / SMALL_ROWS_CALLS * 1e3

    print("layer | rows | sgemm ms | sgemv per row ms | per row / sgemm")
    shapes = list(dict.fromkeys(w.shape for w in weights[:-1]))  # the head (an eighth) left out
    with single_threaded_blas():
        for out_dims, in_dims in shapes:
            weight = rng.standard_normal((out_dims, in_dims), dtype=np.float32)
            for rows in SMALL_ROWS:
                x = rng.standard_normal((rows, in_dims), dtype=np.float32)
                assert np.allclose(x @ weight.T, row_by_row(x, weight), rtol=1e-4, atol=1e-3)
                gemm = [mean_ms(lambda x=x, w=weight: x @ w.T) for _ in range(rounds)]
                gemv = [mean_ms(lambda x=x, w=weight: row_by_row(x, w)) for _ in range(rounds)]
                a, b = statistics.median(gemm), statistics.median(gemv)
                print(f"{out_dims}×{in_dims} | {rows} | {a:.3f} | {b:.3f} | {b / a:.2f}", flush=True)


def compare_padding(weights, rounds: int, rng) -> None:
    """Padded (the route) against unpadded products on every core, interleaved, best of rounds."""
    multiple = nested_cpu.SGEMM_ROW_MULTIPLE
    xs = {r: [rng.standard_normal((r, w.shape[1]), dtype=np.float32) for w in weights] for r in PADDING_ROWS}
    weights_t = [np.ascontiguousarray(w.T) for w in weights]
    best = {(m, r): float("inf") for m in (1, multiple) for r in PADDING_ROWS}
    try:
        for _ in range(rounds):
            for rows in PADDING_ROWS:
                for m in (1, multiple):
                    nested_cpu.SGEMM_ROW_MULTIPLE = m
                    best[(m, rows)] = min(best[(m, rows)], _time_rows(weights_t, xs, rows))
    finally:
        nested_cpu.SGEMM_ROW_MULTIPLE = multiple
    head = f"{'rows':>5s}{'unpadded ms':>13s}{'× 1 row':>9s}{'route ms':>13s}{'× 1 row':>9s}{'gain':>7s}"
    print(head)
    for rows in PADDING_ROWS:
        plain, padded = best[(1, rows)], best[(multiple, rows)]
        one = best[(1, 1)]
        line = f"{rows:5d}{1e3 * plain:13.2f}{plain / one:9.2f}"
        print(line + f"{1e3 * padded:13.2f}{padded / one:9.2f}{plain / padded:7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="qwen1.5b", choices=sorted(SHAPES))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--padding", action="store_true", help="padded against unpadded rows, every core")
    parser.add_argument("--layout", action="store_true", help="Wᵀ kept (the route) against W, every core")
    parser.add_argument("--panels", action="store_true", help="BLAS on Wᵀ against the panel kernel")
    parser.add_argument("--small-rows", action="store_true", help="an sgemm against an sgemv a row")
    args = parser.parse_args()
    threads = _openblas_threads()
    if threads is None:
        raise SystemExit("NumPy's OpenBLAS thread setter was not found: nothing to compare")
    _, set_threads = threads
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal(shape, dtype=np.float32) for shape in SHAPES[args.shapes]]
    if args.small_rows:
        compare_small_rows(weights, args.rounds, rng)
        return
    if args.padding or args.layout or args.panels:
        set_threads(available_cores())
        print(
            f"shapes {args.shapes}: one decoder layer's linears + 1/8 of the head; best of {args.rounds}; "
            f"{available_cores()} threads"
        )
        compare = compare_padding if args.padding else compare_layout if args.layout else compare_panels
        compare(weights, args.rounds, rng)
        return
    weights = [np.ascontiguousarray(w.T) for w in weights]  # the route's layout
    counts = sorted({1, available_cores()})
    best = {(t, r): float("inf") for t in counts for r in ROWS}
    for _ in range(args.rounds):
        for rows in ROWS:
            for t in counts:
                set_threads(t)
                xs = [rng.standard_normal((rows, w.shape[0]), dtype=np.float32) for w in weights]
                started = time.perf_counter()
                for x, w in zip(xs, weights, strict=True):
                    resident_rows_times(x, w)
                best[(t, rows)] = min(best[(t, rows)], time.perf_counter() - started)
    print(f"shapes {args.shapes}: one decoder layer's linears + 1/8 of the head; best of {args.rounds}")
    print(f"{'rows':>5s}" + "".join(f"{f'{t} thr ms':>12s}{'× 1 row':>9s}" for t in counts) + f"{'gain':>7s}")
    for rows in ROWS:
        line = f"{rows:5d}"
        for t in counts:
            line += f"{1e3 * best[(t, rows)]:12.2f}{best[(t, rows)] / best[(t, 1)]:9.2f}"
        line += f"{best[(1, rows)] / best[(counts[-1], rows)]:7.2f}"
        print(line)


if __name__ == "__main__":
    main()
