"""A HumanEval run: every arm on every problem, interleaved, each answer executed, every result
appended to the records file as it finishes — so a stopped run resumes where it stopped.

Order, per problem (round-robin as the bench's speed arms: machine drift hits every arm alike):
bottom alone, top alone (then the teacher-forced arrays along its answer, and where the bottom
tier's greedy token differs, for the oracle), the profile, the swept points, the random
controls (each after the arm it matches), the oracle, mlx-lm on each tier, speculative.
Before the first problem, when swept arms are asked for, each swept policy's thresholds are
chosen along the top tier's greedy answers to the first `threshold_problems` calibration-half
problems of the run (or of all problems, when the run has none from that half), and kept in the
header: at each of `sweep_points` shares of top-tier tokens from 0.1 to 0.3 (the range of the
EAD paper's table), the threshold whose teacher-forced replay at that policy's own timing gives
the share nearest it. At one threshold `ead` and `peek` send very different shares, so a sweep at
shared thresholds would compare them at different costs. The calibrated setting's threshold
comes from the same answers: peek's, nearest `target_share` (the share calibrate would promise;
the report sets the live share beside it).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ...decoding.session import ChatSession, GenerationSettings, PolicyFactory
from ...decoding.tiers import Ladder
from ...kernels import preloaded_mlx_blas
from ...profiles import Profile
from ...routing.registry import POLICY_BY_NAME
from .. import simulate
from ..prompts import BenchPrompt
from ..runner import PLAIN, Arm, engine_run, forced_config, mlx_lm_run, sweep_config
from ..stock import StockModels
from ..teacher import teacher_forced
from . import arms as arm_sets
from .controls import OraclePolicy, RandomPolicy, control_seed
from .execution import (
    DEFAULT_MEMORY_MB,
    DEFAULT_TIMEOUT_S,
    network_namespace_works,
    run_program,
)
from .oracle import disagreements
from .problems import PROMPT_VERSION, Problem, extract_code, instruction, program
from .records import Records, profile_settings

Progress = Callable[[str, int, int], None]  # (stage, done, total), as the bench's
# The range of top-tier shares a sweep aims at: the EAD paper's table (its headline is at 0.25).
SWEEP_SHARES = (0.1, 0.3)


@dataclass(frozen=True)
class HumanEvalOptions:
    """What a run does; every field is part of the settings a resumed run must share."""

    max_tokens: int = 512
    groups: tuple[str, ...] = arm_sets.GROUPS
    sweep_points: int = 5
    threshold_problems: int = 4
    target_share: float = 0.2  # the calibrated setting's promised share of top-tier tokens
    timeout_s: float = DEFAULT_TIMEOUT_S
    memory_mb: int = DEFAULT_MEMORY_MB
    seed: int = 0


def settings(profile: Profile, problems: list[Problem], options: HumanEvalOptions) -> dict:
    """The header's settings: what must match for a records file to be resumed."""
    out = {
        "suite": "humaneval",
        "prompt_version": PROMPT_VERSION,
        **profile_settings(profile),
        "problems": [p.task_id for p in problems],
        **dataclasses.asdict(options),
        "groups": list(options.groups),
    }
    # A BLAS preloaded into MLX changes every MLX matmul's speed (the fp32 arm's above all); keyed
    # only when present, so runs made without one still resume.
    blas = preloaded_mlx_blas()
    if blas is not None:
        out["mlx_blas"] = blas
    return json.loads(json.dumps(out))  # as the header reads back: lists, not tuples


def _prompt(problem: Problem) -> BenchPrompt:
    return BenchPrompt(problem.task_id, "humaneval", instruction(problem), None, None, None, problem.split)


def _thresholds(
    session: ChatSession,
    ladder: Ladder,
    profile: Profile,
    calibration: list[Problem],
    options: HumanEvalOptions,
    say: Progress,
) -> tuple[dict[str, list[dict]], dict | None, dict]:
    """Each swept policy's points (sweep_points) and the calibrated setting (threshold, promised
    share), on calibration problems' top-tier answers; those answers too (the top-alone arm's, when
    the problem is run: not decoded twice)."""
    n = len(ladder.tiers)
    top = Arm(f"{ladder.tier_names[-1]} alone", "tier", forced_config(n, n - 1), PLAIN, tier=n - 1)
    positions, answers = [], {}
    for i, problem in enumerate(calibration):
        say("thresholds (top-tier answers)", i, len(calibration))
        answer = engine_run(session, top, _prompt(problem), options.max_tokens)
        answers[(problem.task_id, top.name)] = answer
        ids = session.render([{"role": "user", "content": instruction(problem)}])
        positions.append(teacher_forced(ladder, problem.task_id, ids, [t["id"] for t in answer["tokens"]]))
    say("thresholds (top-tier answers)", len(calibration), len(calibration))
    swept = [policy for policy in POLICY_BY_NAME if policy in options.groups]
    sweep = sweep_points(positions, swept, n, options.sweep_points)
    calibrated = None
    if set(arm_sets.CALIBRATED_GROUPS) & set(options.groups):
        calibrated = _calibrated(profile, positions, len(ladder.tiers), options.target_share)
    return sweep, calibrated, answers


def sweep_shares(points: int) -> list[float]:
    """The shares of top-tier tokens a sweep of `points` aims at, spread over SWEEP_SHARES."""
    low, high = SWEEP_SHARES
    spread = np.linspace(low, high, points) if points > 1 else [(low + high) / 2]
    return [round(float(share), 4) for share in spread]


def sweep_points(
    positions: list[simulate.Positions], policies: list[str], tiers: int, points: int
) -> dict[str, list[dict]]:
    """Per policy, at each of sweep_shares(points): the threshold whose replay over `positions` at
    the policy's sweep timing gives the share nearest it, and that share (one entry per distinct
    threshold: two targets a coarse signal cannot tell apart run once)."""
    out: dict[str, list[dict]] = {}
    for policy in policies:
        candidates = simulate.share_by_threshold(sweep_config(policy, 1.0, tiers), positions)
        chosen: dict[float, dict] = {}
        for target in sweep_shares(points):
            tau, share = simulate.threshold_for_share(candidates, target)
            if np.isfinite(tau):
                chosen.setdefault(tau, {"target_share": target, "tau": tau, "promised_share": share})
        out[policy] = list(chosen.values())
    return out


def _calibrated(profile: Profile, positions: list, tiers: int, target: float) -> dict:
    """The threshold whose teacher-forced share is nearest `target`, among the signal's quantiles."""
    config = arm_sets.calibrated_config(arm_sets.calibrated_signal(profile), 1.0, tiers)
    tau, share = simulate.threshold_for_share(simulate.share_by_threshold(config, positions), target)
    count = sum(int(np.isfinite(p.signal(config.signal)[0]).sum()) for p in positions)
    return {
        "tau": tau,
        "promised_share": share,
        "target_share": target,
        "positions": count,
        "problems": len(positions),
    }


def _share(record: dict, top_name: str) -> float:
    return record["tier_counts"].get(top_name, 0) / record["generated"] if record["generated"] else 0.0


def _decode(
    session: ChatSession,
    ladder: Ladder,
    stock: StockModels,
    arm: Arm,
    problem: Problem,
    prompt_ids: list[int],
    done: dict,
    positions: dict,
    options: HumanEvalOptions,
) -> dict:
    """One arm's answer to one problem: the bench's raw record, plus what the controls drew on."""
    top_name = ladder.tier_names[-1]
    if arm.kind in arm_sets.STOCK_KINDS:
        return mlx_lm_run(ladder, arm, prompt_ids, options.max_tokens, stock)
    extra: dict = {}
    control: PolicyFactory | None = None
    if arm.kind == "random":
        share = _share(done[(problem.task_id, arm_sets.matched_arm(arm.name))], top_name)
        seed = control_seed(options.seed, problem.task_id, arm.name)
        control = lambda config, tiers: RandomPolicy(share, tiers - 1, seed)
        extra = {"probability": share, "seed": seed}
    elif arm.kind == "oracle":
        chosen = set(positions[problem.task_id]["disagree"])
        control = lambda config, tiers: OraclePolicy(chosen, tiers - 1)
    record = engine_run(session, arm, _prompt(problem), options.max_tokens, control)
    if arm.kind == "oracle":
        top = done[(problem.task_id, f"{top_name} alone")]
        extra = {"reproduces_top": [t["id"] for t in record["tokens"]] == [t["id"] for t in top["tokens"]]}
    return {**record, **extra}


def _positions_record(
    ladder: Ladder, problem: Problem, prompt_ids: list[int], top: dict, max_tokens: int
) -> dict:
    answer = [t["id"] for t in top["tokens"]]
    forced = teacher_forced(ladder, problem.task_id, prompt_ids, answer)
    # Fewer tokens than the budget: the top tier said end-of-sequence there (no stop strings here).
    ended = len(answer) < min(max_tokens, ladder.context_length - len(prompt_ids))
    return {
        "type": "positions",
        "task_id": problem.task_id,
        **forced.to_dict(),
        "disagree": disagreements(ladder, prompt_ids, answer, ended) if len(ladder.tiers) > 1 else [],
    }


def _arms(profile: Profile, ladder: Ladder, derived: dict, options: HumanEvalOptions) -> list[Arm]:
    """The run's arms from the thresholds its header keeps (`derived`)."""
    calibrated = derived.get("calibrated")
    return arm_sets.humaneval_arms(
        profile,
        ladder,
        arm_sets.swept_thresholds(derived),
        options.groups,
        calibrated["tau"] if calibrated else None,
    )


def run_humaneval(
    profile: Profile,
    ladder: Ladder,
    problems: list[Problem],
    calibration: list[Problem],
    options: HumanEvalOptions,
    records: Records,
    progress: Progress | None = None,
    shard: tuple[int, int] = (1, 1),
) -> list[Arm]:
    """Decode, execute and record every (problem, arm) not yet in `records`; the arms run.

    `shard` (I, N): only problems I, I+N, I+2N, … (1-based) of `problems`, so N processes can
    share one records file; the settings still name them all.
    """
    early: dict = {}  # top-tier answers decoded to choose the thresholds
    say = progress or (lambda stage, done, total: None)
    n = len(ladder.tiers)
    generation = GenerationSettings(max_tokens=options.max_tokens)
    # Every arm's records keep each token's entropy, the models alone too.
    session = ChatSession(ladder, forced_config(n, n - 1), generation, decoding=PLAIN, measure_signals=True)
    wanted = settings(profile, problems, options)
    if records.header is None:
        swept = n > 1 and set(arm_sets.THRESHOLD_GROUPS) & set(options.groups)
        sweep, calibrated, early = (
            _thresholds(session, ladder, profile, calibration, options, say) if swept else ({}, None, {})
        )
        chosen = {"sweep": sweep, "calibrated": calibrated}
        records.start(
            wanted,
            {
                **chosen,
                "arms": [a.to_dict() for a in _arms(profile, ladder, chosen, options)],
                "tier_names": ladder.tier_names,
                "bytes_per_token": [t.bytes_per_token for t in ladder.tiers],
                "threshold_problems": [p.task_id for p in calibration] if swept else [],
                "network_namespace": network_namespace_works(),
            },
        )
    assert records.header is not None  # started above, or read from the file
    arms = _arms(profile, ladder, records.header["derived"], options)
    # More groups asked (Records.open lets them through): shards started together may each write
    # this line, the same line.
    if records.header["settings"]["groups"] != wanted["groups"]:
        records.add_groups(wanted["groups"], [a.to_dict() for a in arms])
    done, positions = records.results(), records.positions()
    mine = problems[shard[0] - 1 :: shard[1]]
    ids = {p.task_id for p in mine}
    total, count = len(mine) * len(arms), sum(task in ids for task, _ in done)
    top_name = ladder.tier_names[-1]
    with StockModels(profile) as stock:  # mlx-lm as shipped, in its own process
        for problem in mine:
            prompt_ids = session.render([{"role": "user", "content": instruction(problem)}])
            for arm in arms:
                key = (problem.task_id, arm.name)
                if key not in done:
                    say("humaneval arms", count, total)
                    record = early.pop(key, None) or _decode(
                        session, ladder, stock, arm, problem, prompt_ids, done, positions, options
                    )
                    code = extract_code(record["text"])
                    result = run_program(program(problem, code), options.timeout_s, options.memory_mb)
                    done[key] = {
                        "type": "result",
                        "task_id": problem.task_id,
                        "arm": arm.name,
                        "kind": arm.kind,
                        **record,
                        "code": code,
                        **result.to_dict(),
                    }
                    records.append(done[key])
                    count += 1
                    say("humaneval arms", count, total)
                if arm.name == f"{top_name} alone" and problem.task_id not in positions:
                    positions[problem.task_id] = _positions_record(
                        ladder, problem, prompt_ids, done[key], options.max_tokens
                    )
                    records.append(positions[problem.task_id])
    say("humaneval arms", total, total)
    return arms
