"""Single-tier decode speed: mlxswitch's engine vs mlx-lm's stream_generate as shipped, one run.

    uv run python bench/bench_single_tier.py [--model embedded] [--tokens 64] [--rounds 3]

The mlx-lm side runs on a model of its own, loaded apart from ours, whose quantized linears stay
mlx-lm's own `nn.QuantizedLinear` (ours get the multi-row route at load). Rounds alternate the
two paths so machine noise hits both alike; the ratio is (our decode tok/s) / (mlx-lm's decode
tok/s), median over rounds. Target ≥ 0.97.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

from mlx import nn
from mlx_lm.generate import stream_generate

from mlxswitch.decoding.session import ChatSession, GenerationSettings
from mlxswitch.decoding.tiers import single_model_ladder
from mlxswitch.models.gguf import load_gguf
from mlxswitch.models.rows import RowsQuantizedLinear
from mlxswitch.models.sources import load_model, model_source
from mlxswitch.models.weights import compute_dtype
from mlxswitch.routing.router import RouterConfig

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def stock_model(source: str) -> tuple[nn.Module, object]:
    """A fresh model and tokenizer for mlx-lm's side, its linears left as mlx-lm built them."""
    from mlx_lm import load as mlx_lm_load

    path = model_source(source).local_path()
    if path is not None and path.is_file():
        # mlx-lm reads no GGUF: our reader builds mlx-lm's own model class, floats in our compute
        # dtype (fp32 on a CPU), and nothing is swapped afterwards.
        model, tokenizer, _ = load_gguf(path, compute_dtype())
    else:
        model, tokenizer = mlx_lm_load(str(path or source))
    swapped = [name for name, m in model.named_modules() if isinstance(m, RowsQuantizedLinear)]
    assert not swapped, f"the stock model has our linears: {swapped[:3]}"
    return model, tokenizer


def mlx_lm_decode_rate(model, tokenizer, prompt_ids, tokens: int) -> tuple[float, int]:
    """Decode tok/s of mlx-lm's stream_generate, timed from the first token to the last."""
    stamps, prompt_tps = [], 0.0
    for response in stream_generate(model, tokenizer, prompt_ids, max_tokens=tokens):
        stamps.append(time.perf_counter())
        prompt_tps = response.prompt_tps
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]), len(stamps), prompt_tps


def engine_decode_rate(session: ChatSession, prompt: str) -> tuple[float, int, float]:
    """Decode tok/s of our engine on a one-tier ladder, timed the same way, and prompt tok/s."""
    session.reset()
    summary = session.ask(prompt)
    return summary.tok_per_s, summary.generated, summary.prompt_tok_per_s


def main() -> None:
    """Run the alternating rounds and print a table and the ratio."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    loaded = load_model(args.model)
    stock, stock_tokenizer = stock_model(args.model)
    # Ignore EOS on both paths (the wrapper's public setter) so they decode the same token count.
    loaded.tokenizer.eos_token_ids = set()
    stock_tokenizer.eos_token_ids = set()
    session = ChatSession(
        single_model_ladder(loaded), RouterConfig(up=()), GenerationSettings(max_tokens=args.tokens)
    )
    prompt_ids = session.render([{"role": "user", "content": PROMPT}])
    mlx_lm_decode_rate(stock, stock_tokenizer, prompt_ids, 8)  # warm-up both paths
    engine_decode_rate(session, PROMPT)

    ours, theirs, prompt_ours, prompt_theirs = [], [], [], []
    for _ in range(args.rounds):
        rate, n, prompt_rate = mlx_lm_decode_rate(stock, stock_tokenizer, prompt_ids, args.tokens)
        theirs.append(rate)
        prompt_theirs.append(prompt_rate)
        rate, m, prompt_rate = engine_decode_rate(session, PROMPT)
        ours.append(rate)
        prompt_ours.append(prompt_rate)
        assert n == m == args.tokens, (n, m)
    ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
    print(f"model {loaded.name} · {args.tokens} tokens · {args.rounds} rounds (alternating)")
    print("mlx-lm side: a fresh model, mlx-lm's own nn.QuantizedLinear layers, stream_generate")
    print(f"{'round':>5} {'mlx-lm tok/s':>13} {'mlxswitch tok/s':>16} {'ratio':>6}")
    for i, (a, b, r) in enumerate(zip(theirs, ours, ratios, strict=True)):
        print(f"{i:>5} {a:>13.2f} {b:>16.2f} {r:>6.3f}")
    print(f"median ratio mlxswitch / mlx-lm: {statistics.median(ratios):.3f} (target ≥ 0.97)")
    print(
        f"prompt processing ({len(prompt_ids)} tokens), median tok/s: mlx-lm "
        f"{statistics.median(prompt_theirs):.1f}, mlxswitch {statistics.median(prompt_ours):.1f}"
    )
    assert all(math.isfinite(r) for r in ratios)


if __name__ == "__main__":
    main()
