"""Decode speed of `peek` on the probe against `peek` on the margin, on the embedded default.

Both at the thresholds `mlxswitch calibrate` found best for the same target (its JSON record's
`per_signal_heldout`), interleaved over the same prompts in one process, greedy. The probe needs
the profile's trained probe (`mlxswitch calibrate` saves it). What the probe adds per token is
its score (measured by calibrate) plus the cheap step it forces at every position: the tok/s
and the g8 share here say what that comes to.

    uv run python bench/bench_probe_routing.py bench/results/calibrate-embedded.json [--repeats 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

from mlxswitch.api import open_chat, resolve_profile
from mlxswitch.bench.prompts import default_suite_path, load_prompts, select
from mlxswitch.decoding.session import GenerationSettings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("record", help="calibrate --json record of the embedded profile")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    best = json.loads(Path(args.record).read_text())["per_signal_heldout"]
    profile = resolve_profile(
        "embedded", policy="peek", signal="probe", window=1, min_run=1, tau=str(best["probe"]["tau"])
    )
    session = open_chat(profile, GenerationSettings(max_tokens=args.max_tokens))
    configs = {
        signal: dataclasses.replace(profile.router, signal=signal, up=(best[signal]["tau"],), down=None)
        for signal in ("margin", "probe")
    }
    prompts = select(load_prompts(default_suite_path()), quick=True, per_category=1)
    seen = {signal: {"tokens": 0, "seconds": 0.0, "top": 0, "rates": []} for signal in configs}
    for repeat in range(args.repeats + 1):  # round 0 warms up
        for prompt in prompts:
            for signal, config in configs.items():
                session.router_config = config
                session.reset()
                summary = session.ask(prompt.prompt)
                if not repeat or not summary.generated:
                    continue
                decode_s = summary.elapsed_s - summary.first_token_s
                stats = seen[signal]
                stats["tokens"] += summary.generated
                stats["seconds"] += summary.elapsed_s
                stats["top"] += sum(e.tier == "g8" for e in summary.tokens)
                stats["rates"].append((summary.generated - 1) / decode_s if decode_s > 0 else float("nan"))
    print(
        f"peek on each signal at its calibrated threshold, {len(prompts)} prompts × {args.repeats} repeats, "
        f"greedy, ≤ {args.max_tokens} tokens:"
    )
    for signal, stats in seen.items():
        print(
            f"  {signal:<7} tau {configs[signal].up[0]:<8g} g8 share {stats['top'] / stats['tokens']:.2f} · "
            f"decode {statistics.median(stats['rates']):.2f} tok/s (median per answer) · "
            f"{stats['tokens']} tokens"
        )


if __name__ == "__main__":
    main()
