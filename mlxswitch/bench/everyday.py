"""The everyday suite (`mlxswitch bench --suite everyday`): does the profile buy time on everyday
requests, against its top tier alone, on this machine?

Each prompt (bench_prompts/everyday.jsonl: code, prose, shell, SQL, maths, written for this bench,
none from HumanEval; or `--prompts`) is answered greedily by every arm, the arms rotated prompt by
prompt so that the machine's drift hits them alike; with `--repeats N`, N rounds, each prompt's
arms in another order each round (two arms: both orders over two rounds), the figures pooled over
every round. One record per (prompt, arm, round) is appended as it finishes, in humaneval's
records format (a header of settings, fsynced lines, a torn last line dropped), so the same
command run again goes on where it stopped (or with a larger `--repeats`, on to the next round),
and `--report` reads it without loading a model. Arms:

- `top`: the top tier alone (plain decoding, no prompt lookup): the bar.
- `bottom`: the bottom tier alone: the floor of what drafting can reach.
- `profile`: the profile as configured (the shipped pair: verified drafting, adaptive, lookup).
- `fixed` (two local tiers): verified drafting with fixed-length model drafts and no lookup.

Each arm keeps what it learns (pass costs, kept shares) across its own answers, as a chat does,
starting from what earlier runs on this machine saved.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..decoding.draft_memory import DraftMemory, PassCosts
from ..decoding.mode import DecodingMode
from ..decoding.session import ChatSession, GenerationSettings
from ..decoding.tiers import Ladder
from ..errors import SettingError, UsageError
from ..profiles import Profile
from ..resources import bundled_file
from ..routing.router import RouterConfig
from .humaneval.records import Records, profile_settings
from .prompts import BenchPrompt
from .runner import PLAIN, forced_config
from .seconds import drafting_net, merged_passes

ARMS = ("top", "bottom", "profile", "fixed")
DEFAULT_ARMS = ("top", "profile")
DEFAULT_MAX_TOKENS = 64
Progress = Callable[[str, int, int], None]  # (stage, done, total)


def default_prompts_path() -> Path:
    """The bundled everyday prompts (the package's bench_prompts/, or bench/prompts/ in a checkout)."""
    return bundled_file("bench_prompts/everyday.jsonl", "bench/prompts/everyday.jsonl")


def parse_arms(text: str | None, profile: Profile) -> tuple[str, ...]:
    """`--arms a,b,…` (default: top,profile) in ARMS order; a UsageError for an unknown one, or
    for `fixed` on a ladder that is not two local tiers."""
    if text is None:
        return DEFAULT_ARMS
    asked = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [part for part in asked if part not in ARMS]
    if unknown or not asked:
        raise UsageError(f"--arms for --suite everyday: choose among {', '.join(ARMS)} (got '{text}')")
    if "fixed" in asked:
        config, mode = arm_decoding("fixed", profile)
        try:
            mode.validate(config, len(profile.tier_names()))
        except SettingError as exc:
            raise UsageError(f"the fixed arm cannot run on '{profile.name}': {exc}") from None
    return tuple(arm for arm in ARMS if arm in asked)


def arm_decoding(arm: str, profile: Profile) -> tuple[RouterConfig, DecodingMode]:
    """The router settings and decoding mode an arm answers with."""
    n = len(profile.local_tiers())
    if arm == "top":
        return forced_config(n, n - 1), PLAIN
    if arm == "bottom":
        return forced_config(n, 0), PLAIN
    if arm == "fixed":  # the profile's threshold ends the drafts
        return profile.router, DecodingMode(verify=True, draft="fixed", lookup=False)
    return profile.router, profile.decoding


def settings(profile: Profile, prompts: list[BenchPrompt], max_tokens: int) -> dict:
    """The header's settings: what must match for a records file to be resumed (arms may differ:
    a run adds the arms it asks for)."""
    texts = "\n".join(f"{p.id}\t{p.prompt}" for p in prompts)
    return {
        "suite": "everyday",
        **profile_settings(profile),
        "max_tokens": max_tokens,
        "prompts": hashlib.sha256(texts.encode()).hexdigest()[:16],
    }


@dataclass
class EverydayRun:
    """What one run answers: the prompts, the arms and the records it appends to."""

    profile: Profile
    prompts: list[BenchPrompt]
    arms: tuple[str, ...]
    max_tokens: int
    records: Records
    rounds: int = 1


def answers(records: Records) -> dict[tuple[str, str, int], dict]:
    """The result records by (prompt id, arm, round); a record without a round (before rounds
    were kept) is round 1's."""
    return {
        (r["task_id"], r["arm"], r.get("round", 1)): r for r in records.lines if r.get("type") == "result"
    }


def arm_order(arms: tuple[str, ...], prompt: int, round_: int) -> tuple[str, ...]:
    """The arms in the order they answer prompt `prompt` (0-based) in round `round_` (1-based):
    rotated by one a prompt and one a round, so each prompt sees another order each round."""
    shift = (prompt + round_ - 1) % len(arms)
    return arms[shift:] + arms[:shift]


def open_run(
    profile: Profile,
    prompts: list[BenchPrompt],
    arms: tuple[str, ...],
    max_tokens: int,
    records_path: Path,
    restart: bool = False,
    read_only: bool = False,
    rounds: int = 1,
) -> EverydayRun:
    """The records opened (or resumed; refused when made with other settings) for these prompts.
    `rounds` may differ from the run before: a run asking for more goes on with the next round."""
    wanted = settings(profile, prompts, max_tokens)
    records = Records.open(records_path, wanted, restart=restart, read_only=read_only)
    if records.header is None and not read_only:
        records.start(wanted, {"prompts": [p.id for p in prompts]})
    return EverydayRun(profile, prompts, arms, max_tokens, records, rounds)


def run(everyday: EverydayRun, ladder: Ladder, progress: Progress | None = None) -> dict:
    """Answer every (prompt, arm, round) the records lack, round by round, arms rotated by prompt
    and by round (arm_order); the report."""
    say = progress or (lambda stage, done, total: None)
    done = answers(everyday.records)
    todo = [
        (round_, p, arm)
        for round_ in range(1, everyday.rounds + 1)
        for i, p in enumerate(everyday.prompts)
        for arm in arm_order(everyday.arms, i, round_)
        if (p.id, arm, round_) not in done
    ]
    kept = ladder.draft_memory
    memories = {
        arm: DraftMemory(check=PassCosts(dict(kept.check.seconds)), draft=PassCosts(dict(kept.draft.seconds)))
        for arm in everyday.arms
    }
    rungs: dict[str, dict] = {arm: {} for arm in everyday.arms}
    # One session, its conversation reset and its caches emptied between answers.
    config, mode = arm_decoding(everyday.arms[0], everyday.profile)
    settings_ = GenerationSettings(max_tokens=everyday.max_tokens, temperature=0.0)
    session = ChatSession(ladder, config, settings_, decoding=mode)
    try:
        for made, (round_, prompt, arm) in enumerate(todo):
            say("answering", made, len(todo))
            ladder.draft_memory, ladder.rung_memory = memories[arm], rungs[arm]
            session.decode_with(*arm_decoding(arm, everyday.profile))
            session.reset()
            started = time.perf_counter()
            summary = session.ask(prompt.prompt)
            wall = time.perf_counter() - started
            everyday.records.append(
                {
                    "type": "result",
                    "task_id": prompt.id,
                    "category": prompt.category,
                    "arm": arm,
                    "round": round_,
                    "ids": [e.id for e in summary.tokens],
                    "text": summary.text,
                    "wall_s": round(wall, 4),
                    "stats": summary.stats(),
                }
            )
            ladder.reset()
        say("answering", len(todo), len(todo))
    finally:
        ladder.draft_memory = kept
        everyday.records.close()
    return report(everyday)


def report(everyday: EverydayRun) -> dict:
    """Per category and arm, seconds per answer and against the top tier alone, pooled over every
    round the records hold, and the whole set's ratio round by round; answers token for token the
    top tier's (in the same round); first token; tokens by proposer. Over the (prompt, round)
    pairs every arm answered."""
    by = answers(everyday.records)
    arms = [a for a in everyday.arms if any(key[1] == a for key in by)]
    rounds = sorted({key[2] for key in by})
    answered = [(p, n) for n in rounds for p in everyday.prompts if all((p.id, a, n) in by for a in arms)]
    categories = sorted({p.category for p, _ in answered})
    rows = [
        {
            "category": category,
            **_pooled(by, arms, [(p, n) for p, n in answered if category in ("all", p.category)]),
        }
        for category in [*categories, "all"]
    ]
    per_arm = {}
    for a in arms:
        records = [by[(p.id, a, n)] for p, n in answered]
        proposers: dict[str, int] = {}
        for r in records:
            for name, count in r["stats"].get("proposers", {}).items():
                proposers[name] = proposers.get(name, 0) + count
        firsts = [r["stats"]["first_token_s"] for r in records if r["stats"].get("first_token_s") is not None]
        per_arm[a] = {
            "passes": _passes(records),
            "answers": len(records),
            "tokens": sum(len(r["ids"]) for r in records),
            "same_as_top": (
                sum(by[(p.id, a, n)]["ids"] == by[(p.id, "top", n)]["ids"] for p, n in answered)
                if "top" in arms
                else None
            ),
            "median_first_token_s": statistics.median(firsts) if firsts else None,
            "proposers": proposers,
            "drafting": _drafting(records, everyday.profile.local_tiers()[-1]),
        }
    return {
        "suite": "everyday",
        "profile": {"name": everyday.profile.name, "tiers": list(everyday.profile.tier_names())},
        "records": str(everyday.records.path),
        "arms": arms,
        "max_tokens": everyday.max_tokens,
        "prompts": len({p.id for p, _ in answered}),
        "rounds": len({n for _, n in answered}),
        "categories": rows,
        "by_round": [
            {"round": n, **_pooled(by, arms, [(p, m) for p, m in answered if m == n])}
            for n in sorted({n for _, n in answered})
        ],
        "per_arm": per_arm,
    }


def _passes(records: list[dict]) -> dict:
    """Where these answers' seconds went (seconds.merged_passes over each answer's pass ledger):
    passes, rows and seconds by model and kind ("large 1", "small 2-3", "large prefill", …), and
    `rest_s`, what no pass claimed (sampling, detokenizing, Python); none where an answer kept none."""
    merged = merged_passes([r["stats"].get("passes") or {} for r in records])
    return {"rest_s": 0.0} if merged is None else {**merged[0], "rest_s": merged[1]}


def _drafting(records: list[dict], top_tier: str) -> dict | None:
    """What drafting saved these answers by their own ledgers (seconds.drafting_net), with their
    wall seconds and those seconds against the same answers a step a token: a projection from the
    arm's measured passes, not a measurement (the arms' wall ratio is that)."""
    ledgers = [(r["stats"].get("passes") or {}, r["stats"].get("generated", len(r["ids"]))) for r in records]
    if not ledgers or any(not ledger for ledger, _ in ledgers):
        return None
    net = drafting_net(ledgers, top_tier)
    if net is None:
        return None
    wall = sum(r["wall_s"] for r in records)
    return {**net, "wall_s": wall, "vs_one_a_step": wall / (wall + net["saved_s"])}


def _pooled(by: dict, arms: list[str], pairs: list[tuple[BenchPrompt, int]]) -> dict:
    """Over these (prompt, round) pairs: how many, each arm's seconds per answer and its total
    time against the top tier's."""
    walls = {a: sum(by[(p.id, a, n)]["wall_s"] for p, n in pairs) for a in arms}
    return {
        "answers": len(pairs),
        "seconds_per_answer": {a: walls[a] / len(pairs) if pairs else None for a in arms},
        "vs_top": {a: walls[a] / walls["top"] if "top" in walls and walls["top"] else None for a in arms},
    }
