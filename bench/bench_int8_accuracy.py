"""The CPU default's rounding (int8 activations, fp16 scales) against fp32, teacher-forced: do the
greedy tokens agree?

    uv run --extra qwen-coder python bench/bench_int8_accuracy.py [--models A,B] [--limit 10] [--reference]
    uv run python bench/bench_int8_accuracy.py --models embedded:smollm2-135m   # the embedded model
    uv run python bench/bench_int8_accuracy.py --models embedded:smollm2-135m --int8-min-inputs 512

Each model is loaded twice: on the CPU default (`auto`: fp32 scales and biases narrowed to fp16
where in range) and on `exact` (as loaded: fp32). Per prompt (bench/prompts/everyday-heldout7.jsonl):
the default's greedy continuation (the quantized kernel, activations rounded to int8 for
decoding's passes), then the prompt and that continuation teacher-forced through the default (the
continuation in passes of up to 32 positions, as decoding's steps and checks make them), through
int8 activations on the fp32 scales (the exact load on `auto`: the default before fp16 scales),
and through `exact` (the same kernel on fp32 activations and scales, same passes); with
--reference also through MLX's own route (plain mx ops, one pass; slow). Per position: whether
each arm's argmax is the baseline's (`exact`, or MLX's with --reference); where the default's is
not, the baseline's gap between its top token and the default's; the largest logit difference
from the baseline. The first line checks that teacher forcing reproduces the default's own greedy
tokens (a pass of k positions computes a position as a step does).

--down int8 or --down split:T:K measures a route not built yet: the default arm's down
projections (on fp32 activations in the code) take int8 activations too, and with split:T:K each
row's inputs above T times the row's RMS (at most K, the largest) are left out of the int8 product
and multiplied in float64 on the dequantized codes instead. An emulation in NumPy: its answers,
not its speed, say whether such a kernel path would be accurate enough.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from mlxswitch.kernels import quant_cpu, quant_linear, quant_weights
from mlxswitch.kernels.route import current_route, kernels_override
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


def _columns(weight, idx: np.ndarray) -> np.ndarray:
    """W[:, idx] in float64 (out × k) from a kernel view (4-bit codes two a byte, or one a byte)."""
    rows = weight.codes.reshape(weight.out_dims, -1)
    if weight.bits == 4:
        packed = rows[:, idx // 2]
        codes = np.where(idx % 2 == 1, packed >> 4, packed & 15).astype(np.float64)
    else:
        codes = rows[:, idx].astype(np.float64)
    group = idx // weight.group_size
    scales = quant_weights.scale_floats(weight.scales.reshape(weight.out_dims, -1)[:, group])
    return scales * codes + quant_weights.scale_floats(weight.biases.reshape(weight.out_dims, -1)[:, group])


def down_spec(text: str) -> tuple[float, int]:
    """--down: int8 (no input split off: ratio inf, none) or split:T:K (ratio T, at most K)."""
    kind, *numbers = text.split(":")
    try:
        if kind == "int8" and not numbers:
            return math.inf, 0
        if kind == "split" and len(numbers) == 2:
            return float(numbers[0]), int(numbers[1])
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"--down takes int8 or split:T:K (got {text!r})")


@contextlib.contextmanager
def down_projections(spec: tuple[float, int] | None):
    """While it runs, layers on fp32 activations (down projections) take int8 ones, as --down says
    (down_spec: inputs above ratio times the row's RMS, at most `most`, split off)."""
    if spec is None:
        yield
        return
    ratio, most = spec
    real = quant_linear.quant_rows_times

    def product(xs, weights, decoding, int8_inputs):
        if int8_inputs or not decoding:
            return real(xs, weights, decoding, int8_inputs)
        xs = np.ascontiguousarray(xs, dtype=np.float32)
        clean, parts = xs.copy(), []
        for r, row in enumerate(xs):
            rms = np.sqrt(np.mean(row.astype(np.float64) ** 2))
            idx = np.flatnonzero(np.abs(row) > ratio * rms)
            idx = np.sort(idx[np.argsort(-np.abs(row[idx]))[:most]])
            clean[r, idx] = 0
            parts.append(idx)
        y = quant_cpu.quant_weights_times(clean, weights, current_route().blas_threads, True, by_row=True)
        for r, idx in enumerate(parts):
            for weight in weights:
                if idx.size:
                    y[r] += (_columns(weight, idx) @ xs[r, idx].astype(np.float64)).astype(np.float32)
        return y

    quant_linear.quant_rows_times = product
    try:
        yield
    finally:
        quant_linear.quant_rows_times = real


def source_of(name: str) -> str:
    """A model source as `load_model` takes it: a packaged model's name, or a source with its
    scheme (`embedded:smollm2-135m`, the embedded default)."""
    return name if ":" in name else f"package:{name}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="qwen2.5-coder-0.5b-instruct,qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--prompts", default=str(ROOT / "prompts" / "everyday-heldout7.jsonl"))
    parser.add_argument("--limit", type=int, default=10, help="prompts from the file")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--reference", action="store_true", help="also MLX's reference route (slow)")
    parser.add_argument("--down", type=down_spec, help="int8 or split:T:K: down projections on int8")
    parser.add_argument(
        "--int8-min-inputs",
        type=int,
        help="rows at least this wide take int8 (default: quant_cpu.INT8_MIN_INPUTS; narrower take int16)",
    )
    args = parser.parse_args()
    if args.int8_min_inputs is not None:  # before any load: the layers are marked at load
        quant_cpu.INT8_MIN_INPUTS = args.int8_min_inputs
    lines = Path(args.prompts).read_text(encoding="utf-8").splitlines()
    prompts = [json.loads(line)["prompt"] for line in lines if line.strip()][: args.limit]
    arms = ("default", "int8 on fp32 scales", "exact")
    for name in args.models.split(","):
        with kernels_override("auto"):
            loaded = load_model(source_of(name))
        with kernels_override("exact"):
            stored = load_model(source_of(name)).model  # scales as loaded
        model, tokenizer = loaded.model, loaded.tokenizer
        agree = dict.fromkeys(arms, 0)
        worst: dict[str, list[float]] = {arm: [] for arm in arms}
        flips, total, self_check = [], 0, 0
        for text in prompts:
            chat = [{"role": "user", "content": text}]
            prompt = list(tokenizer.apply_chat_template(chat, add_generation_prompt=True))
            logits = {}
            with kernels_override("auto"), down_projections(args.down):
                continuation = greedy(model, prompt, args.tokens)
                logits["default"] = forced(model, prompt, continuation, PASS_ROWS)
            with kernels_override("auto"):
                logits["int8 on fp32 scales"] = forced(stored, prompt, continuation, PASS_ROWS)
            with kernels_override("exact"):
                logits["exact"] = forced(stored, prompt, continuation, PASS_ROWS)
            if args.reference:
                with kernels_override("reference"):
                    reference = forced(stored, prompt, continuation, len(continuation))
            else:
                reference = logits["exact"]
            default = logits["default"]
            self_check += int((default.argmax(-1) == np.array(continuation)).sum())
            truth = reference.argmax(-1)
            for arm in arms:
                agree[arm] += int((logits[arm].argmax(-1) == truth).sum())
                worst[arm].extend(np.abs(logits[arm] - reference).max(-1).tolist())
            for position in np.flatnonzero(default.argmax(-1) != truth):
                row = reference[position]
                flips.append(float(row[truth[position]] - row[default[position].argmax()]))
            total += len(continuation)
        baseline = "MLX's reference" if args.reference else "exact"
        print(f"{name}: {len(prompts)} prompts from {Path(args.prompts).name}, {total} positions")
        print(f"  teacher-forced default argmax = its own greedy token: {self_check}/{total}")
        print(f"  argmax equal to {baseline}'s: " + ", ".join(f"{arm} {agree[arm]}/{total}" for arm in arms))
        if flips:
            gaps = ", ".join(f"{g:.3f}" for g in flips)
            print(f"  where the default's differs, {baseline}'s top-two gap: {gaps}")
        print(
            f"  largest logit difference from {baseline} per position: "
            + "; ".join(
                f"{arm} median {statistics.median(worst[arm]):.3f}, max {max(worst[arm]):.3f}" for arm in arms
            )
        )


if __name__ == "__main__":
    main()
