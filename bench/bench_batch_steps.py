"""Where a batched first token's time goes: one answer against several added at once.

    uv run python bench/bench_batch_steps.py [--profile embedded-plain] [--answers 4] [--rounds 2]
    uv run --extra qwen-coder python bench/bench_batch_steps.py --profile qwen2.5-coder-0.5b-1.5b

In-process, on `serve`'s engine (decoding/engine.py, packed passes), no HTTP: `--answers` prompts are
added at the same moment and the batch is stepped until they end; printed per level are the
median first token, the seconds of the first steps, the median of the later ones (decoding) and
the tokens per second of the whole level. The first step is the prefill and hands out the first
token (on mlx-lm's batch, which served one-model profiles until the commit after 2cc699c, a
first token took three steps: the prefill, the split into decoding, the first decode step).
Each prompt is numbered, as bench_serve.py's are; with the prompt cache, a later prompt reuses
the beginning it shares with an earlier one (the system prompt).

The ratios of the level with `--answers` to the one-answer level are the floors of serve's
figures against one client (bench_serve.py), HTTP left out: its first byte cannot come sooner
than this first token, nor its tokens per second pass this rate.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

from mlxswitch.api import build_ladder, resolve_profile
from mlxswitch.decoding.answer import TokenEvent
from mlxswitch.decoding.engine import Engine, batch_engine
from mlxswitch.decoding.prompt_caches import PromptCaches
from mlxswitch.decoding.session import ChatSession, GenerationSettings

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def level(engine: Engine, session: ChatSession, answers: int, numbers) -> tuple[float, list[float], int]:
    """Add `answers` prompts at once and step until all end: (median first token s, step seconds,
    tokens made)."""
    firsts: dict[int, float] = {}
    made: list[int] = []
    started = time.perf_counter()
    for _ in range(answers):
        prepared = session.prepare_conversation(
            [{"role": "user", "content": f"Request {next(numbers)}. {PROMPT}"}]
        )
        handle: list[int] = []

        def deliver(event, handle=handle) -> None:
            if handle and isinstance(event, TokenEvent):
                firsts.setdefault(handle[0], time.perf_counter() - started)
                made.append(1)

        handle.append(engine.add(prepared, deliver))
    steps = []
    while engine.active:
        step_started = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - step_started)
    return statistics.median(firsts.values()), steps, len(made)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="embedded-plain")
    parser.add_argument("--answers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=8)
    args = parser.parse_args()
    profile = resolve_profile(args.profile)
    session = ChatSession(
        build_ladder(profile),
        profile.router,
        GenerationSettings(max_tokens=args.tokens),
        decoding=profile.decoding,
    )
    numbers = itertools.count(1)
    for cached in (False, True):
        engine = batch_engine(session, max(8, args.answers), PromptCaches() if cached else None)
        level(engine, session, 1, numbers)  # warm-up (and, with the cache, the shared beginning kept)
        for _ in range(args.rounds):
            for answers in (1, args.answers):
                first, steps, tokens = level(engine, session, answers, numbers)
                shown = ", ".join(f"{s * 1000:.0f}" for s in steps[:3])
                later = statistics.median(steps[3:]) if len(steps) > 3 else float("nan")
                cache = "on " if cached else "off"
                head = f"prompt cache {cache}  {answers} answer(s): first token {1000 * first:4.0f} ms"
                rate = tokens / sum(steps)
                print(
                    f"{head}  steps (ms): {shown}, … later {1000 * later:.0f}  {rate:.2f} tok/s", flush=True
                )


if __name__ == "__main__":
    main()
