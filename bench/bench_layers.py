"""The layer micro-benchmarks, one subcommand each: the products of one layer, and whole passes by row count.

    uv run [--extra qwen-coder] python bench/bench_layers.py SUBCOMMAND [options]
    uv run python bench/bench_layers.py SUBCOMMAND --help    # what it measures, its options

- nested: the nested-gear matmul routes per layer shape, row count and plane set;
- quant: the quantized kernel alone on the Qwen 1.5B's layer shapes, fp32 against int8 activations;
- routes: one-row (decode) routes for a quantized linear over a model's layer shapes;
- threads: NumPy's BLAS threads on the CPU route, one against every core, by row count (or its
  padding, layout, panel kernel and small-row comparisons);
- attention: NumPy attention on OpenBLAS's threads against one BLAS thread, a whole pass of k rows;
- rows: a whole model's pass by row count on the route this process resolved (what a check costs);
- steps: the pair's step costs side by side, each model's one-row step and the 1.5B's check;
- pipes: what the cores can do for int8 products (bench/pipes.c), and the Q4_K tiles' share of it.

attention, rows and steps (and routes, by default) load packaged Qwen models (`--extra qwen-coder`).
Run each alone: a timing taken while another process shares the cores is not a measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import mlx.core as mx
import numpy as np

from mlxswitch.kernels import nested, nested_cpu, quant_check, quant_cpu, quant_linear, quant_tiles
from mlxswitch.kernels._common import _openblas_threads, available_cores, single_threaded_blas
from mlxswitch.kernels.cbuild import compile_source
from mlxswitch.kernels.nested_cpu import resident_rows_times, sgemm_rows
from mlxswitch.kernels.panel_cpu import build_panel_kernel, panel_copy
from mlxswitch.kernels.quant_library import QuantKernel
from mlxswitch.kernels.quant_tiles import tiled_q6k_weight, tiled_weight
from mlxswitch.kernels.quant_weights import QuantWeight
from mlxswitch.kernels.route import current_route

Key = TypeVar("Key")

# ---------------------------------------------------------------- layer shapes


@dataclass(frozen=True)
class LayerWidths:
    """One decoder layer's widths: every shape table below is made of them."""

    label: str  # the model as the nested table names it
    hidden: int
    intermediate: int
    kv: int = 0  # the k and v projections' outputs: given for the Qwen pair, whose linears `threads` times


MODELS = {
    "smollm2": LayerWidths("smollm2", 576, 1536),
    "qwen0.5b": LayerWidths("qwen2.5-0.5b", 896, 4864, kv=128),
    "qwen1.5b": LayerWidths("qwen2.5-1.5b", 1536, 8960, kv=256),
    "qwen7b": LayerWidths("qwen2.5-7b", 3584, 18944),
}
QWEN_VOCAB = 151936
THREADS_MODELS = ("qwen0.5b", "qwen1.5b")
NESTED_PROJECTIONS = {"smollm2": ("up", "down"), "qwen0.5b": ("up",), "qwen7b": ("up",)}


def nested_layers(key: str) -> list[tuple[str, int, int]]:
    """(label, out, in) of the projections the nested table takes from one model."""
    widths = MODELS[key]
    out_in = {"up": (widths.intermediate, widths.hidden), "down": (widths.hidden, widths.intermediate)}
    return [
        (f"{widths.label} {name} {in_dims}→{out_dims}", out_dims, in_dims)
        for name in NESTED_PROJECTIONS[key]
        for out_dims, in_dims in [out_in[name]]
    ]


def decoder_linears(key: str) -> list[tuple[int, int]]:
    """(out, in) of one decoder layer's linears (q, k, v, o, gate, up, down) and an eighth of the
    head (memory): what `threads` multiplies."""
    h, i, kv = MODELS[key].hidden, MODELS[key].intermediate, MODELS[key].kv
    return [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i), (QWEN_VOCAB // 8, h)]


class QuantProduct(NamedTuple):
    """One of the 1.5B's quantized products, as `quant` times it."""

    name: str
    out_dims: int
    in_dims: int
    bits: int  # 8: born Q6_K (--tiles keeps its blocks; the int8 table quantizes it 8-bit affine)
    wide: bool  # int16 activations under --tiles, as the default takes its down projections
    count: int  # distinct weights cycled: as many as the 1.5B has layers of it


_QWEN15 = MODELS["qwen1.5b"]
# The 1.5B's 4-bit gate/up, down (4-bit: int16 activations on the default; its other 14, 8-bit
# from Q6_K), q/o projections and its 8-bit tied head (from Q6_K).
QUANT_PRODUCTS = (
    QuantProduct("gate/up", _QWEN15.intermediate, _QWEN15.hidden, 4, False, 28),
    QuantProduct("down 4-bit", _QWEN15.hidden, _QWEN15.intermediate, 4, True, 14),
    QuantProduct("down Q6_K", _QWEN15.hidden, _QWEN15.intermediate, 8, True, 14),
    QuantProduct("q/o", _QWEN15.hidden, _QWEN15.hidden, 4, False, 28),
    QuantProduct("head Q6_K", QWEN_VOCAB, _QWEN15.hidden, 8, False, 1),
)

# ---------------------------------------------------------------- timing


def seconds_of(call: Callable[[], object]) -> float:
    """Wall-clock seconds of one call."""
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def interleaved(samplers: dict[Key, Callable[[], float]], rounds: int) -> dict[Key, list[float]]:
    """Every sampler's figure once a round, in order, for `rounds` rounds: drift hits every arm alike."""
    samples: dict[Key, list[float]] = {key: [] for key in samplers}
    for _ in range(rounds):
        for key, sample in samplers.items():
            samples[key].append(sample())
    return samples


def mean_ms(call: Callable[[], object], calls: int) -> float:
    """Mean ms per call over `calls` calls, after one warm-up call."""
    call()
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - started) / calls * 1e3


def best_ms(fn: Callable[[], mx.array], budget_s: float = 0.4, most: int = 5) -> float:
    """Best of up to `most` evaluated runs after a warm-up, stopping once `budget_s` is spent."""
    first = seconds_of(lambda: mx.eval(fn()))
    if first > budget_s:  # a slow cell: nothing to warm up (MLX compiles nothing on CPU)
        return first * 1000
    best, spent, runs = first, 0.0, 0
    while runs < most and (runs == 0 or spent < budget_s):
        elapsed = seconds_of(lambda: mx.eval(fn()))
        best, spent, runs = min(best, elapsed), spent + elapsed, runs + 1
    return best * 1000


@contextlib.contextmanager
def restored(owner: object, *names: str) -> Iterator[None]:
    """Put `owner`'s named attributes back as they were when the block ends: arms patch them."""
    saved = {name: getattr(owner, name) for name in names}
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(owner, name, value)


# ---------------------------------------------------------------- options, kernels, models


def comma_list(text: str) -> list[str]:
    """The non-empty items of a comma-separated option."""
    return [item for item in text.split(",") if item]


def int_list(text: str) -> list[int]:
    """A comma-separated option of integers (row counts)."""
    return [int(item) for item in comma_list(text)]


def plane_sets(text: str) -> list[tuple[int, ...]]:
    """`4,4+4`: plane sets, comma-separated, each its planes' bits joined by `+`."""
    return [tuple(int(bits) for bits in item.split("+")) for item in comma_list(text)]


def built_quant_kernel(source: Path, check: bool) -> QuantKernel:
    """A build of quant_rows.c (kernel work), compiled into the kernel cache like the shipped one
    with quant_cpu.COMPILE_FLAGS as they are now; `check`: it must pass the shipped one's check."""
    built = compile_source(source, quant_cpu.COMPILE_FLAGS)
    assert not isinstance(built, str), built
    kernel = QuantKernel(built.library, built.flags)
    if check:
        assert quant_check.check_kernel(kernel) is None, source
    return kernel


# 16 tokens of a Qwen chat prompt's start, repeated to a cache's length.
PROMPT_IDS = [151644, 8948, 198, 2610, 525, 1207, 16948, 11, 3465, 553, 54364, 14817, 13, 1446, 525, 264]
QWEN_1_5B = "qwen2.5-coder-1.5b-instruct"
PAIR = ("0.5b", "1.5b")


def prompt(repeats: int) -> mx.array:
    """One sequence of PROMPT_IDS `repeats` times over."""
    return mx.array([PROMPT_IDS * repeats])


def load_packaged(name: str) -> Any:
    """A packaged model, loaded on this process's route (its LoadedModel)."""
    from mlxswitch.models.sources import load_model

    return load_model(f"package:{name}")


def load_pair() -> dict[str, Any]:
    """The Qwen pair's models by size, loaded as this process loads them now."""
    return {size: load_packaged(f"qwen2.5-coder-{size}-instruct").model for size in PAIR}


def prefill(model, ids: mx.array, wrap: Callable | None = None) -> tuple[list, float]:
    """A KV cache for `model` holding `ids` (mlx-lm's, or `wrap(model, cache)` of it), and the
    seconds of that prefill's pass."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    if wrap is not None:
        cache = wrap(model, cache)
    return cache, seconds_of(lambda: mx.eval(model(ids, cache=cache)))


def timed_pass(model, ids: mx.array, cache: list, rows: int) -> float:
    """Seconds of one evaluated pass of `rows` rows on the cache; the rows are trimmed off after."""
    from mlx_lm.models.cache import trim_prompt_cache

    spent = seconds_of(lambda: mx.eval(model(ids[:, :rows], cache=cache)))
    trim_prompt_cache(cache, rows)
    return spent


# ---------------------------------------------------------------- nested

NESTED_GROUP_SIZE = 64


def run_nested(args: argparse.Namespace) -> None:
    """Cost of the nested-gear matmul routes, per layer shape, row count and plane set.

    uv run python bench/bench_layers.py nested [--shapes smollm2,qwen0.5b,qwen7b] [--rows 1,8,37,200]
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
    start = time.perf_counter()
    print(f"device {mx.default_device()}, MLX {mx.__version__}; CPU rule: {nested_cpu.describe_cpu_rule()}")
    header = ["layer", "planes", "rows", "reference", "mx dense", "blas dense", "auto", "builtin"]
    header += ["metal"] if nested.kernel_available() else []
    print(" | ".join(header + ["route", "auto vs ref"]))
    for key in comma_list(args.shapes):
        for label, out_dims, in_dims in nested_layers(key):
            nested_shape(label, out_dims, in_dims, args.rows, args.planes, args.cell_budget)
    print(f"(ms, best of ≤5; total {time.perf_counter() - start:.0f} s)")


def builtin_call(weight: mx.array, bits: int) -> Callable[[mx.array], mx.array]:
    """The plain model of `bits` bits in MLX: one quantized layer, or the fp32 weight itself."""
    if bits <= 8:
        q, s, b = mx.quantize(weight, group_size=NESTED_GROUP_SIZE, bits=bits)
        mx.eval(q, s, b)
        return lambda x: mx.quantized_matmul(
            x, q, s, b, transpose=True, group_size=NESTED_GROUP_SIZE, bits=bits
        )
    return lambda x: x @ weight.T


def nested_routes(planes, plane_bits: tuple[int, ...], weight: mx.array) -> dict[str, Callable]:
    """The timed calls for one plane set: name → fn(x)."""
    active = (planes, plane_bits, NESTED_GROUP_SIZE, len(plane_bits))  # every plane of the set
    routes = {
        "reference": lambda x: nested.reference_nested_matmul(x, *active),
        "mx dense": lambda x: nested_cpu.dense_nested_matmul(x, *active, use_numpy=False),
        "blas dense": lambda x: nested_cpu.dense_nested_matmul(x, *active, use_numpy=True),
        "auto": lambda x: nested.nested_matmul(x, *active),
        "builtin": builtin_call(weight, sum(plane_bits)),
    }
    if nested.kernel_available():
        routes["metal"] = lambda x: nested.metal_nested_matmul(x, *active)
    return routes


def nested_shape(label: str, out_dims: int, in_dims: int, rows_list, sets, budget: float) -> None:
    """Print one layer shape's table rows: each plane set at each row count."""
    top = max(sets, key=len)
    top_planes = nested.synthetic_planes(out_dims, in_dims, top, NESTED_GROUP_SIZE)
    weight = nested_cpu.dense_weight(top_planes, top, NESTED_GROUP_SIZE, len(top))  # a stand-in fp32 source
    mx.eval(weight)
    for plane_bits in sets:
        planes = top_planes  # a prefix of the largest set shares its planes; any other set gets its own
        if plane_bits != top[: len(plane_bits)]:
            planes = nested.synthetic_planes(out_dims, in_dims, plane_bits, NESTED_GROUP_SIZE)
        routes = nested_routes(planes, plane_bits, weight)
        last: dict[str, tuple[int, float]] = {}  # route → (rows, ms) of its latest timed cell
        for rows in rows_list:
            cells = nested_cells(routes, rows, in_dims, last, budget)
            ref, auto = last.get("reference"), last.get("auto")
            fresh = ref and auto and ref[0] == auto[0] == rows
            speedup = f"{ref[1] / auto[1]:.1f}x" if fresh else "-"
            route = nested_cpu.cpu_route(rows, len(plane_bits)) if not current_route().on_gpu else "gpu"
            timed = [cells.get(name, "") for name in routes]
            planes_label = "+".join(map(str, plane_bits))
            print(" | ".join([label, planes_label, str(rows), *timed, route, speedup]), flush=True)


def nested_cells(routes: dict[str, Callable], rows: int, in_dims: int, last: dict, budget: float) -> dict:
    """One row count's cells: ms a route, "-" where skipped (predicted over budget from the route's
    latest cell, or Metal past its rows). Updates `last`."""
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
    return cells


def nested_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--shapes", default="smollm2,qwen0.5b,qwen7b", help=f"of {','.join(NESTED_PROJECTIONS)}"
    )
    parser.add_argument("--rows", type=int_list, default="1,8,37,200", help="row counts")
    parser.add_argument("--planes", type=plane_sets, default="4,4+4,4+4+8", help="plane sets")
    parser.add_argument(
        "--cell-budget",
        type=float,
        default=3.0,
        help="skip a cell predicted to take longer than this (seconds)",
    )


# ---------------------------------------------------------------- quant

QUANT_THREADS = 2


def run_quant(args: argparse.Namespace) -> None:
    """The quantized kernel alone on the Qwen 1.5B's layer shapes: fp32 against int8 activations.

    uv run python bench/bench_layers.py quant [--rows 1,2,4,8,16,33] [--sources a.c,b.c] [--wide]
    uv run python bench/bench_layers.py quant --tiles [--rows 1,4,8]

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
    sources = [Path(source) for source in comma_list(args.sources)] or [quant_cpu.SOURCE]
    kernels = [built_quant_kernel(source, check=False) for source in sources]
    if args.tiles:
        compare_tiles(kernels[0], args.rows, args.rounds)
        return
    rng = np.random.default_rng(0)
    names = ", ".join(source.name for source in sources)
    print(f"ms a product (min of {args.rounds} rounds), {QUANT_THREADS} threads; int8 per build: {names}")
    # (kernel, int8, int16) a column: fp32, then int8 on every build, then int16 where --wide
    wide = [(kernels[0], True, True)] if args.wide else []
    arms = [(kernels[0], False, False)] + [(kernel, True, False) for kernel in kernels] + wide
    labels = ["int8"] * len(kernels) + ["int16"] * len(wide)
    for product in QUANT_PRODUCTS:
        out_dims, in_dims, bits = product.out_dims, product.in_dims, product.bits
        weights = [random_affine_weight(rng, out_dims, in_dims, bits) for _ in range(product.count)]
        for rows in args.rows:
            x = rng.standard_normal((rows, in_dims)).astype(np.float32)
            samplers = {
                arm: partial(product_seconds, kernel, x, weights, int8=int8, wide=int16)
                for arm, (kernel, int8, int16) in enumerate(arms)
            }
            fp32, *integer = (1e3 * min(s) for s in interleaved(samplers, args.rounds).values())
            cells = "  ".join(
                f"{label} {ms:.2f} ({fp32 / ms:.2f}x)" for label, ms in zip(labels, integer, strict=True)
            )
            print(f"{out_dims}x{in_dims} {bits}-bit, {rows:2d} rows: fp32 {fp32:.2f}  {cells}", flush=True)


def product_seconds(kernel: QuantKernel, x: np.ndarray, weights: list, **options) -> float:
    """Seconds a product of x by each of `weights` in turn, averaged over them."""
    started = time.perf_counter()
    for weight in weights:
        kernel.times(x, weight, QUANT_THREADS, **options)
    return (time.perf_counter() - started) / len(weights)


def random_affine_weight(
    rng, out_dims: int, in_dims: int, bits: int, half_scales: bool = False
) -> QuantWeight:
    """A random weight quantized by MLX (groups of 32); `half_scales`: scales and biases narrowed
    to fp16, as the default loads them."""
    w = mx.array(rng.standard_normal((out_dims, in_dims)).astype(np.float32) * 0.02)
    q, scales, biases = mx.quantize(w, group_size=32, bits=bits)
    if half_scales:
        scales, biases = scales.astype(mx.float16), biases.astype(mx.float16)
    return QuantWeight.from_arrays(q, scales, biases, 32, bits)


def random_q6k_weight(rng, out_dims: int, in_dims: int) -> QuantWeight:
    """Random Q6_K blocks (210 bytes per 256 inputs), their fp16 scale small, read as stored."""
    blocks = rng.integers(0, 256, size=(out_dims, in_dims // 256, 210), dtype=np.uint8)
    d = (rng.standard_normal(blocks.shape[:2]) * 1e-3).astype(np.float16)
    blocks[..., 208:] = d.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return QuantWeight.from_q6k(mx.array(blocks.reshape(out_dims, -1)), in_dims)


def compare_tiles(kernel: QuantKernel, rows_list: list[int], rounds: int) -> None:
    """--tiles: each shape's weights laid out as tiles against MLX's layout (few-row path)."""
    rng = np.random.default_rng(0)
    arms = "as stored | as tiles"
    print(f"ms a product (min of {rounds} rounds, arms interleaved), {QUANT_THREADS} threads: {arms}")
    for product in QUANT_PRODUCTS:
        name, out_dims, in_dims = product.name, product.out_dims, product.in_dims
        stored, tiles = [], []
        for _ in range(product.count):
            if product.bits == 8:  # born Q6_K
                weight = random_q6k_weight(rng, out_dims, in_dims)
                tiled = tiled_q6k_weight(kernel, weight)
            else:
                weight = random_affine_weight(rng, out_dims, in_dims, 4, half_scales=True)
                tiled = tiled_weight(kernel, weight)
            stored.append(weight)
            tiles.append(tiled)
        for rows in rows_list:
            x = rng.standard_normal((rows, in_dims)).astype(np.float32)
            # many_from past the rows: the few-row path, as a decoding pass takes them
            options = {"many_from": rows + 1, "int8": True, "wide": product.wide}
            samplers = {
                arm: partial(product_seconds, kernel, x, ws, **options)
                for arm, ws in [("stored", stored), ("tiles", tiles)]
            }
            before, after = (1e3 * min(s) for s in interleaved(samplers, rounds).values())
            shape = f"{name} {out_dims}x{in_dims}, {rows:2d} rows"
            print(f"{shape}: {before:.2f} | {after:.2f} ({before / after:.2f}x)", flush=True)


def quant_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int_list, default="1,2,4,8,16,33", help="row counts")
    parser.add_argument(
        "--sources", default="", help="builds of quant_rows.c, comma-separated (default: the shipped one)"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--wide", action="store_true", help="an arm on int16 activations")
    parser.add_argument("--tiles", action="store_true", help="tiles laid out at load against MLX's layout")


# ---------------------------------------------------------------- routes

ROUTE_CALLS = 10


def run_routes(args: argparse.Namespace) -> None:
    """One-row (decode) routes for a quantized linear on this machine, over a model's layer shapes.

    For each distinct (out, in, bits) of the model's quantized linears, x (1 row, fp32) · Wᵀ by:
    MLX's quantized mat-vec (what decoding uses), MLX's dense fp32 matmul on the dequantized weight,
    and NumPy's BLAS on the same fp32 weight (the dense routes hold 4 bytes a parameter instead of
    ~0.6). Median ms per call over rounds, interleaved; GB/s of weight bytes each route reads.

        uv run python bench/bench_layers.py routes --model package:qwen2.5-coder-1.5b-instruct
    """
    import mlx.nn as nn

    from mlxswitch.models.sources import load_model

    loaded = load_model(args.model)
    shapes: dict[tuple, nn.Module] = {}
    for _, module in loaded.model.named_modules():
        # Q6_K blocks read as stored (a converted GGUF's) have no affine planes for MLX's routes
        if isinstance(module, nn.QuantizedLinear) and hasattr(module, "scales"):
            shapes.setdefault(
                (module.weight.shape[0], module.weight.shape[1] * 32 // module.bits, module.bits), module
            )
    rows = []
    for (out_dim, in_dim, bits), layer in sorted(shapes.items()):
        rows += time_row_routes(layer, out_dim, in_dim, bits, args.rounds, args.repeats)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"command": args.command_line, "rows": rows}, handle, indent=1)


def time_row_routes(layer, out_dim: int, in_dim: int, bits: int, rounds: int, repeats: int) -> list[dict]:
    """Print and return the three routes' figures on one layer."""
    dense = mx.dequantize(layer.weight, layer.scales, layer.biases, group_size=layer.group_size, bits=bits)
    dense_np = np.array(dense)
    x = mx.random.normal((1, in_dim))
    x_np = np.array(x)
    quantized = partial(mx.quantized_matmul, transpose=True, group_size=layer.group_size, bits=bits)
    routes: dict[str, Callable[[], object]] = {
        "mlx quantized mat-vec": lambda: mx.eval(quantized(x, layer.weight, layer.scales, layer.biases)),
        "mlx dense fp32": lambda: mx.eval(x @ dense.T),
        "numpy fp32 (BLAS)": lambda: x_np @ dense_np.T,
    }
    samples = interleaved({route: partial(mean_ms, call, repeats) for route, call in routes.items()}, rounds)
    quantized_bytes = layer.weight.nbytes + layer.scales.nbytes + layer.biases.nbytes
    rows = []
    for route, times in samples.items():
        ms = statistics.median(times)
        read = quantized_bytes if route.startswith("mlx quantized") else dense_np.nbytes
        rows.append(
            {"shape": [out_dim, in_dim], "bits": bits, "route": route, "ms": ms, "gb_per_s": read / ms / 1e6}
        )
        print(f"{out_dim:>7}×{in_dim:<5} {bits}-bit  {route:<22} {ms:8.3f} ms  {read / ms / 1e6:6.2f} GB/s")
    return rows


def routes_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=f"package:{QWEN_1_5B}", help="a model source")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=ROUTE_CALLS, help="calls a round, their mean taken")
    parser.add_argument("--json", help="also write the figures here")


# ---------------------------------------------------------------- threads

THREAD_ROWS = (1, 2, 3, 4, 5, 8, 12, 16, 24, 33, 64)
PADDING_ROWS = (1, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 16, 17, 19, 20, 24, 33, 36)
LAYOUT_ROWS = (1, 2, 3, 4, 5, 6, 8, 9, 12, 13, 16, 24, 33, 48, 64)
OPENBLAS_SPIN_S = 0.3  # longer than OpenBLAS's workers spin after a product before they sleep
BACK_TO_BACK = 3
PANEL_ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 24, 33, 47, 64, 128)
SMALL_ROWS = (1, 2, 3, 4, 5, 6, 8, 16)
SMALL_ROWS_CALLS = 10
# The rule of the out × in layout the resident route kept before: one sgemv a row up to 3 rows,
# where its sgemm was slow (--small-rows below, git show 824b46b:bench/results/small-rows-qwen1.5b.txt).
OUT_BY_IN_GEMV_MAX_ROWS = 3


def run_threads(args: argparse.Namespace) -> None:
    """BLAS threads on the CPU route: one vs every core, by row count, on a model's own layer shapes.

    uv run python bench/bench_layers.py threads [--shapes qwen1.5b] [--rounds 7]
        [--padding | --layout | --panels | --small-rows]

    The resident fp32 route multiplies rows by each layer's weight, kept transposed (in × out),
    through NumPy's OpenBLAS (kernels/nested_cpu.py). A one-row step is a mat-vec (memory-bound), a
    prefill, a check or a catch-up is a matrix product (compute-bound on one core here). This times
    both thread counts on the same arrays, interleaved round by round, best of the rounds, summed over
    one decoder layer's linears (and the output head), and prints each row count's time as a multiple
    of one row.
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
    threads = _openblas_threads()
    if threads is None:
        raise SystemExit("NumPy's OpenBLAS thread setter was not found: nothing to compare")
    _, set_threads = threads
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal(shape, dtype=np.float32) for shape in decoder_linears(args.shapes)]
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
    best, counts = time_thread_counts(weights, args.rounds, rng, set_threads)
    print(f"shapes {args.shapes}: one decoder layer's linears + 1/8 of the head; best of {args.rounds}")
    print_thread_counts(best, counts)


def layer_seconds(xs: list[np.ndarray], weights: list, product=resident_rows_times) -> float:
    """Seconds of one product per (rows, weight) pair: a decoder layer's linears."""
    started = time.perf_counter()
    for x, w in zip(xs, weights, strict=True):
        product(x, w)
    return time.perf_counter() - started


def random_rows(rng, weights: list[np.ndarray], rows_list) -> dict[int, list[np.ndarray]]:
    """Row count → one random fp32 input a weight (W: out × in)."""
    return {r: [rng.standard_normal((r, w.shape[1]), dtype=np.float32) for w in weights] for r in rows_list}


def row_by_row(xs: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """xs · Wᵀ (W: out × in) as one sgemv a row."""
    out = np.empty((xs.shape[0], weight.shape[0]), dtype=np.result_type(xs, weight))
    for i, row in enumerate(xs):
        np.matmul(weight, row, out=out[i])
    return out


def out_by_in_rows_times(xs: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """xs · Wᵀ on W kept out × in, by the rule the resident route had for that layout."""
    return row_by_row(xs, weight) if 1 < xs.shape[0] <= OUT_BY_IN_GEMV_MAX_ROWS else sgemm_rows(xs, weight)


def print_against(before: tuple[str, int, dict], after: tuple[str, int, dict]) -> None:
    """A table of two arms by row count: ms, × the first arm's one row, and the second's gain."""
    (old_head, old_width, old), (new_head, new_width, new) = before, after
    one_row = f"{'× 1 row':>9s}"
    print(f"{'rows':>5s}{old_head:>{old_width}s}{one_row}{new_head:>{new_width}s}{one_row}{'gain':>7s}")
    one = old[1]
    for rows, then in old.items():
        now = new[rows]
        print(
            f"{rows:5d}{1e3 * then:{old_width}.2f}{then / one:9.2f}"
            f"{1e3 * now:{new_width}.2f}{now / one:9.2f}{then / now:7.2f}"
        )


def best_by_rows(samples: dict[tuple[str, int], list[float]], arm: str) -> dict[int, float]:
    """Row count → the best of one arm's rounds."""
    return {rows: min(s) for (name, rows), s in samples.items() if name == arm}


def time_thread_counts(
    weights, rounds: int, rng, set_threads: Callable[[int], object]
) -> tuple[dict, list[int]]:
    """(threads, rows) → the best of rounds, and the thread counts: one BLAS thread against every
    core on the route's layout (Wᵀ), interleaved."""
    weights = [np.ascontiguousarray(w.T) for w in weights]  # the route's layout
    counts = sorted({1, available_cores()})

    def sample(threads: int, rows: int) -> float:
        set_threads(threads)
        xs = [rng.standard_normal((rows, w.shape[0]), dtype=np.float32) for w in weights]  # fresh each round
        return layer_seconds(xs, weights)

    samples = interleaved(
        {(t, rows): partial(sample, t, rows) for rows in THREAD_ROWS for t in counts}, rounds
    )
    return {key: min(s) for key, s in samples.items()}, counts


def print_thread_counts(best: dict[tuple[int, int], float], counts: list[int]) -> None:
    """Each row count's time a thread count, as a multiple of its one row, and every core's gain."""
    print(f"{'rows':>5s}" + "".join(f"{f'{t} thr ms':>12s}{'× 1 row':>9s}" for t in counts) + f"{'gain':>7s}")
    for rows in THREAD_ROWS:
        line = f"{rows:5d}"
        for t in counts:
            line += f"{1e3 * best[(t, rows)]:12.2f}{best[(t, rows)] / best[(t, 1)]:9.2f}"
        line += f"{best[(1, rows)] / best[(counts[-1], rows)]:7.2f}"
        print(line)


def compare_layout(weights, rounds: int, rng) -> None:
    """The route (Wᵀ kept, in × out) against W as out × in, every core, interleaved, best of rounds."""
    weights_t = [np.ascontiguousarray(w.T) for w in weights]
    xs = random_rows(rng, weights, LAYOUT_ROWS)
    arms = {"out × in": (weights, out_by_in_rows_times), "route": (weights_t, resident_rows_times)}
    samplers = {
        (arm, rows): partial(layer_seconds, xs[rows], ws, product)
        for rows in LAYOUT_ROWS
        for arm, (ws, product) in arms.items()
    }
    samples = interleaved(samplers, rounds)
    print_against(
        ("out×in ms", 12, best_by_rows(samples, "out × in")), ("route ms", 12, best_by_rows(samples, "route"))
    )


def compare_panels(weights, rounds: int, rng) -> None:
    """NumPy's BLAS on Wᵀ against the panel kernel, every core, interleaved, best of rounds."""
    build = build_panel_kernel()
    if build.kernel is None:
        raise SystemExit(f"the panel kernel did not build: {build.detail}")
    kernel, threads = build.kernel, available_cores()
    panels = [panel_copy(lambda r0, r1, w=w: w[r0:r1], *w.shape) for w in weights]
    weights_t = [np.ascontiguousarray(w.T) for w in weights]
    xs = random_rows(rng, weights, PANEL_ROWS)
    arms = {
        "blas": (weights_t, resident_rows_times),
        "panels": (panels, lambda x, p: kernel.times(x, p, threads)),
    }

    def sample(ws, product, rows: int) -> float:
        # OpenBLAS's workers spin for a while after a product and would take the panel
        # threads' cores; a decoding step on the panel route makes no BLAS call at all.
        # Then passes back to back, as decoding runs them (the first wakes the threads).
        time.sleep(OPENBLAS_SPIN_S)
        return min(layer_seconds(xs[rows], ws, product) for _ in range(BACK_TO_BACK))

    samplers = {(arm, rows): partial(sample, *arms[arm], rows) for rows in PANEL_ROWS for arm in arms}
    samples = interleaved(samplers, rounds)
    print(f"kernel: {build.detail}")
    print_against(
        ("blas ms", 10, best_by_rows(samples, "blas")), ("panels ms", 11, best_by_rows(samples, "panels"))
    )


def compare_small_rows(weights, rounds: int, rng) -> None:
    """One sgemm against one sgemv a row (W out × in), one BLAS thread, each distinct shape."""
    print("layer | rows | sgemm ms | sgemv per row ms | per row / sgemm")
    shapes = list(dict.fromkeys(w.shape for w in weights[:-1]))  # the head (an eighth) left out
    with single_threaded_blas():
        for out_dims, in_dims in shapes:
            weight = rng.standard_normal((out_dims, in_dims), dtype=np.float32)
            for rows in SMALL_ROWS:
                x = rng.standard_normal((rows, in_dims), dtype=np.float32)
                assert np.allclose(x @ weight.T, row_by_row(x, weight), rtol=1e-4, atol=1e-3)
                # each arm's rounds together, not interleaved: as the script it was measured
                gemm = [mean_ms(lambda x=x, w=weight: x @ w.T, SMALL_ROWS_CALLS) for _ in range(rounds)]
                gemv = [
                    mean_ms(lambda x=x, w=weight: row_by_row(x, w), SMALL_ROWS_CALLS) for _ in range(rounds)
                ]
                a, b = statistics.median(gemm), statistics.median(gemv)
                print(f"{out_dims}×{in_dims} | {rows} | {a:.3f} | {b:.3f} | {b / a:.2f}", flush=True)


def compare_padding(weights, rounds: int, rng) -> None:
    """Padded (the route) against unpadded products on every core, interleaved, best of rounds."""
    multiple = nested_cpu.SGEMM_ROW_MULTIPLE
    xs = random_rows(rng, weights, PADDING_ROWS)
    weights_t = [np.ascontiguousarray(w.T) for w in weights]

    def sample(row_multiple: int, rows: int) -> float:
        nested_cpu.SGEMM_ROW_MULTIPLE = row_multiple
        return layer_seconds(xs[rows], weights_t)

    with restored(nested_cpu, "SGEMM_ROW_MULTIPLE"):
        samplers = {(m, rows): partial(sample, m, rows) for rows in PADDING_ROWS for m in (1, multiple)}
        samples = interleaved(samplers, rounds)
    unpadded = {rows: min(s) for (m, rows), s in samples.items() if m == 1}
    padded = {rows: min(s) for (m, rows), s in samples.items() if m == multiple}
    print_against(("unpadded ms", 13, unpadded), ("route ms", 13, padded))


def threads_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shapes", default="qwen1.5b", choices=THREADS_MODELS)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--padding", action="store_true", help="padded against unpadded rows, every core")
    parser.add_argument("--layout", action="store_true", help="Wᵀ kept (the route) against W, every core")
    parser.add_argument("--panels", action="store_true", help="BLAS on Wᵀ against the panel kernel")
    parser.add_argument("--small-rows", action="store_true", help="an sgemm against an sgemv a row")


# ---------------------------------------------------------------- attention

ATTENTION_ROWS = (1, 2, 4, 8, 12, 16)
ATTENTION_ARMS = {
    "threaded BLAS (before)": contextlib.nullcontext,
    "one BLAS thread (after)": single_threaded_blas,
}


def run_attention(args: argparse.Namespace) -> None:
    """NumPy attention on OpenBLAS's threads against one BLAS thread: a whole pass of k rows.

    uv run --extra qwen-coder python bench/bench_layers.py attention [--rounds 3]

    The Qwen2.5-Coder 1.5B on this process's route; after a 96-token prefill, passes of k rows are
    fed on the KV cache and trimmed off again, the two arms interleaved round by round, the minimum
    printed. "after" is models/cpu_blocks.py as it is (steps and checks on one BLAS thread);
    "before" swaps its single_threaded_blas for a null context (OpenBLAS's own threads).
    Record: bench/results/attention-threads-qwen.txt.
    """
    from mlxswitch.models import cpu_blocks

    model = load_packaged(QWEN_1_5B).model
    ids = prompt(6)
    cache, _ = prefill(model, ids)

    def sample(context, rows: int) -> float:
        cpu_blocks.single_threaded_blas = context  # type: ignore[assignment]
        return timed_pass(model, ids, cache, rows)

    print(f"1.5B, a pass of k rows on a 96-token cache, min of {args.rounds}, arms interleaved")
    with restored(cpu_blocks, "single_threaded_blas"):
        for rows in ATTENTION_ROWS:
            samplers = {name: partial(sample, context, rows) for name, context in ATTENTION_ARMS.items()}
            best = {name: min(s) for name, s in interleaved(samplers, args.rounds).items()}
            print(f"{rows:3d} rows: " + "  ".join(f"{name} {1e3 * s:.0f} ms" for name, s in best.items()))


def attention_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=3)


# ---------------------------------------------------------------- rows

PASS_ROWS = (1, 2, 3, 4, 6, 8, 16, 32)


def run_rows(args: argparse.Namespace) -> None:
    """A whole model's pass by row count, on the route this process resolved: what a check costs.

    uv run --extra qwen-coder python bench/bench_layers.py rows [--model NAME]           # quantized kernel
    MLXSWITCH_KERNELS=fp32 uv run --extra qwen-coder python bench/bench_layers.py rows   # fp32 copies

    After a 96-token prefill, passes of k rows are fed on the KV cache and trimmed off again, the row
    counts interleaved round by round; the median of the rounds is printed, and each as a multiple of
    the one-row pass (a decoding step). The caches are the engine's (decoding_caches: a decoding
    pass's keys and values kept in NumPy, its body in one call where the route has it), so a pass
    costs what the engine's step or check does. Run the settings one after another, alone.
    """
    from mlxswitch.models.cpu_blocks import decoding_caches

    started = time.perf_counter()
    loaded = load_packaged(args.model)
    load_seconds = time.perf_counter() - started
    model = loaded.model
    ids = prompt(6)
    cache, prefill_seconds = prefill(model, ids, decoding_caches)
    samplers = {rows: partial(timed_pass, model, ids, cache, rows) for rows in PASS_ROWS}
    seconds = interleaved(samplers, args.rounds)
    route = current_route()
    print(
        f"{args.model}: kernels={route.kernels}, linears {loaded.linears}, resident product "
        f"{route.resident_product}, {route.blas_threads} threads; median of {args.rounds} rounds"
    )
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB on Linux
    print(f"load {load_seconds:.1f} s (conversion cached), peak RSS {peak_rss:.2f} GB")
    print(f"prefill of {ids.shape[1]} tokens: {1e3 * prefill_seconds:.0f} ms")
    one = statistics.median(seconds[1])
    print(f"{'rows':>5s}{'ms':>9s}{'× 1 row':>9s}")
    for rows in PASS_ROWS:
        median = statistics.median(seconds[rows])
        print(f"{rows:5d}{1e3 * median:9.0f}{median / one:9.2f}")


def rows_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=QWEN_1_5B, help="a packaged model's name")
    parser.add_argument("--rounds", type=int, default=5)


# ---------------------------------------------------------------- steps

STEP_ROUNDS = 5
STEP_PASSES = 8


def run_steps(args: argparse.Namespace) -> None:
    """The pair's step costs side by side: each model's one-row step (the 0.5B's also as it drafts,
    on its draft head: models/heads.py) and the 1.5B's check.

    uv run --extra qwen-coder python bench/bench_layers.py steps [--rows 1,3] [--fp32-bits 8] [--fp32-scales]
        [--sources a.c,b.c] [--mlx-cache] [--affine-q6k] [--untiled] [--cflags "-O3 -mavx2 -mfma -mf16c"]
        [--numpy-pass-ops]

    Both models loaded in one process, a 48-token cache each; 5 rounds of 8 passes per (model, rows),
    interleaved; medians in ms. What the README's caption says about a model draft's price.
    --fp32-bits 8 adds an arm, interleaved round by round, where codes of those widths take fp32
    activations instead of int8 (the route before full bytes went int8). --fp32-scales adds an arm
    whose models are loaded on `exact` (scales and biases kept fp32, not narrowed to fp16) and
    stepped on the default route (the default before fp16 scales). --sources runs the same models on
    each build of quant_rows.c in turn, round by round (kernel work: an A/B of two versions).
    The caches are the engine's (decoding_caches: keys and values of a decoding pass kept in NumPy);
    --mlx-cache adds an arm on mlx-lm's own KV caches (the route before). --affine-q6k adds an arm
    whose Q6_K-born layers take the converted directory's 8-bit affine copies (the route before their
    blocks were read as stored). --byte-tiles adds an arm whose 5-bit codes (the 0.5B's Q5_0 layers)
    are laid out a byte each, 8 bits a code, as before 5-bit tiles. --untiled adds an arm whose
    4-bit layers keep MLX's layout (the few-row path) where the default lays them out as tiles
    (kernels/quant_tiles.py). --cflags builds the kernel with those flags instead of the machine's
    own (an AVX2 machine's kernel, on this one).
    --numpy-pass-ops adds an arm whose decoding passes run RMSNorm, RoPE, attention and silu·up in
    NumPy (the route's pass_ops "numpy": before kernels/pass_ops.c), on the same models.
    """
    from mlxswitch.models.cpu_blocks import decoding_caches

    if args.cflags:  # before anything builds the kernel
        quant_cpu.COMPILE_FLAGS = ((*args.cflags.split(), "-pthread"),)
    kernels = {
        Path(source).name: built_quant_kernel(Path(source), check=True) for source in comma_list(args.sources)
    }
    arms = step_arms(args, kernels)
    ids = prompt(3)
    caches = {}
    for arm, (_, models) in arms.items():
        for size, model in models.items():
            wrap = None if arm == "mlx-lm caches" else decoding_caches
            caches[arm, size], _ = prefill(model, ids, wrap)
    samples = step_rounds(arms, kernels, caches, ids, args.rows)
    for (arm, size, count), ms in samples.items():
        rounds = [round(x) for x in ms]
        label = f"{arm}: " if len(arms) > 1 else ""
        print(f"{label}{size} {count} row(s): median {statistics.median(ms):.1f} ms, rounds {rounds}")


def step_arms(args: argparse.Namespace, kernels: dict) -> dict[str, tuple[tuple[int, ...], dict]]:
    """Arm → (the code widths on int8, the loaded pair): a build's arm each (or "default"), then the
    optional arms in order. Arms that need other weights load the pair again with a setting patched."""
    from mlxswitch.kernels.route import kernels_override
    from mlxswitch.models import loading, row_routes
    from mlxswitch.models import rows as model_rows

    int8_bits = quant_cpu.INT8_CODE_BITS
    models = load_pair()
    arms = {name: (int8_bits, models) for name in kernels} or {"default": (int8_bits, models)}
    if args.fp32_bits:
        kept = set(int_list(args.fp32_bits))
        arms[f"{args.fp32_bits}-bit fp32"] = (tuple(b for b in int8_bits if b not in kept), models)
    if args.fp32_scales:
        with kernels_override("exact"):
            arms["fp32 scales"] = (int8_bits, load_pair())
    if args.mlx_cache:
        arms["mlx-lm caches"] = (int8_bits, models)
    if args.affine_q6k:  # the converted directory's affine copies: as if it held no Q6_K blocks
        with restored(loading, "Q6K_BLOCKS_FILE"):
            loading.Q6K_BLOCKS_FILE = "no-such-file"
            arms["Q6_K as 8-bit affine"] = (int8_bits, load_pair())
    if args.numpy_pass_ops:
        arms["numpy pass ops"] = (int8_bits, models)
    if args.byte_tiles:  # 5-bit codes laid out a byte each (the layout cache bypassed: it holds 5-bit tiles)
        with restored(quant_tiles, "FIVE_BIT_TILES"), restored(loading, "layout_file"):
            quant_tiles.FIVE_BIT_TILES, loading.layout_file = False, (lambda path, config: None)
            arms["5-bit codes as bytes"] = (int8_bits, load_pair())
    if args.untiled:  # every layer as the few-row path reads it: MLX's layout, Q6_K blocks as stored
        with restored(row_routes, "tiles_layer"), restored(model_rows, "tiles_q6k"):
            row_routes.tiles_layer, model_rows.tiles_q6k = (lambda module: False), (lambda view: False)
            arms["untiled"] = (int8_bits, load_pair())
    return arms


def step_rounds(arms: dict, kernels: dict, caches: dict, ids: mx.array, rows_list) -> dict:
    """(arm, size, rows) → mean ms a pass, one figure a round; every arm's passes in each round."""
    from mlx_lm.models.cache import trim_prompt_cache

    from mlxswitch.kernels.route import resolve_route, use_route
    from mlxswitch.models.heads import split_model

    route, shipped = resolve_route(), quant_cpu.quant_kernel

    def sample(arm: str, bits: tuple[int, ...], model, cache, rows: int) -> float:
        quant_cpu.INT8_CODE_BITS = bits
        # Both modules that look the kernel up at a pass: a pack's products (quant_linear) on the
        # shipped build beside the arm's would leave two thread pools spinning on the same cores
        # (each spins ~2 ms after its last product): every arm ran ~3x slower so.
        chosen = (lambda k=kernels[arm]: k) if arm in kernels else shipped
        quant_cpu.quant_kernel = quant_linear.quant_kernel = chosen  # type: ignore[misc]
        use_route(replace(route, pass_ops="numpy") if arm == "numpy pass ops" else route)
        started = time.perf_counter()
        for _pass in range(STEP_PASSES):  # the trim timed too
            mx.eval(model(ids[:, :rows], cache=cache))
            trim_prompt_cache(cache, rows)
        return (time.perf_counter() - started) / STEP_PASSES * 1e3

    samplers = {
        (arm, size, count): partial(sample, arm, bits, model, caches[arm, size], count)
        for arm, (bits, models) in arms.items()
        for size, model in models.items()
        for count in (rows_list if size == "1.5b" else [1])
    }
    for arm, (bits, models) in arms.items():  # the 0.5B's step as it drafts: on its draft head
        split = split_model(models["0.5b"], "0.5b")
        if split.draft_head is not None:
            drafting = partial(
                lambda split, inputs, cache: split.draft_head(split.body(inputs, cache=cache)), split
            )
            samplers[arm, "0.5b drafting", 1] = partial(sample, arm, bits, drafting, caches[arm, "0.5b"], 1)
    with restored(quant_cpu, "INT8_CODE_BITS", "quant_kernel"), restored(quant_linear, "quant_kernel"):
        return interleaved(samplers, STEP_ROUNDS)


def steps_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int_list, default="1,3", help="the 1.5B's rows a pass (the 0.5B: 1)")
    parser.add_argument("--fp32-bits", default="", help="code widths an extra arm keeps on fp32")
    parser.add_argument("--fp32-scales", action="store_true", help="an arm on fp32 scales and biases")
    parser.add_argument("--sources", default="", help="builds of quant_rows.c, comma-separated: an arm each")
    parser.add_argument("--mlx-cache", action="store_true", help="an arm on mlx-lm's own KV caches")
    parser.add_argument(
        "--affine-q6k", action="store_true", help="an arm on Q6_K layers' 8-bit affine copies"
    )
    parser.add_argument("--untiled", action="store_true", help="an arm on MLX's layout, not tiles")
    parser.add_argument("--byte-tiles", action="store_true", help="an arm with 5-bit codes as byte tiles")
    parser.add_argument("--cflags", default="", help="the kernel's compiler flags (-pthread added)")
    parser.add_argument("--numpy-pass-ops", action="store_true", help="an arm on NumPy's pass operations")


# ---------------------------------------------------------------- the command line

# ---------------------------------------------------------------- pipes

PIPES_SOURCE = Path(__file__).with_name("pipes.c")
GATE_SHAPE = (8960, 1536)  # the Qwen 1.5B's gate projection, out × in
PIPES_WEIGHTS = 20


def run_pipes(args: argparse.Namespace) -> None:
    """What the cores can do for int8 products, and how much of it the Q4_K tiles' kernel takes.

    uv run python bench/bench_layers.py pipes [--rows 1,2,4,8,16] [--rounds 7]

    Compiles bench/pipes.c (`cc -O2 -march=native`) and runs it: the clock, AVX-512 VNNI byte
    products a second on one core and on every core at once, and what a broadcast load, an fp32
    fused multiply-add or a vector and beside the products costs (pipes.c says how). Then the
    quantized kernel on the Qwen 1.5B's gate projection (8960 × 1536) as Q4_K tiles on int8 rows,
    20 random weights (a model's weights are not in cache between steps), 2 threads, the row
    counts interleaved round by round: the best round's ms a product, its int8 multiply-adds a
    second, and their share of every core's vpdpbusd rate (a product that did nothing else).
    Run alone.
    """
    import re
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        program = Path(folder) / "pipes"
        compiler = ["cc", "-O2", "-march=native", "-pthread", str(PIPES_SOURCE), "-o", str(program)]
        try:
            subprocess.run(compiler, check=True)
        except (OSError, subprocess.CalledProcessError) as error:
            print(f"error: {PIPES_SOURCE.name} did not build ({error})")
            return
        measured = subprocess.run([str(program), str(available_cores())], capture_output=True, text=True)
    print(measured.stdout, end="")
    found = re.search(r"all \d+ at once: (\d+) G", measured.stdout)
    if measured.returncode != 0 or found is None:
        return
    peak = float(found.group(1)) * 1e9
    kernel = built_quant_kernel(quant_cpu.SOURCE, check=False)
    rng = np.random.default_rng(0)
    out_dims, in_dims = GATE_SHAPE
    blocks = partial(quant_check.random_q4k_blocks, rng, out_dims, in_dims)  # one weight's, laid out at once
    tiled = partial(quant_tiles.tiled_q4k_weight, kernel, in_dims=in_dims)
    weights = [tiled(mx.array(blocks())) for _ in range(PIPES_WEIGHTS)]
    xs = {rows: rng.standard_normal((rows, in_dims)).astype(np.float32) for rows in args.rows}
    samplers = {
        rows: partial(product_seconds, kernel, xs[rows], weights, many_from=rows + 1, int8=True)
        for rows in args.rows
    }
    seconds = interleaved(samplers, args.rounds)
    rounds = f"best of {args.rounds} rounds"
    print(f"Q4_K tiles {out_dims}x{in_dims}, int8 rows, {QUANT_THREADS} threads ({rounds}):")
    for rows in args.rows:
        best = min(seconds[rows])
        rate = out_dims * in_dims * rows / best
        share = f"{rate / peak:.0%} of the cores' vpdpbusd"
        print(f"{rows:3d} rows: {1e3 * best:.3f} ms, {rate / 1e9:.0f} G multiply-adds a second, {share}")


def pipes_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int_list, default="1,2,4,8,16", help="row counts")
    parser.add_argument("--rounds", type=int, default=7)


SUBCOMMANDS = {
    "nested": (run_nested, nested_options),
    "quant": (run_quant, quant_options),
    "routes": (run_routes, routes_options),
    "threads": (run_threads, threads_options),
    "attention": (run_attention, attention_options),
    "rows": (run_rows, rows_options),
    "steps": (run_steps, steps_options),
    "pipes": (run_pipes, pipes_options),
}


def build_parser() -> argparse.ArgumentParser:
    """The script's parser: a subparser a subcommand, its docstring its --help."""
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    subcommands = parser.add_subparsers(title="subcommands", metavar="SUBCOMMAND", required=True)
    for name, (run, add_options) in SUBCOMMANDS.items():
        description = inspect.cleandoc(run.__doc__ or "")
        subparser = subcommands.add_parser(
            name, help=description.splitlines()[0], description=description, formatter_class=raw
        )
        add_options(subparser)
        subparser.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    args.command_line = " ".join(["bench/bench_layers.py", *argv])  # what `routes --json` records
    args.run(args)


if __name__ == "__main__":
    main()
