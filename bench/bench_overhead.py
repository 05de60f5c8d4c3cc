"""Per-token overhead on the path a Mac takes: mlxswitch's one-tier decode against mlx-lm's
generate_step, on a model so small that only the loops' own work is left. One run, rounds
alternating.

    uv run python bench/bench_overhead.py [--tokens 256] [--rounds 5] [--cli]

The route is forced to a Mac's (kernels/route.py: route_for("metal", "mx") — MLX's own
nn.QuantizedLinear modules, mx-op signals), minus the device: the ops run on this CPU. The model
is random 4-bit weights in SmolLM2-135M's shape cut to 2 layers of width 64, with the embedded
SmolLM2 tokenizer (49,152 ids, so the output head and the signals see a real vocabulary), and
both sides decode it greedily, end-of-sequence ignored, from the same prompt ids:
- mlx-lm: `generate_step` (the loop under mlx-lm's `generate` and `stream_generate`);
- mlxswitch: `ChatSession.stream` on a one-tier ladder, events and detokenizing included.
Printed: ms per decoded token (first to last token, median over rounds) and the ratio; Python
function calls per decoded token (sys.setprofile over the decode, calls into C included); and
the MLX graph nodes of one decode step (mx.export_to_dot of what each loop evaluates a token).

--cli also times the two command lines on the same model saved as an mlx-lm directory, with
MLXSWITCH_KERNELS=mx (MLX's ops; on a CPU our linears keep their module, as the route says):
`mlxswitch chat --model DIR -p … --json` (its tok_per_s) against `python -m mlx_lm generate
--model DIR --prompt …` (its "Generation: … tokens-per-sec"), alternating, decode rates compared.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import generate_step
from mlx_lm.models import llama
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import save_config, save_model

from mlxswitch.decoding.answer import TokenEvent
from mlxswitch.decoding.session import ChatSession, GenerationSettings
from mlxswitch.decoding.tiers import single_model_ladder
from mlxswitch.kernels.route import route_for, use_route
from mlxswitch.models.sources import load_model
from mlxswitch.models.weights import LoadedModel
from mlxswitch.routing.router import RouterConfig
from mlxswitch.routing.signals import read_time_signals

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def tiny_model(vocab_size: int) -> tuple[nn.Module, dict]:
    """Random 4-bit llama weights: 2 layers of width 64 over the tokenizer's vocabulary."""
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": vocab_size,
        "tie_word_embeddings": False,
    }
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    return model, config


class CallCounter:
    """Counts Python and C function calls while active (sys.setprofile)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, frame, event, arg) -> None:
        if event in ("call", "c_call"):
            self.calls += 1

    def __enter__(self) -> CallCounter:
        sys.setprofile(self)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(None)


def mlx_lm_tokens(model: nn.Module, prompt_ids: list[int], tokens: int) -> Iterator[int]:
    """mlx-lm's generate_step, greedy, as its generate() drives it."""
    sampler = make_sampler(temp=0.0)
    for token, _ in generate_step(mx.array(prompt_ids), model, max_tokens=tokens, sampler=sampler):
        yield int(token)


def our_tokens(session: ChatSession, prompt: str) -> Iterator[int]:
    """mlxswitch's decode: the session's token events (detokenized, timed, routed)."""
    session.reset()
    for event in session.stream(prompt):
        if isinstance(event, TokenEvent):
            yield event.id


def per_token_ms(tokens: Iterator[int], expected: int) -> tuple[float, int]:
    """ms per token from the first token to the last (prefill excluded), and Python calls a token."""
    stamps: list[float] = []
    counter = CallCounter()
    for _ in tokens:
        stamps.append(time.perf_counter())
        if len(stamps) == 1:
            sys.setprofile(counter)  # from the first token on: the decode alone
    sys.setprofile(None)
    assert len(stamps) == expected, (len(stamps), expected)
    decoded = len(stamps) - 1
    return 1000 * (stamps[-1] - stamps[0]) / decoded, counter.calls // decoded


def graph_nodes(*outputs: mx.array) -> int:
    """Nodes of the graph that computes `outputs` (its DOT export's node lines)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "step.dot"
        mx.export_to_dot(str(path), *outputs)
        return sum(1 for line in path.read_text().splitlines() if "label" in line and "->" not in line)


def step_graphs(model: nn.Module, prompt_ids: list[int]) -> tuple[int, int]:
    """Graph nodes of one decode step: mlx-lm's (logits, log-softmax, sampled token) and ours (the
    same plus the signals reduction the router reads)."""
    sampler = make_sampler(temp=0.0)
    cache = make_prompt_cache(model)
    model(mx.array(prompt_ids)[None], cache=cache)
    logits = model(mx.array([[1]]), cache=cache)[:, -1, :]
    logprobs = logits - mx.logsumexp(logits, keepdims=True)
    theirs = graph_nodes(sampler(logprobs), logprobs)
    cache = make_prompt_cache(model)
    model(mx.array(prompt_ids)[None], cache=cache)
    logits = model(mx.array([[1]]), cache=cache)[:, -1, :]
    signals = read_time_signals(logits)
    ours = graph_nodes(sampler(logits), signals.array)
    return theirs, ours


def save_tiny(directory: Path, model: nn.Module, config: dict, tokenizer) -> Path:
    """The tiny model as an mlx-lm directory (weights, config with its quantization, tokenizer)."""
    save_model(directory, model)
    save_config({**config, "quantization": {"group_size": 32, "bits": 4}}, directory / "config.json")
    tokenizer.save_pretrained(str(directory))
    return directory


def cli_rates(directory: Path, tokens: int) -> tuple[float, float]:
    """Decode tok/s of our CLI and of mlx-lm's, each as the command reports it."""
    env = {**os.environ, "MLXSWITCH_KERNELS": "mx"}
    ours = subprocess.run(
        ["mlxswitch", "chat", "--model", str(directory), "-p", PROMPT, "--json", "--max-tokens", str(tokens)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    ours_rate = json.loads(ours.stdout.splitlines()[-1])["stats"]["tok_per_s"]
    theirs = subprocess.run(
        [sys.executable, "-m", "mlx_lm", "generate", "--model", str(directory), "--prompt", PROMPT]
        + ["--max-tokens", str(tokens)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    found = re.search(r"Generation: \d+ tokens, ([0-9.]+) tokens-per-sec", theirs.stdout)
    assert found, theirs.stdout[-500:]
    return float(ours_rate), float(found.group(1))


def main() -> None:
    """Alternate the two loops, then print the table and the ratio."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cli", action="store_true", help="also time the two command lines")
    args = parser.parse_args()

    use_route(route_for("metal", "mx", metal=False, blas_threads=1))  # a Mac's route, on this CPU
    tokenizer = load_model("embedded").tokenizer
    tokenizer.eos_token_ids = set()  # both sides decode exactly --tokens tokens
    model, config = tiny_model(len(tokenizer.get_vocab()))
    loaded = LoadedModel("bench:tiny", "tiny", model, tokenizer, config, "4-bit", "mlx-module")
    session = ChatSession(
        single_model_ladder(loaded), RouterConfig(up=()), GenerationSettings(max_tokens=args.tokens)
    )
    prompt_ids = session.render([{"role": "user", "content": PROMPT}])
    per_token_ms(mlx_lm_tokens(model, prompt_ids, 16), 16)  # warm both up
    per_token_ms(our_tokens(session, PROMPT), args.tokens)

    theirs, ours, calls_theirs, calls_ours = [], [], [], []
    for _ in range(args.rounds):
        ms, calls = per_token_ms(mlx_lm_tokens(model, prompt_ids, args.tokens), args.tokens)
        theirs.append(ms)
        calls_theirs.append(calls)
        ms, calls = per_token_ms(our_tokens(session, PROMPT), args.tokens)
        ours.append(ms)
        calls_ours.append(calls)
    nodes_theirs, nodes_ours = step_graphs(model, prompt_ids)

    print(f"tiny 4-bit llama (2 layers × 64, vocab {config['vocab_size']}), a Mac's route on this CPU")
    print(f"{args.tokens} tokens a round, {args.rounds} rounds alternating; greedy; EOS ignored")
    print(f"{'round':>5} {'mlx-lm ms/tok':>14} {'mlxswitch ms/tok':>17} {'ratio':>6}")
    for i, (a, b) in enumerate(zip(theirs, ours, strict=True)):
        print(f"{i:>5} {a:>14.3f} {b:>17.3f} {b / a:>6.3f}")
    ratio = statistics.median(b / a for a, b in zip(theirs, ours, strict=True))
    print(f"median ratio mlxswitch / mlx-lm generate_step, per token: {ratio:.3f} (target ≤ 1.05)")
    print(
        f"Python calls per decoded token: mlx-lm {statistics.median(calls_theirs)}, "
        f"mlxswitch {statistics.median(calls_ours)}"
    )
    print(f"graph nodes of one decode step: mlx-lm {nodes_theirs}, mlxswitch {nodes_ours}")
    if not args.cli:
        return
    with tempfile.TemporaryDirectory() as tmp:
        directory = save_tiny(Path(tmp) / "tiny", model, config, tokenizer)
        cli_rates(directory, 16)  # warm the file cache
        rates = [cli_rates(directory, args.tokens) for _ in range(args.rounds)]
    print("command lines, MLXSWITCH_KERNELS=mx: decode tok/s as each reports it")
    print(f"{'round':>5} {'mlx_lm generate':>16} {'mlxswitch chat':>15} {'time ratio':>11}")
    for i, (ours_rate, theirs_rate) in enumerate(rates):
        print(f"{i:>5} {theirs_rate:>16.1f} {ours_rate:>15.1f} {theirs_rate / ours_rate:>11.3f}")
    ratio = statistics.median(t / o for o, t in rates)
    print(f"median time-per-token ratio mlxswitch chat / mlx_lm generate: {ratio:.3f} (target ≤ 1.10)")


if __name__ == "__main__":
    main()
