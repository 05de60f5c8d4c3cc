"""The pair's step costs side by side: each model's one-row step and the 1.5B's check.

    uv run --extra qwen-coder python bench/bench_pair_steps.py [--rows 1,3] [--fp32-bits 8] [--fp32-scales]
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
blocks were read as stored). --untiled adds an arm whose 4-bit layers keep MLX's layout (the
few-row path) where the default lays them out as tiles (kernels/quant_tiles.py). --cflags builds
the kernel with those flags instead of the machine's own (an AVX2 machine's kernel, on this one).
--numpy-pass-ops adds an arm whose decoding passes run RMSNorm, RoPE, attention and silu·up in
NumPy (the route's pass_ops "numpy": before kernels/pass_ops.c), on the same models.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from mlxswitch.kernels import quant_cpu, quant_linear
from mlxswitch.kernels.cbuild import compile_source
from mlxswitch.kernels.route import kernels_override, resolve_route, use_route
from mlxswitch.models import loading, row_routes, rows
from mlxswitch.models.cpu_blocks import decoding_caches
from mlxswitch.models.gguf_convert import Q6K_BLOCKS_FILE
from mlxswitch.models.sources import load_model

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--rows", default="1,3", help="the 1.5B's rows a pass (the 0.5B: 1)")
parser.add_argument("--fp32-bits", default="", help="code widths an extra arm keeps on fp32")
parser.add_argument("--fp32-scales", action="store_true", help="an arm on fp32 scales and biases")
parser.add_argument("--sources", default="", help="builds of quant_rows.c, comma-separated: an arm each")
parser.add_argument("--mlx-cache", action="store_true", help="an arm on mlx-lm's own KV caches")
parser.add_argument("--affine-q6k", action="store_true", help="an arm on Q6_K layers' 8-bit affine copies")
parser.add_argument("--untiled", action="store_true", help="an arm on MLX's layout, not tiles")
parser.add_argument("--cflags", default="", help="the kernel's compiler flags (-pthread added)")
parser.add_argument("--numpy-pass-ops", action="store_true", help="an arm on NumPy's pass operations")
args = parser.parse_args()
if args.cflags:  # before anything builds the kernel
    quant_cpu.COMPILE_FLAGS = ((*args.cflags.split(), "-pthread"),)
kernels = {}  # arm -> its kernel (the shipped one where absent)
for source in filter(None, args.sources.split(",")):
    built = compile_source(Path(source), quant_cpu.COMPILE_FLAGS)
    assert not isinstance(built, str), built
    kernel = quant_cpu.QuantKernel(built.library, built.flags)
    assert quant_cpu.check_kernel(kernel) is None, source
    kernels[Path(source).name] = kernel
shipped = quant_cpu.quant_kernel
NAMES = ("0.5b", "1.5b")
# arm -> (the code widths on int8, the loaded models)
models = {n: load_model(f"package:qwen2.5-coder-{n}-instruct").model for n in NAMES}
arms = {name: (quant_cpu.INT8_CODE_BITS, models) for name in kernels} or {
    "default": (quant_cpu.INT8_CODE_BITS, models)
}
if args.fp32_bits:
    kept = {int(b) for b in args.fp32_bits.split(",")}
    bits = tuple(b for b in quant_cpu.INT8_CODE_BITS if b not in kept)
    arms[f"{args.fp32_bits}-bit fp32"] = (bits, models)
if args.fp32_scales:
    with kernels_override("exact"):
        stored = {n: load_model(f"package:qwen2.5-coder-{n}-instruct").model for n in NAMES}
    arms["fp32 scales"] = (quant_cpu.INT8_CODE_BITS, stored)
if args.mlx_cache:
    arms["mlx-lm caches"] = (quant_cpu.INT8_CODE_BITS, models)
if args.affine_q6k:  # the converted directory's affine copies: as if it held no Q6_K blocks
    loading.Q6K_BLOCKS_FILE = "no-such-file"
    copies = {n: load_model(f"package:qwen2.5-coder-{n}-instruct").model for n in NAMES}
    loading.Q6K_BLOCKS_FILE = Q6K_BLOCKS_FILE
    arms["Q6_K as 8-bit affine"] = (quant_cpu.INT8_CODE_BITS, copies)
if args.numpy_pass_ops:
    arms["numpy pass ops"] = (quant_cpu.INT8_CODE_BITS, models)
if args.untiled:  # every layer as the few-row path reads it: MLX's layout, Q6_K blocks as stored
    tiles_layer, tiles_q6k = row_routes.tiles_layer, rows.tiles_q6k
    row_routes.tiles_layer, rows.tiles_q6k = (lambda module: False), (lambda view: False)
    untiled = {n: load_model(f"package:qwen2.5-coder-{n}-instruct").model for n in NAMES}
    row_routes.tiles_layer, rows.tiles_q6k = tiles_layer, tiles_q6k
    arms["untiled"] = (quant_cpu.INT8_CODE_BITS, untiled)
ids = mx.array(
    [[151644, 8948, 198, 2610, 525, 1207, 16948, 11, 3465, 553, 54364, 14817, 13, 1446, 525, 264] * 3]
)
caches = {}
for arm, (_, loaded) in arms.items():
    for n, m in loaded.items():
        own = make_prompt_cache(m)
        caches[arm, n] = own if arm == "mlx-lm caches" else decoding_caches(m, own)
        mx.eval(m(ids, cache=caches[arm, n]))
route = resolve_route()
res: dict[tuple, list[float]] = {}
for _ in range(5):
    for arm, (bits, loaded) in arms.items():
        quant_cpu.INT8_CODE_BITS = bits
        # Both modules that look the kernel up at a pass: a pack's products (quant_linear) on the
        # shipped build beside the arm's would leave two thread pools spinning on the same cores
        # (each spins ~2 ms after its last product): every arm ran ~3x slower so.
        chosen = (lambda k=kernels[arm]: k) if arm in kernels else shipped
        quant_cpu.quant_kernel = quant_linear.quant_kernel = chosen  # type: ignore[misc]
        use_route(replace(route, pass_ops="numpy") if arm == "numpy pass ops" else route)
        for n, m in loaded.items():
            cache = caches[arm, n]
            for count in [int(r) for r in args.rows.split(",")] if n == "1.5b" else [1]:
                t = time.perf_counter()
                for _pass in range(8):
                    mx.eval(m(ids[:, :count], cache=cache))
                    trim_prompt_cache(cache, count)
                res.setdefault((arm, n, count), []).append((time.perf_counter() - t) / 8 * 1e3)
for (arm, name, count), seconds in res.items():
    rounds = [round(x) for x in seconds]
    label = f"{arm}: " if len(arms) > 1 else ""
    print(f"{label}{name} {count} row(s): median {statistics.median(seconds):.1f} ms, rounds {rounds}")
