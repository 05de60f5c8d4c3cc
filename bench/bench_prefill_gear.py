"""What the prefill gear costs and buys on the embedded default (gears 4/8 of SmolLM2-135M).

A gear ladder prefills the prompt at its top gear (two planes per layer). Prefilling at gear 4
instead would make the first token as fast as `embedded-plain`'s; this measures both sides:

1. time to first token (prompt + one token), one prompt per category of the suite, for
   embedded (prefill g8), embedded (prefill g4) and embedded-plain, interleaved in one process;
2. teacher-forced NLL of g8's greedy answers to the suite's calibration prompts, with the prompt
   K/V written at g8 or at g4 and the answer at g4 or g8 (`teacher_forced` honours the gear the
   cache group prefills at), and the share of the g4 → g8 gap that a g4 prompt gives up.

    uv run python bench/bench_prefill_gear.py [--repeats 3] [--max-tokens 48]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from mlxswitch.api import open_chat
from mlxswitch.bench.prompts import default_suite_path, load_prompts, select
from mlxswitch.bench.runner import collect_positions
from mlxswitch.bench.teacher import teacher_forced
from mlxswitch.decoding.session import GenerationSettings


def first_token_times(repeats: int) -> None:
    prompts = select(load_prompts(default_suite_path()), quick=True, per_category=1)
    geared = open_chat("embedded", GenerationSettings(max_tokens=1))
    plain = open_chat("embedded-plain", GenerationSettings(max_tokens=1))
    group = geared.ladder.groups[0]
    arms = {
        "embedded, prefill g8": (geared, 8),
        "embedded, prefill g4": (geared, 4),
        "embedded-plain": (plain, None),
    }
    times: dict[str, list[float]] = {name: [] for name in arms}
    for repeat in range(repeats + 1):  # the first round warms up and is not counted
        for prompt in prompts:
            for name, (session, gear) in arms.items():
                if gear is not None:
                    group.prefill_gear = gear
                session.reset()
                summary = session.ask(prompt.prompt, 1)
                if repeat:
                    times[name].append(summary.first_token_s)
    group.prefill_gear = 8
    tokens = [len(geared.render([{"role": "user", "content": p.prompt}])) for p in prompts]
    print(
        f"time to first token, {len(prompts)} prompts ({min(tokens)}–{max(tokens)} tokens)"
        f" × {repeats} repeats:"
    )
    base = statistics.median(times["embedded-plain"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:<22} median {median * 1000:6.0f} ms  ({median / base:.2f}× embedded-plain)")


def prompt_gear_quality(max_tokens: int) -> None:
    prompts = select(load_prompts(default_suite_path()), split="calibration")
    session = open_chat("embedded")
    ladder = session.ladder
    _, prompt_ids, _, answers, top_prefill = collect_positions(ladder, prompts, max_tokens)
    ladder.groups[0].prefill_gear = 4
    cheap_prefill = [teacher_forced(ladder, p.id, prompt_ids[p.id], answers[p.id]) for p in prompts]
    ladder.groups[0].prefill_gear = 8
    nll = {
        (prefill, tier): float(np.mean(np.concatenate([p.nll[r] for p in forced])))
        for prefill, forced in (("g8", top_prefill), ("g4", cheap_prefill))
        for r, tier in enumerate(("g4", "g8"))
    }
    n = sum(len(a) for a in answers.values())
    print(
        f"teacher-forced NLL (nats/token) of g8's greedy answers, {len(prompts)} calibration prompts,"
        f" {n} tokens:"
    )
    print(f"  {'prompt K/V written at':<24}{'answer at g4':>14}{'answer at g8':>14}")
    for prefill in ("g8", "g4"):
        print(f"  {prefill:<24}{nll[prefill, 'g4']:>14.4f}{nll[prefill, 'g8']:>14.4f}")
    gap = nll["g4", "g4"] - nll["g8", "g8"]
    lost = nll["g4", "g8"] - nll["g8", "g8"]
    print(
        f"  a g4 prompt gives up {lost:.4f} of the {gap:.4f} g4 → g8 gap ({100 * lost / gap:.0f}%) "
        "even when every answer token is made at g8"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    first_token_times(args.repeats)
    prompt_gear_quality(args.max_tokens)


if __name__ == "__main__":
    main()
