"""Verified drafting's planner replayed on recorded answers: minutes, not an hour, per rule tried.

    uv run --extra qwen-coder --extra humaneval python bench/replay_drafting.py --collect \
        --traces bench/results/draft-traces-pair.json
    uv run python bench/replay_drafting.py --traces bench/results/draft-traces-pair.json

A verified answer is the top tier's own (greedy), so everything a round depends on is fixed by
that answer: the drafter's greedy token and its signals at every position, given the answer so
far, are one teacher-forced pass of each model (--collect), and a draft is kept up to the first
position where that token differs from the answer's. --collect also times each model's passes by
row count on this machine (best of a few, the machine otherwise idle). The replay then runs the
live loop's own round (decoding/verified_round.py) on models that read the trace (TracedModels),
with a clock that prices each pass from those costs (decoding.round_clock.PricedClock), and prints
per category the time against the top tier alone's (its prefill, then one-row passes); the test
tests/test_replay_round.py holds it to the live loop's rounds on an answer decoded live. A model of
the run, not a measurement (no timing noise, no Python between passes): compare its decisions
with a real run's (`mlxswitch bench --suite everyday`'s report) before trusting a rule it prefers.

Answers: by default the large arm's in bench/results/everyday-pair.jsonl (35 everyday prompts,
64 tokens) and the 1.5B alone's in bench/results/humaneval-pair-replay-answers.jsonl (20 held-out
HumanEval problems, 21-59: apart from the 61-99 the headline reports, so no rule tuned here sees
those); --everyday PROMPTS RECORDS traces another set's large arm (its suite is the prompt
file's name), and several --traces files replay together, priced by the first one's costs.
After a drafted token the check cuts, the drafter's later tokens are off the answer: their
signals are taken from the teacher-forced pass at the same position (they only decide how long
the already-failed draft runs).
"""

from __future__ import annotations

import argparse
import ast
import bisect
import json
import math
import sys
import time
from pathlib import Path

from mlxswitch.decoding.draft_memory import DraftMemory, PassCosts
from mlxswitch.decoding.drafting import MAX_DRAFT, DraftPlanner
from mlxswitch.decoding.lookup import LookupIndex
from mlxswitch.decoding.round_clock import PricedClock
from mlxswitch.decoding.verified_round import verified_round
from mlxswitch.routing.registry import uncertainty

ROOT = Path(__file__).resolve().parent
EVERYDAY_PROMPTS = ROOT / "prompts" / "everyday.jsonl"
EVERYDAY_RECORDS = ROOT / "results" / "everyday-pair.jsonl"
HUMANEVAL_RECORDS = ROOT / "results" / "humaneval-pair-replay-answers.jsonl"
PROFILE = "qwen2.5-coder-0.5b-1.5b"
TIMED_ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 16, 20, 24, 28, 33, 48, 64, 96, 128, 192, 256)


def _answers(everyday: list[tuple[str, str]], humaneval: bool) -> list[dict]:
    """(id, suite, category, prompt text, answer ids, ended, budget) of every recorded top-tier
    answer: the large arm's of each (prompts, records) pair, and the 1.5B alone's on HumanEval."""
    from mlxswitch.bench.humaneval.problems import instruction, load_problems

    out = []
    for prompts_path, records_path in everyday:
        texts = {}
        for line in Path(prompts_path).read_text().splitlines():
            if line.strip():
                p = json.loads(line)
                texts[p["id"]] = p["prompt"]
        for line in Path(records_path).read_text().splitlines():
            r = json.loads(line)
            # bench_everyday.py's records (git history) name the top tier's arm "large" and the
            # prompt "prompt"; the everyday suite's "top" and "task_id", one answer a round
            if r.get("arm") == "large" or (r.get("arm") == "top" and r.get("round", 1) == 1):
                ended = r["stats"]["generated"] < 64
                out.append(
                    dict(
                        id=r.get("task_id", r.get("prompt")),
                        suite=Path(prompts_path).stem,
                        category=r["category"],
                        prompt=texts[r.get("task_id", r.get("prompt"))],
                        ids=r["ids"],
                        ended=ended,
                        budget=64,
                    )
                )
    if not humaneval:
        return out
    problems = {p.task_id: p for p in load_problems()}
    for line in HUMANEVAL_RECORDS.read_text().splitlines():
        r = json.loads(line)
        if r.get("type") == "result" and r.get("arm") == "large alone":
            tokens = ast.literal_eval(r["tokens"]) if isinstance(r["tokens"], str) else r["tokens"]
            ids = [int(t["id"]) for t in tokens]
            ended = len(ids) < 384
            out.append(
                dict(
                    id=r["task_id"],
                    suite="humaneval",
                    category="humaneval",
                    prompt=instruction(problems[r["task_id"]]),
                    ids=ids,
                    ended=ended,
                    budget=384,
                )
            )
    return out


def trace_answer(ladder, prompt_ids: list[int], answer: list[int]) -> dict:
    """Each end of the ladder ("small": its bottom tier, "large": its top) teacher-forced over the
    answer after the prompt: its greedy token and signals at every answer position (and the one
    after the last)."""
    import mlx.core as mx
    import numpy as np
    from mlx_lm.models.cache import make_prompt_cache

    from mlxswitch.kernels.signals_numpy import numpy_token_signals

    out = {}
    for name, group in (("small", ladder.tiers[0].group), ("large", ladder.tiers[-1].group)):
        model = group.model.model
        cache = make_prompt_cache(model)
        model(mx.array(prompt_ids[:-1])[None], cache=cache)
        mx.eval([c.state for c in cache])
        fed = mx.array((prompt_ids + answer)[len(prompt_ids) - 1 :])[None]
        logits = np.asarray(model(fed, cache=cache)[0].astype(mx.float32))
        signals = numpy_token_signals(logits.astype(np.float64), np.float64)
        out[name] = dict(greedy=logits.argmax(axis=-1).tolist(), signals=np.round(signals, 5).tolist())
    return out


def collect(path: Path, everyday: list[tuple[str, str]], humaneval: bool) -> None:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

    from mlxswitch.api import build_ladder, resolve_profile
    from mlxswitch.decoding.session import ChatSession, GenerationSettings
    from mlxswitch.routing.router import RouterConfig

    profile = resolve_profile(PROFILE)
    ladder = build_ladder(profile, progress=lambda m: print(m, file=sys.stderr))
    session = ChatSession(ladder, RouterConfig(up=(float("inf"),)), GenerationSettings(max_tokens=1))
    eos = sorted(ladder.tokenizer.eos_token_ids)
    traces = []
    answers = _answers(everyday, humaneval)
    for i, a in enumerate(answers):
        prompt_ids = session.render([{"role": "user", "content": a["prompt"]}])
        answer = a["ids"] + ([eos[0]] if a["ended"] else [])
        entry = dict(
            id=a["id"],
            suite=a["suite"],
            category=a["category"],
            prompt_ids=prompt_ids,
            prompt_tokens=len(prompt_ids),
            answer=answer,
            ended=a["ended"],
            budget=a["budget"],
        )
        entry.update(trace_answer(ladder, prompt_ids, a["ids"]))
        traces.append(entry)
        print(f"traced {i + 1}/{len(answers)} {a['id']}", file=sys.stderr)
    costs = {}
    context = session.render([{"role": "user", "content": answers[0]["prompt"]}]) * 2
    for name, group in (("small", ladder.tiers[0].group), ("large", ladder.tiers[-1].group)):
        model = group.model.model
        cache = make_prompt_cache(model)
        model(mx.array(context)[None], cache=cache)
        mx.eval([c.state for c in cache])
        costs[name] = {}
        for rows in TIMED_ROWS:
            best = math.inf
            for _ in range(3 if rows <= 64 else 2):
                x = mx.array(context[:rows] if rows <= len(context) else (context * 4)[:rows])
                start = time.perf_counter()
                mx.eval(model(x[None], cache=cache)[0, -1])
                best = min(best, time.perf_counter() - start)
                trim_prompt_cache(cache, rows)
            costs[name][rows] = best
            print(f"timed {name} {rows} rows: {best * 1000:.1f} ms", file=sys.stderr)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            dict(
                profile=PROFILE,
                threshold=profile.router.up[0],
                signal=profile.router.signal,
                eos=eos,
                costs=costs,
                traces=traces,
            )
        )
    )
    tmp.replace(path)


class Costs:
    """Seconds of one model's pass by row count: the timed counts, linear between them."""

    def __init__(self, table: dict):
        self.rows = sorted(int(k) for k in table)
        self.seconds = [table[str(k)] if str(k) in table else table[k] for k in self.rows]

    def __call__(self, rows: int) -> float:
        i = bisect.bisect_left(self.rows, rows)
        if i < len(self.rows) and self.rows[i] == rows:
            return self.seconds[i]
        if i == 0:
            return self.seconds[0]
        if i == len(self.rows):
            slope = (self.seconds[-1] - self.seconds[-2]) / (self.rows[-1] - self.rows[-2])
            return self.seconds[-1] + slope * (rows - self.rows[-1])
        lo, hi = self.rows[i - 1], self.rows[i]
        w = (rows - lo) / (hi - lo)
        return (1 - w) * self.seconds[i - 1] + w * self.seconds[i]


class TracedModels:
    """The pair as a recorded answer's trace has them (decoding.verified_round.RoundModels): the
    drafter's greedy token and signals at each answer position, given the answer so far, and the
    top tier's samples, the answer itself. No pass runs: each is booked to the clock, priced."""

    def __init__(self, trace: dict, clock, threshold: float, signal: str, lookup: bool):
        self.trace, self.clock, self.threshold, self.signal = trace, clock, threshold, signal
        self.eos = trace["eos"]
        self.lookup_index = LookupIndex() if lookup else None
        self.ids = list(trace["prompt_ids"])  # the prompt and the answer so far
        self.prompt_tokens = trace["prompt_tokens"]
        self.drafter_seen, self.top_seen = 0, 0

    def extend_to(self, n: int) -> None:
        """The sequence read as far as the answer's first `n` tokens."""
        self.ids.extend(self.trace["answer"][len(self.ids) - self.prompt_tokens : n])

    def draft(self, made, planner):
        if made.room == 0:
            return
        length, greedy, signals = len(self.ids), self.trace["small"]["greedy"], self.trace["small"]["signals"]
        fed = length - self.drafter_seen if self.drafter_seen < length else 1
        self.clock.book("small", fed, self.drafter_seen < self.prompt_tokens)
        self.drafter_seen = length
        while True:  # the drafter's greedy token and signals at each answer position it reaches
            at = length - self.prompt_tokens + len(made.tokens)
            values = signals[at] if at < len(signals) else [math.nan] * 3
            token = greedy[at] if at < len(greedy) else -1
            if not made.take(token, values[0], uncertainty(self.signal, values), planner):
                return
            self.clock.book("small", 1, False)
            self.drafter_seen += 1
        yield  # a generator, as a live round's draft is; it runs no pass

    def check(self, draft: list[int], room: int):
        length = len(self.ids)
        rows = length - self.top_seen + len(draft)
        self.clock.book("large", rows, self.top_seen < self.prompt_tokens, check=True)
        n = length - self.prompt_tokens
        return self.trace["answer"][n : n + len(draft) + 1]  # the top tier's own tokens there
        yield  # a generator, as a live round's check is; it runs no pass

    def keep(self, kept: int) -> None:
        self.top_seen = len(self.ids) + kept
        self.drafter_seen = min(self.drafter_seen, self.top_seen)


def modelled(round_generator):
    """A round that runs no pass, run to its end: its value."""
    try:
        next(round_generator)
    except StopIteration as finished:
        return finished.value
    raise AssertionError("a modelled round asked for a pass")


def replay(
    trace: dict, small: Costs, large: Costs, threshold: float, signal: str, planner, lookup: bool = True
) -> dict:
    """One answer decoded by verified drafting: decoding.verified_round's rounds, the live loop's,
    run on the trace's models, priced by the cost tables."""
    answer, p0 = trace["answer"], trace["prompt_tokens"]
    top_sig = trace["large"]["signals"]
    budget = min(trace["budget"], len(answer))
    costs = {"small": small, "large": large}
    clock = PricedClock(planner, lambda model, rows: costs[model](rows))
    models = TracedModels(trace, clock, threshold, signal, lookup)
    n, total = 0, 0.0
    tally = dict(small_tokens=0, lookup_kept=0, model_kept=0)
    by_source = {source: [0.0, 0] for source in ("none", "lookup", "model")}  # seconds, tokens made
    while n < budget:
        models.extend_to(n)
        done = modelled(verified_round(models, planner, clock, budget - n, n == 0))
        if done.source == "model":
            tally["small_tokens"] += len(done.draft)
        total += clock.spent
        if n:  # the opening check is the prompt's prefill
            by_source[done.source][0] += clock.spent
            by_source[done.source][1] += done.kept + 1
        tally["lookup_kept" if done.source == "lookup" else "model_kept"] += done.kept
        n += done.kept
        if n >= budget:
            break
        planner.observe_top(top_sig[n][0])
        n += 1
    alone = large(p0) + (budget - 1) * large(1)
    small_alone = small(p0) + (budget - 1) * small(1)
    return dict(
        seconds=total,
        alone=alone,
        small_alone=small_alone,
        floor=small_alone + large(p0),
        by_source=by_source,
        **tally,
    )


def simulate(args: argparse.Namespace) -> None:
    data = json.loads(Path(args.traces[0]).read_text())
    for extra in args.traces[1:]:  # more answers, traced by the same run's models; the first's costs
        data["traces"] += json.loads(Path(extra).read_text())["traces"]
    small, large = Costs(data["costs"]["small"]), Costs(data["costs"]["large"])
    print(f"pass costs (s): large 1 row {large(1):.3f}, 8 rows {large(8):.3f}; small 1 row {small(1):.3f}")
    for t in data["traces"]:  # traces from before suites were named: everyday.jsonl's or HumanEval's
        t.setdefault("suite", "humaneval" if t["category"] == "humaneval" else "everyday")
    for suite in dict.fromkeys(t["suite"] for t in data["traces"]):
        traces = [t for t in data["traces"] if t["suite"] == suite]
        # One ladder's memory across the suite's answers, as the benches keep it; warm: with the
        # pass costs an earlier run kept (draft_store), as a chat on a machine used before starts.
        memory = DraftMemory()
        if args.store:
            kept = json.loads(Path(args.store).read_text())
            memory = DraftMemory(
                check=PassCosts({int(k): v for k, v in kept["check"].items()}),
                draft=PassCosts({int(k): v for k, v in kept["draft"].items()}),
            )
        elif not args.cold:
            memory = DraftMemory(
                check=PassCosts({r: large(r) for r in range(1, MAX_DRAFT + 2)}),
                draft=PassCosts({r: small(r) for r in range(1, MAX_DRAFT + 2)}),
            )
        by_cat: dict[str, list[dict]] = {}
        for t in traces:
            t["eos"] = data["eos"]
            planner = DraftPlanner(MAX_DRAFT, not args.fixed, memory, with_lookup=not args.no_lookup)
            r = replay(t, small, large, data["threshold"], data["signal"], planner, not args.no_lookup)
            by_cat.setdefault(t["category"], []).append(r)
            if args.verbose:
                ratio = r["seconds"] / r["alone"]
                print(
                    f"  {t['id']:14s} {ratio:.3f}× alone  small tokens {r['small_tokens']:3d}  "
                    f"kept model {r['model_kept']:3d} lookup {r['lookup_kept']:3d}"
                )
        print(f"{suite}: seconds against the top tier alone (modelled)")
        every = []
        for cat, rs in sorted(by_cat.items()):
            every += rs
            s, a = sum(r["seconds"] for r in rs), sum(r["alone"] for r in rs)
            drafted, model, lookup = (
                sum(r[k] for r in rs) for k in ("small_tokens", "model_kept", "lookup_kept")
            )
            print(
                f"  {cat:10s} {s / a:.3f}×   small drafted {drafted:4d}, "
                f"kept: model {model:4d}, lookup {lookup:4d}"
            )
        s, a = sum(r["seconds"] for r in every), sum(r["alone"] for r in every)
        f = sum(r["floor"] for r in every)
        print(f"  {'all':10s} {s / a:.3f}×   ({a / s:.2f}× faster; floor {a / f:.2f}×)")
        for source in ("none", "lookup", "model"):
            sec = sum(r["by_source"][source][0] for r in every)
            made = sum(r["by_source"][source][1] for r in every)
            if made:
                rate = made * large(1) / sec
                print(
                    f"    rounds of {source:6s}: {made:5d} tokens in {sec:7.1f} s, "
                    f"{rate:.2f}× the top tier's one-row rate"
                )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--traces", required=True, action="append", help="trace file (again: more answers, the first's costs)"
    )
    parser.add_argument("--collect", action="store_true", help="load the pair and trace the recorded answers")
    parser.add_argument(
        "--everyday",
        nargs=2,
        action="append",
        metavar=("PROMPTS", "RECORDS"),
        help="with --collect: an everyday prompt set and its records (the everyday suite's top arm, "
        "or an earlier bench_everyday.py record's large arm; again for more; default: everyday.jsonl "
        "and everyday-pair.jsonl)",
    )
    parser.add_argument("--no-humaneval", action="store_true", help="with --collect: leave HumanEval out")
    parser.add_argument("--fixed", action="store_true", help="replay the fixed rule, not the planner")
    parser.add_argument(
        "--no-lookup", action="store_true", help="model drafts only (a profile with lookup off)"
    )
    parser.add_argument("--store", help="start from the pass costs in this draft_store file")
    parser.add_argument("--cold", action="store_true", help="no pass costs known at the start (a first run)")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    if args.collect:
        everyday = args.everyday or [(str(EVERYDAY_PROMPTS), str(EVERYDAY_RECORDS))]
        collect(Path(args.traces[0]), everyday, not args.no_humaneval)
    else:
        simulate(args)


if __name__ == "__main__":
    main()
