"""Gears side by side in one run: decode tok/s and quality at each fixed gear and mixed.

    uv run python bench/bench_gears.py [--model embedded] [--gears 4,8] [--tau 0.5,1.0] [--tokens 48]

Each prompt is answered greedily on one nested model at every fixed gear and with the router at
each --tau. Quality is measured against the top gear: greedy-token agreement along the top gear's
own answer (teacher-forced) and the share of the top gear's NLL gap retained:
retained = (NLL_bottom − NLL_policy) / (NLL_bottom − NLL_top) on the top gear's tokens.
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx

from mlxswitch.decoding.session import ChatSession, GenerationSettings
from mlxswitch.models.gears import gear_report, prepare_geared
from mlxswitch.decoding.tiers import gear_ladder
from mlxswitch.models.loading import load_model
from mlxswitch.routing.router import RouterConfig, parse_thresholds

PROMPTS = ["What is the capital of France?", "Explain photosynthesis in two sentences.",
           "Write a haiku about the sea.", "Give three tips for learning to cook."]


def _per_position(model, prompt_ids, answer_ids, gear) -> tuple[list[float], list[float]]:
    """NLL of each reference token and entropy (bits) of each position's distribution, at `gear`."""
    from mlxswitch.routing.signals import token_signals

    model.gear_state.set(gear)
    logits = model(mx.array(prompt_ids + answer_ids)[None])[0, len(prompt_ids) - 1:-1].astype(mx.float32)
    logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    nll = -mx.take_along_axis(logp, mx.array(answer_ids)[:, None], axis=1)[:, 0]
    entropy = [float(token_signals(row)[0]) for row in logits]
    return nll.tolist(), entropy


def teacher_forced_policy(per_gear: dict, gears: list[int], config: RouterConfig) -> tuple[float, int]:
    """NLL of the reference under the tiers the router picks along it, and how many were top-tier."""
    from mlxswitch.routing.router import Router

    router = Router(config, len(gears))
    rung = router.start(per_gear[gears[0]][1][0]).rung
    total, top = 0.0, 0
    for i in range(len(per_gear[gears[0]][0])):
        nll, entropy = per_gear[gears[rung]][0][i], per_gear[gears[rung]][1][i]
        total += nll
        top += rung == len(gears) - 1
        rung = router.observe(entropy).rung
    return total, top


def main() -> None:
    """Run fixed gears and mixed settings over the prompts; print one table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--gears", default="4,8")
    parser.add_argument("--tau", action="append", default=None, help="up thresholds (repeatable)")
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--min-run", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    gears = [int(g) for g in args.gears.split(",")]
    taus = args.tau or ["0.5", "1.0", "1.5"]

    t0 = time.perf_counter()
    loaded = prepare_geared(load_model(args.model), tuple(gears))
    print(f"nested {loaded.name} in {time.perf_counter() - t0:.1f} s")
    for line in gear_report(loaded.model, loaded.config["mlxswitch_gears"]["source_bits"]).lines():
        print(line)
    settings = GenerationSettings(max_tokens=args.tokens)
    runs = {f"g{g} only": (gear_ladder(loaded, [g]), RouterConfig(up=())) for g in gears}
    for tau in taus:
        up = parse_thresholds(tau)
        runs[f"mixed τ={tau}"] = (gear_ladder(loaded, gears),
                                  RouterConfig(up=up, down=tuple(0.6 * u for u in up),
                                               window=args.window, min_run=args.min_run))
    results = {name: [] for name in runs}
    for prompt in PROMPTS:
        for name, (ladder, config) in runs.items():
            ladder.reset()
            results[name].append(ChatSession(ladder, config, settings).ask(prompt))
    top_name = f"g{gears[-1]} only"
    print(f"\n{'run':>14} {'tok/s':>6} {'top share':>9} {'agree':>6} {'TF top share':>12} {'retained':>8}")
    references = []
    for prompt, reference in zip(PROMPTS, results[top_name]):
        ids = ChatSession(runs[top_name][0], RouterConfig(up=())).render([{"role": "user", "content": prompt}])
        ref_ids = [e.id for e in reference.tokens]
        references.append((ref_ids, {g: _per_position(loaded.model, ids, ref_ids, g) for g in gears}))
    bottom_nll = sum(sum(p[gears[0]][0]) for _, p in references)
    top_nll = sum(sum(p[gears[-1]][0]) for _, p in references)
    for name, answers in results.items():
        generated = sum(a.generated for a in answers)
        rate = generated / sum(a.elapsed_s - a.first_token_s for a in answers)
        share = sum(a.tier_counts.get(f"g{gears[-1]}", 0) for a in answers) / max(1, generated)
        agree = sum(sum(x.id == y for x, y in zip(a.tokens, ref)) for a, (ref, _) in zip(answers, references))
        positions = sum(len(ref) for ref, _ in references)
        config = runs[name][1]
        if len(config.up) == len(gears) - 1:
            policy = [teacher_forced_policy(p, gears, config) for _, p in references]
            policy_nll, tf_top = sum(x for x, _ in policy), sum(t for _, t in policy) / positions
        else:
            g = int(name.split()[0][1:])
            policy_nll = sum(sum(p[g][0]) for _, p in references)
            tf_top = 1.0 if g == gears[-1] else 0.0
        gap = bottom_nll - top_nll
        retained = (bottom_nll - policy_nll) / gap if gap > 0 else float("nan")
        print(f"{name:>14} {rate:>6.2f} {share:>9.2f} {agree / positions:>6.2f} {tf_top:>12.2f} {retained:>8.2f}")
    print(f"\nNLL/token along the top gear's answers: g{gears[0]} {bottom_nll / positions:.3f}, "
          f"g{gears[-1]} {top_nll / positions:.3f}")


if __name__ == "__main__":
    main()
