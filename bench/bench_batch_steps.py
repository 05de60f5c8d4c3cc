"""Where a batched first token's time goes: one answer against several added at once.

    uv run python bench/bench_batch_steps.py [--profile embedded-plain] [--answers 4] [--rounds 2]

In-process, on `serve`'s engine for single models (decoding/batch.py, mlx-lm's BatchGenerator),
no HTTP: `--answers` prompts are added at the same moment and the batch is stepped until they
end; printed per level are the median first token and the seconds of each step (the first is the
prompts' prefill, the second the split into decoding, the third the first decode step, which
hands out the first token). Each prompt is numbered, as bench_serve.py's are; with the prompt
cache, a later prompt reuses the beginning it shares with an earlier one (the system prompt).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

from mlxswitch.api import build_ladder, resolve_profile
from mlxswitch.decoding.batch import BatchedAnswers
from mlxswitch.decoding.prompt_caches import PromptCaches
from mlxswitch.decoding.session import ChatSession, GenerationSettings

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def level(engine: BatchedAnswers, session: ChatSession, answers: int, numbers) -> tuple[float, list[float]]:
    """Add `answers` prompts at once and step until all end: (median first token s, step seconds)."""
    firsts: dict[int, float] = {}
    started = time.perf_counter()
    for _ in range(answers):
        prepared = session.prepare_conversation(
            [{"role": "user", "content": f"Request {next(numbers)}. {PROMPT}"}]
        )
        handle: list[int] = []

        def deliver(event, handle=handle) -> None:
            if handle and handle[0] not in firsts and hasattr(event, "id"):
                firsts[handle[0]] = time.perf_counter() - started

        handle.append(engine.add(prepared, deliver))
    steps = []
    while engine.active:
        step_started = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - step_started)
    return statistics.median(firsts.values()), steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="embedded-plain")
    parser.add_argument("--answers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=8)
    args = parser.parse_args()
    profile = resolve_profile(args.profile)
    session = ChatSession(build_ladder(profile), profile.router, GenerationSettings(max_tokens=args.tokens))
    numbers = itertools.count(1)
    for cached in (False, True):
        engine = BatchedAnswers(session, max(8, args.answers), PromptCaches() if cached else None)
        level(engine, session, 1, numbers)  # warm-up (and, with the cache, the shared beginning kept)
        for _ in range(args.rounds):
            for answers in (1, args.answers):
                first, steps = level(engine, session, answers, numbers)
                shown = ", ".join(f"{s * 1000:.0f}" for s in steps[:4])
                cache = "on " if cached else "off"
                head = f"prompt cache {cache}  {answers} answer(s): first token {1000 * first:4.0f} ms"
                print(f"{head}  steps (ms): {shown}, …")


if __name__ == "__main__":
    main()
