"""Per-token overhead on the path a Mac takes: mlxswitch's one-tier decode against mlx-lm's
generate_step, on a model so small that only the loops' own work is left. One run, rounds
alternating.

    uv run python bench/bench_overhead.py [--tokens 256] [--rounds 5] [--cli | --head N | --pair]

The route is forced to a Mac's (kernels/route.py: route_for("metal", "mx") — MLX's own
nn.QuantizedLinear modules, mx-op signals), minus the device: the ops run on this CPU. The model
is random 4-bit weights in SmolLM2-135M's shape cut to 2 layers of width 64, with the embedded
SmolLM2 tokenizer (49,152 ids, so the output head and the signals see a real vocabulary), and
both sides decode it greedily, end-of-sequence ignored, from the same prompt ids:
- mlx-lm: `generate_step` (the loop under mlx-lm's `generate` and `stream_generate`);
- mlxswitch: `ChatSession.stream` on a one-tier ladder, events and detokenizing included.
Printed: ms per decoded token (first to last token) per round and the median ratio, and the
ratio of each round's median interval between tokens (what a pause of the machine moves least);
Python function calls per decoded token (sys.setprofile over a decode of its own, calls into C
included: the profiler is never on in a timed round); and the MLX graph nodes of one decode
step (mx.export_to_dot of what each loop evaluates a token). mlx-lm's generate_step always
computes the log-softmax it yields; ours does only where a sampler or a reader needs it (not for
greedy decoding), which is most of the difference with a large head.

--pair measures the two-tier loops instead, on a tiny correlated pair (the small model above,
and a "large" one of 4 layers: the small one's 2 layers plus 2 whose outputs are scaled near zero,
so the two mostly agree and routing and drafting both have work): per arm, ms per decoded token,
passes and rows (past the prompt) per token through each model's body, and "fed − held": the
rows each model's body was fed beyond the ids its cache holds at the end (for the routed loops,
ids fed again after a queued step was rolled back or a position recomputed; for verified
drafting, also the drafted ids its checks rejected), against mlx-lm's generate_step and
speculative_generate_step on the same pair. Thresholds are the small model's own entropy
quantiles on this prompt, so the routed arms switch both ways.

--head N gives the model an output head of N ids (the embedding still takes every prompt id, and
the tokenizer detokenizes the ids it makes): its 49,152-id head is most of a token's compute here,
so a small head leaves the loops' own work as most of what is timed.

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
from mlx_lm.generate import generate_step, speculative_generate_step
from mlx_lm.models import llama
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import save_config, save_model

from mlxswitch.decoding.answer import TokenEvent
from mlxswitch.decoding.mode import DecodingMode
from mlxswitch.decoding.session import ChatSession, GenerationSettings
from mlxswitch.decoding.tiers import Ladder, pair_ladder, single_model_ladder
from mlxswitch.kernels.route import route_for, use_route
from mlxswitch.models.sources import load_model
from mlxswitch.models.weights import LoadedModel
from mlxswitch.routing.router import RouterConfig
from mlxswitch.routing.signals import read_time_signals

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def tiny_model(
    vocab_size: int, layers: int = 2, quantize: bool = True, head: int | None = None
) -> tuple[nn.Module, dict]:
    """Random 4-bit llama weights: 2 layers of width 64 over the tokenizer's vocabulary; with
    `head`, an output head of that many ids only (the embedding still takes every prompt id)."""
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": layers,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": vocab_size,
        "tie_word_embeddings": False,
    }
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    if head is not None:
        model.lm_head = nn.Linear(config["hidden_size"], head, bias=False)
        config = {**config, "vocab_size": head}  # the output distribution's size
    if quantize:
        nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    return model, config


def twin_pair(vocab_size: int) -> tuple[nn.Module, nn.Module, dict]:
    """The small model and a 4-layer "large" one: the small one's weights plus 2 layers whose
    output projections are scaled to 3%, so their distributions are close but not equal. The
    head is scaled ×12 so that entropies spread (about 1–5 bits) as a trained model's do."""
    small, config = tiny_model(vocab_size, quantize=False)
    small.lm_head.weight = small.lm_head.weight * 12
    large, _ = tiny_model(vocab_size, layers=4, quantize=False)
    for name in ("embed_tokens", "norm"):
        setattr(large.model, name, getattr(small.model, name))
    large.lm_head = small.lm_head
    large.model.layers[:2] = small.model.layers
    for layer in large.model.layers[2:]:
        layer.self_attn.o_proj.weight = layer.self_attn.o_proj.weight * 0.03
        layer.mlp.down_proj.weight = layer.mlp.down_proj.weight * 0.03
    for model in (small, large):
        nn.quantize(model, group_size=32, bits=4)
        mx.eval(model.parameters())
    return small, large, config


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


def per_token_ms(tokens: Iterator[int], expected: int) -> tuple[float, float]:
    """ms per token from the first token to the last (prefill excluded): the mean, and the median
    of the intervals between tokens (what a pause of the machine moves least)."""
    stamps = [time.perf_counter() for _ in tokens]
    assert len(stamps) == expected, (len(stamps), expected)
    intervals = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return 1000 * (stamps[-1] - stamps[0]) / len(intervals), 1000 * statistics.median(intervals)


def calls_per_token(tokens: Iterator[int]) -> int:
    """Python and C function calls per decoded token, from the first token on (a run of its own:
    the profiler slows a loop by its calls, so it never runs in a timed one)."""
    counter = CallCounter()
    decoded = -1
    for _ in tokens:
        decoded += 1
        if decoded == 0:
            sys.setprofile(counter)
    sys.setprofile(None)
    return counter.calls // max(decoded, 1)


def graph_nodes(*outputs: mx.array) -> int:
    """Nodes of the graph that computes `outputs` (its DOT export's node lines)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "step.dot"
        mx.export_to_dot(str(path), *outputs)
        return sum(1 for line in path.read_text().splitlines() if "label" in line and "->" not in line)


def step_graphs(model: nn.Module, prompt_ids: list[int]) -> tuple[int, int, int]:
    """Graph nodes of one decode step: mlx-lm's (logits, log-softmax, sampled token); ours on one
    tier (logits, sampled token: no router reads the signals); ours routed (plus the signals
    reduction, MLX ops here: on a Mac the fused kernel is one node)."""
    sampler = make_sampler(temp=0.0)

    def step_logits() -> mx.array:
        cache = make_prompt_cache(model)
        model(mx.array(prompt_ids)[None], cache=cache)
        return model(mx.array([[1]]), cache=cache)[:, -1, :]

    logits = step_logits()
    logprobs = logits - mx.logsumexp(logits, keepdims=True)
    theirs = graph_nodes(sampler(logprobs), logprobs)
    logits = step_logits()
    plain = graph_nodes(sampler(logits))
    logits = step_logits()
    routed = graph_nodes(sampler(logits), read_time_signals(logits).array)
    return theirs, plain, routed


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


class BodyRows:
    """Passes and rows through each model's body (its `model.model`), while active."""

    def __init__(self, bodies: dict[str, nn.Module]):
        self.names = {id(body): name for name, body in bodies.items()}
        self.classes = {type(body) for body in bodies.values()}
        self.passes = dict.fromkeys(bodies, 0)
        self.rows = dict.fromkeys(bodies, 0)

    def __enter__(self) -> BodyRows:
        self.real = {cls: cls.__call__ for cls in self.classes}
        for cls, real in self.real.items():

            def counted(body, x, *args, _real=real, **kwargs):
                name = self.names.get(id(body))
                if name is not None:
                    self.passes[name] += 1
                    self.rows[name] += x.shape[1]
                return _real(body, x, *args, **kwargs)

            cls.__call__ = counted
        return self

    def __exit__(self, *exc) -> None:
        for cls, real in self.real.items():
            cls.__call__ = real


ROUTED = DecodingMode()


def pair_configs(session: ChatSession, prompt: str) -> dict[str, tuple[RouterConfig, DecodingMode]]:
    """The routed arms, with thresholds at the small model's entropy quantiles on this prompt."""
    entropies = sorted(e.entropy for e in session.stream(prompt) if isinstance(e, TokenEvent))
    q = lambda f: entropies[int(f * (len(entropies) - 1))]
    return {
        "ead": (RouterConfig(up=(q(0.6),), down=(q(0.4),), window=3, min_run=2), DecodingMode()),
        "peek": (
            RouterConfig(up=(q(0.7),), down=(q(0.5),), window=1, min_run=1, policy="peek"),
            DecodingMode(),
        ),
        "verified": (
            RouterConfig(up=(q(0.8),), window=1, min_run=1, policy="peek"),
            DecodingMode(verify=True),
        ),
    }


def pair_main(args: argparse.Namespace, tokenizer) -> None:
    """The two-tier loops on a tiny correlated pair against mlx-lm's speculative decoding."""
    small, large, config = twin_pair(len(tokenizer.get_vocab()))
    models = {
        "small": LoadedModel("bench:small", "small", small, tokenizer, config, "4-bit", "mlx-module"),
        "large": LoadedModel("bench:large", "large", large, tokenizer, config, "4-bit", "mlx-module"),
    }
    settings = GenerationSettings(max_tokens=args.tokens)
    alone = ChatSession(
        single_model_ladder(models["small"]), RouterConfig(up=()), settings, measure_signals=True
    )
    configs = pair_configs(alone, PROMPT)
    ladder: Ladder = pair_ladder(models["small"], models["large"])
    prompt_ids = alone.render([{"role": "user", "content": PROMPT}])
    sampler = make_sampler(temp=0.0)

    def ours(config: RouterConfig, mode: DecodingMode) -> Iterator[int]:
        session = ChatSession(ladder, config, settings, decoding=mode)
        for event in session.stream(PROMPT):
            if isinstance(event, TokenEvent):
                yield event.id

    def speculative() -> Iterator[int]:
        for token, _, _ in speculative_generate_step(
            mx.array(prompt_ids), large, small, max_tokens=args.tokens, sampler=sampler
        ):
            yield int(token)

    def large_alone() -> Iterator[int]:
        for token, _ in generate_step(mx.array(prompt_ids), large, max_tokens=args.tokens, sampler=sampler):
            yield int(token)

    arms = {
        "large alone (mlx-lm)": large_alone,
        "mlx-lm speculative": speculative,
        **{name: (lambda c=c: ours(*c)) for name, c in configs.items()},
    }
    bodies = {name: m.model.model for name, m in models.items()}
    for make in arms.values():  # warm every arm up
        per_token_ms(make(), args.tokens)
    times: dict[str, list[float]] = {name: [] for name in arms}
    counts: dict[str, tuple[dict, dict, int]] = {}
    refed: dict[str, int] = {}
    for _ in range(args.rounds):
        for name, make in arms.items():
            if name in configs:  # what each model holds at the end, against what it was fed
                ladder.reset()
            with BodyRows(bodies) as body_rows:
                ms, _ = per_token_ms(make(), args.tokens)
            times[name].append(ms)
            # Rows past the prompt: every model an arm runs reads the prompt once.
            rows = {m: r - len(prompt_ids) if r else 0 for m, r in body_rows.rows.items()}
            counts[name] = (body_rows.passes, rows, args.tokens)
            if name in configs:
                refed[name] = sum(body_rows.rows[g.name] - g.seen for g in ladder.groups)

    print(
        f"tiny correlated pair (2 and 4 layers × 64, vocab {config['vocab_size']}), a Mac's route on this CPU"
    )
    print(f"{args.tokens} tokens an answer, {args.rounds} rounds, arms alternating; greedy; EOS ignored")
    for name, (c, mode) in configs.items():
        timing = "" if mode.verify else f", window {c.window}, min run {c.min_run}"
        print(f"  {name}: up {c.up[0]:.3f} bits, down {c.downs()[0]:.3f}{timing}")
    header = f"{'arm':<22} {'ms/tok':>7} {'small passes':>13} {'large passes':>13} {'small rows':>11}"
    print(header + f" {'large rows':>11} {'fed − held':>11}   (per token; rows past the prompt)")
    for name in arms:
        passes, rows, n = counts[name]
        again = str(refed[name]) if name in refed else "–"
        print(
            f"{name:<22} {statistics.median(times[name]):>7.3f} {passes['small'] / n:>13.2f} "
            f"{passes['large'] / n:>13.2f} {rows['small'] / n:>11.2f} {rows['large'] / n:>11.2f} {again:>11}"
        )


def main() -> None:
    """Alternate the two loops, then print the table and the ratio."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cli", action="store_true", help="also time the two command lines")
    parser.add_argument("--pair", action="store_true", help="the two-tier loops on a tiny pair instead")
    parser.add_argument(
        "--head", type=int, help="an output head of this many ids: little compute left but the loops'"
    )
    args = parser.parse_args()
    if args.head is not None and (args.cli or args.pair or args.head < 2):
        parser.error("--head takes at least 2 ids, and times the in-process loops alone (not --cli, --pair)")

    use_route(route_for("metal", "mx", metal=False, blas_threads=1))  # a Mac's route, on this CPU
    tokenizer = load_model("embedded").tokenizer
    tokenizer.eos_token_ids = set()  # both sides decode exactly --tokens tokens
    if args.pair:
        pair_main(args, tokenizer)
        return
    model, config = tiny_model(len(tokenizer.get_vocab()), head=args.head)
    loaded = LoadedModel("bench:tiny", "tiny", model, tokenizer, config, "4-bit", "mlx-module")
    session = ChatSession(
        single_model_ladder(loaded), RouterConfig(up=()), GenerationSettings(max_tokens=args.tokens)
    )
    prompt_ids = session.render([{"role": "user", "content": PROMPT}])
    per_token_ms(mlx_lm_tokens(model, prompt_ids, 16), 16)  # warm both up
    per_token_ms(our_tokens(session, PROMPT), args.tokens)

    theirs, ours = [], []
    for _ in range(args.rounds):
        theirs.append(per_token_ms(mlx_lm_tokens(model, prompt_ids, args.tokens), args.tokens))
        ours.append(per_token_ms(our_tokens(session, PROMPT), args.tokens))
    calls_theirs = calls_per_token(mlx_lm_tokens(model, prompt_ids, args.tokens))
    calls_ours = calls_per_token(our_tokens(session, PROMPT))
    nodes_theirs, nodes_plain, nodes_routed = step_graphs(model, prompt_ids)

    head = f"an output head of {args.head} ids" if args.head else f"vocab {config['vocab_size']}"
    print(f"tiny 4-bit llama (2 layers × 64, {head}), a Mac's route on this CPU")
    print(f"{args.tokens} tokens a round, {args.rounds} rounds alternating; greedy; EOS ignored")
    columns = f"{'round':>5} {'mlx-lm ms/tok':>14} {'mlxswitch ms/tok':>17} {'ratio':>6}"
    print(columns + "   median interval: ratio")
    for i, ((a, a_mid), (b, b_mid)) in enumerate(zip(theirs, ours, strict=True)):
        print(f"{i:>5} {a:>14.3f} {b:>17.3f} {b / a:>6.3f}   {b_mid / a_mid:>21.3f}")
    ratio = statistics.median(b[0] / a[0] for a, b in zip(theirs, ours, strict=True))
    ratio_mid = statistics.median(b[1] / a[1] for a, b in zip(theirs, ours, strict=True))
    print(f"median ratio mlxswitch / mlx-lm generate_step, per token: {ratio:.3f} (target ≤ 1.05)")
    print(f"  the same from each round's median interval between tokens: {ratio_mid:.3f}")
    print(f"Python calls per decoded token (a run of its own): mlx-lm {calls_theirs}, mlxswitch {calls_ours}")
    print(
        f"graph nodes of one decode step: mlx-lm {nodes_theirs}, mlxswitch {nodes_plain} "
        f"(a routed step, signals by MLX ops: {nodes_routed})"
    )
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
