"""A model of Qwen2.5-7B's shape, random 4-bit weights built in-process (never saved): does it load
and decode here, at what speed and memory, on the route this process resolved?

    uv run python bench/bench_scale.py [--tokens 16] [--group-size 32]

Each layer is quantized and evaluated as it is built, so no fp32 copy of the whole model is ever
held. Prints the route, the build time and the resident set once built, a 16-token prefill, the
decode tok/s (greedy, on the engine's KV caches: cpu_blocks.decoding_caches) and the process's peak
RSS (the build's fp32 temporaries included).
"""

from __future__ import annotations

import argparse
import os
import resource
import time

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.models.qwen2 import Model, ModelArgs

from mlxswitch.kernels.route import current_route
from mlxswitch.models.cpu_blocks import decoding_caches
from mlxswitch.models.row_routes import use_fast_rows

QWEN25_7B = ModelArgs(
    model_type="qwen2",
    hidden_size=3584,
    num_hidden_layers=28,
    intermediate_size=18944,
    num_attention_heads=28,
    num_key_value_heads=4,
    rms_norm_eps=1e-6,
    vocab_size=152064,
    rope_theta=1e6,
    tie_word_embeddings=False,
)


def build(group_size: int) -> nn.Module:
    """The model, one part (the embedding, each layer, the output head) quantized and evaluated at
    a time (float32 elsewhere, as a CPU loads). Each part is quantized through the whole model
    (nn.quantize replaces a module in its parent: the embedding and head passed alone would stay
    fp32, 2.2 GB each, as the runs before 2026-11-29 13:20 left them)."""
    mx.random.seed(0)
    model = Model(QWEN25_7B)
    paths = ["model.embed_tokens", *(f"model.layers.{i}" for i in range(len(model.model.layers))), "lm_head"]
    for path in paths:
        part = dict(model.named_modules())[path]
        for _, leaf in part.named_modules():
            if isinstance(leaf, nn.Linear | nn.Embedding):
                leaf.weight = leaf.weight * 0.02  # a sane scale for random weights

        def inside(name: str, module: nn.Module, path: str = path) -> bool:
            return (name == path or name.startswith(path + ".")) and hasattr(module, "to_quantized")

        nn.quantize(model, group_size=group_size, bits=4, class_predicate=inside)
        mx.eval(dict(model.named_modules())[path].parameters())
    mx.eval(model.parameters())
    mx.clear_cache()  # the fp32 temporaries' buffers, which MLX would keep for reuse
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=32)
    args = parser.parse_args()
    started = time.perf_counter()
    model = build(args.group_size)
    linears = use_fast_rows(model)
    built = time.perf_counter() - started
    route = current_route()
    with open("/proc/self/statm") as statm:  # Linux: resident pages, the second field
        resident = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9
    print(
        f"Qwen2.5-7B shape, random 4-bit (group {args.group_size}): route {route.plain_linears}, "
        f"linears {linears}, {route.blas_threads} threads; built in {built:.0f} s, resident {resident:.2f} GB"
    )
    cache = decoding_caches(model, make_prompt_cache(model))
    prompt = mx.array([[(17 * i) % 1000 + 10 for i in range(16)]])
    started = time.perf_counter()
    logits = model(prompt, cache=cache)
    token = mx.argmax(logits[:, -1], axis=-1)
    mx.eval(token)
    prefill = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(args.tokens):
        logits = model(token[:, None], cache=cache)
        token = mx.argmax(logits[:, -1], axis=-1)
        mx.eval(token)
    decode = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    print(
        f"prefill of 16 tokens {prefill:.1f} s; decode {args.tokens / decode:.2f} tok/s "
        f"({1e3 * decode / args.tokens:.0f} ms a token); peak RSS {peak:.2f} GB"
    )


if __name__ == "__main__":
    main()
