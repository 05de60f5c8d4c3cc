"""HumanEval figures per arm, re-derived from the records alone (header + results + positions).

- every figure over the problems the arm answered, and again over the problems every arm answered
  (`side_by_side`: the ones to compare arms by, as a stopped run leaves some problems part-done);
- pass@1: passed / problems (greedy, one sample each), with the 95% Wilson interval;
- top share: the live share of tokens the top tier made; retained (pass) = (pass_arm − pass_bottom)
  / (pass_top − pass_bottom), None when the top and bottom tiers pass equally often;
- speed: decode tok/s (pooled over problems), seconds per problem (mean wall time of an answer),
  bytes of weights read per token and the Apple-silicon bound they imply (a projection, labelled);
  no speed for the oracle (a control that computes both tiers where it needs to);
- teacher-forced quality along the top tier's answers (bench/simulate.py, prefill-speed): the
  arm's routing replayed exactly (share, retained fidelity in NLL), the random control and the
  oracle at that share; for the live random and oracle arms, those two curves at their live share.
"""

from __future__ import annotations

import math
import statistics

import numpy as np

from ...decoding.mode import DecodingMode
from ...routing.router import RouterConfig
from .. import metrics, seconds, simulate
from ..runner import MLX_LM_TIER_KINDS, sweep_config
from .arms import calibrated_config
from .problems import SPLITS, split_of

Z95 = 1.959964  # two-sided 95% normal quantile
PROJECTION_NOTE = "projection, not a measurement: peak bandwidth ÷ weight bytes read per token"


def wilson(passed: int, n: int, z: float = Z95) -> tuple[float | None, float | None]:
    """The Wilson score interval of a binomial proportion (None, None for n = 0)."""
    if n == 0:
        return None, None
    p = passed / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # The interval holds p; the clamps only undo rounding (at p = 1, centre + half can land below 1).
    return max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half))


def _num(value) -> float | None:
    return None if value is None or (isinstance(value, float) and not math.isfinite(value)) else value


def _config(router: dict) -> RouterConfig:
    return RouterConfig(
        up=tuple(map(float, router["up"])),
        down=tuple(map(float, router["down"])),
        window=router["window"],
        min_run=router["min_run"],
        policy=router["policy"],
        normalize=router["normalize"],
        signal=router["signal"],
    )


def _positions(records: list[dict]) -> list[simulate.Positions]:
    return [
        simulate.Positions(
            r["task_id"],
            np.array(r["entropy"]),
            np.array(r["nll"]),
            np.array(r["varentropy"]),
            np.array(r["margin"]),
        )
        for r in records
    ]


def _teacher_forced(
    arm: dict, positions: list[simulate.Positions], tier_bytes: list[int], live_share: float | None
) -> dict:
    n = len(tier_bytes)
    if n < 2 or not positions:
        return {}
    bottom = np.concatenate([p.nll[0] for p in positions])
    top = np.concatenate([p.nll[-1] for p in positions])
    if arm["kind"] in CONTROLS:
        if live_share is None:
            return {}
        value = (
            metrics.random_control(bottom, top, live_share).mean
            if arm["kind"] == "random"
            else metrics.oracle(bottom, top, live_share)
        )
        return {"top_share": live_share, "retained": _num(value)}
    if arm["kind"] in ("tier", *MLX_LM_TIER_KINDS):
        tried = simulate.forced(positions, arm["tier"])
    elif _lossless(arm):  # the large model's tokens
        tried = simulate.forced(positions, n - 1)
    else:
        tried = [simulate.route(_config(arm["router"]), p) for p in positions]
    quality = simulate.quality(positions, tried, tier_bytes).to_dict()
    share = quality["top_share"]
    if share is not None:
        quality["random_control"] = _num(metrics.random_control(bottom, top, share).mean)
        quality["oracle"] = _num(metrics.oracle(bottom, top, share))
    return quality


CONTROLS = ("random", "oracle")
# The EAD-style table: teacher-forced retained fidelity at these shares of top-tier tokens.
CURVE_SHARES = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3)
# Every token is the top tier's sample.
LOSSLESS = ("speculative", "speculative-ours", "speculative-fp32", "verify")


def share_curve(positions: list[simulate.Positions], tier_bytes: list[int], signal: str) -> list[dict]:
    """Share → retained along the top tier's answers: peek (each position alone) at the threshold
    giving each share over these positions, beside random routing and the oracle at that share;
    and `ead` as its paper runs it (entropy, window 5, min run 10: the bench's sweep setting) at
    its threshold nearest each share (`ead_*`: its own share, a little off the target)."""
    if len(tier_bytes) != 2 or not positions:
        return []
    bottom = np.concatenate([p.nll[0] for p in positions])
    top = np.concatenate([p.nll[-1] for p in positions])
    peek, ead = calibrated_config(signal, 1.0, 2), sweep_config("ead", 1.0, 2)
    candidates = {c: simulate.share_by_threshold(c, positions) for c in (peek, ead)}

    def at(config: RouterConfig, target: float) -> tuple[float, simulate.Quality]:
        tau, _ = simulate.threshold_for_share(candidates[config], target)
        tried = [simulate.route(config.with_thresholds((tau,)), p) for p in positions]
        return tau, simulate.quality(positions, tried, tier_bytes)

    out = []
    for target in CURVE_SHARES:
        tau, quality = at(peek, target)
        ead_tau, ead_quality = at(ead, target)
        out.append(
            {
                "target_share": target,
                "tau": _num(tau),
                "top_share": _num(quality.top_share),
                "retained": _num(quality.retained),
                "random_control": _num(metrics.random_control(bottom, top, quality.top_share).mean),
                "oracle": _num(metrics.oracle(bottom, top, quality.top_share)),
                "ead_tau": _num(ead_tau),
                "ead_top_share": _num(ead_quality.top_share),
                "ead_retained": _num(ead_quality.retained),
            }
        )
    return out


def _figures(mine: list[dict], top_name: str, timed: bool) -> dict:
    """pass@1 with its interval, the top tier's share of tokens and (`timed`) decode tok/s, pooled
    from each first token, mean seconds per answer and the median time to the first token — over
    the answers `mine`."""
    passed, n = sum(r["passed"] for r in mine), len(mine)
    generated = sum(r["generated"] for r in mine)
    out = {
        "problems": n,
        "passed": passed,
        "pass@1": passed / n if n else None,
        "pass@1_95": list(wilson(passed, n)),
        "top_share": sum(r["tier_counts"].get(top_name, 0) for r in mine) / generated if generated else None,
    }
    if timed and mine:
        decoded = sum(max(r["generated"] - 1, 0) for r in mine)
        decode_s = sum(r["decode_s"] for r in mine)
        out["decode_tok_per_s"] = decoded / decode_s if decode_s > 0 else None
        out["seconds_per_problem"] = sum(r["elapsed_s"] for r in mine) / n
        firsts = [r["first_token_s"] for r in mine if r.get("first_token_s") is not None]
        out["median_first_token_s"] = statistics.median(firsts) if firsts else None
    return out


def summarize(header: dict, lines: list[dict], others: list[list[dict]] | None = None) -> dict:
    """Every arm's figures from the records, each over the problems it has answered, and again
    over the problems every arm has answered (`side_by_side`), the figures to compare arms by;
    with `others` (the lines of other runs of the same tiers), `pooled` too."""
    derived = header["derived"]
    names, tier_bytes = derived["tier_names"], derived["bytes_per_token"]
    results = [r for r in lines if r.get("type") == "result"]
    forced = _positions([r for r in lines if r.get("type") == "positions"])
    top_answers = {r["task_id"]: r for r in results if r["arm"] == f"{names[-1]} alone"}
    problems = header["settings"]["problems"]
    done = {(r["task_id"], r["arm"]) for r in results}
    # Problems every arm has answered (a stopped run leaves the last ones part-done).
    complete = [task for task in problems if all((task, a["name"]) in done for a in derived["arms"])]
    arms = []
    for arm in derived["arms"]:
        mine = [r for r in results if r["arm"] == arm["name"]]
        timed = arm["kind"] != "oracle"  # a control that computes both tiers where it needs to
        entry = {
            "name": arm["name"],
            "kind": arm["kind"],
            "policy": arm["policy"],
            "tau": arm["tau"],
            **_figures(mine, names[-1], timed),
            # The same figures over the problems every arm answered: the ones to compare arms by.
            "side_by_side": _figures([r for r in mine if r["task_id"] in complete], names[-1], timed),
        }
        share = entry["top_share"]
        generated = sum(r["generated"] for r in mine)
        if timed and generated:
            bpt = sum(r["mean_bytes_per_token"] * r["generated"] for r in mine) / generated
            entry["bytes_per_token"] = bpt
            entry["projection"] = {"note": PROJECTION_NOTE, "tok_per_s_bound": metrics.apple_bound_tok_s(bpt)}
        # Per problem: is the answer the top tier's own (`reproduces_top`), or for mlx-lm on one
        # model, our engine's on that model (`reproduces_tier`), token for token?
        same: dict[str, bool] | None = None
        key = "reproduces_top"
        if arm["kind"] in MLX_LM_TIER_KINDS:
            key = "reproduces_tier"
            ours = {r["task_id"]: r for r in results if r["arm"] == f"{names[arm['tier']]} alone"}
            same = {r["task_id"]: _ids(r) == _ids(ours[r["task_id"]]) for r in mine if r["task_id"] in ours}
        elif arm["kind"] == "oracle":
            same = {r["task_id"]: r.get("reproduces_top", False) for r in mine}
        elif _lossless(arm):
            # Lossless up to the rounding of batched passes: how many answers are the top tier's own.
            entry["verified"] = True
            same = {
                r["task_id"]: _ids(r) == _ids(top_answers[r["task_id"]])
                for r in mine
                if r["task_id"] in top_answers
            }
        if same is not None:
            entry[key] = sum(same.values())
            entry["side_by_side"][key] = sum(same[task] for task in complete if task in same)
        entry["teacher_forced"] = _teacher_forced(arm, forced, tier_bytes, share)
        arms.append(entry)
    finished = [r for r in results if r["task_id"] in complete]
    for entry in arms:
        entry["retained"], entry["retained_problems"] = _retained(
            entry["name"], f"{names[0]} alone", f"{names[-1]} alone", results
        )
        entry["side_by_side"]["retained"], _ = _retained(
            entry["name"], f"{names[0]} alone", f"{names[-1]} alone", finished
        )
    # Where the seconds went, over the problems every arm answered (each arm's own answers while
    # none is complete): records from before the pass ledger report "–".
    counted = finished if complete else results
    where = seconds.where_seconds([a["name"] for a in derived["arms"]], counted, names, tier_bytes)
    for entry in arms:
        entry["seconds"] = where["arms"][entry["name"]]
    calibrated = derived.get("calibrated")
    extra = {"pooled": pooled(derived, lines, forced, others, arms)} if others else {}
    if calibrated is not None:
        live = next((a for a in arms if a["kind"] == "calibrated"), None)
        # Item 6: the share promised on calibration problems (teacher-forced) beside the live one.
        calibrated = {**calibrated, "live_share": live["top_share"] if live else None}
    return {
        "suite": "humaneval",
        "arms": arms,
        "problems": problems,
        "sweep": derived.get("sweep", {}),  # each swept policy's points: target, τ, promised share
        "calibrated": calibrated,
        "teacher_forced_curve": share_curve(forced, tier_bytes, _signal(derived)),
        "teacher_forced_problems": len(forced),
        "answered": sorted({r["task_id"] for r in results}, key=problems.index),
        "complete": complete,
        "where_seconds": {
            "models": where["models"],
            "floor_rates": where["floor_rates"],
            "problems": "complete" if complete else "answered",
        },
        # Decoding time of one problem, every arm (the oracle too), on the complete ones: how
        # long a run takes here (execution and teacher forcing add a few seconds).
        "run_seconds_per_problem": (
            sum(r["elapsed_s"] for r in results if r["task_id"] in complete) / len(complete)
            if complete
            else None
        ),
        # Where the bottom and top tiers alone differ in pass@1: what every "retained" rests on.
        "separating": _separating(f"{names[0]} alone", f"{names[-1]} alone", results, problems),
        **extra,
    }


def pooled(
    derived: dict,
    lines: list[dict],
    forced_here: list[simulate.Positions],
    others: list[list[dict]],
    arms: list[dict],
) -> dict:
    """The tiers alone and the teacher-forced figures over every problem this run (its records
    `lines`, its positions already read as `forced_here`) or `others` answered (item 4 asks for all
    164; another split's run of the tiers alone supplies the rest).
    Where two runs hold a problem, this run's records count. Every arm's routing is replayed along
    the top tier's answers to all of them (the calibrated threshold on its own calibration
    problems too: in-sample there); the random and oracle controls at the arm's live share."""
    names, tier_bytes = derived["tier_names"], derived["bytes_per_token"]
    tiers = (f"{names[0]} alone", f"{names[-1]} alone")
    answers: dict[tuple[str, str], dict] = {}
    here: dict[str, simulate.Positions] = {}
    for p in forced_here:
        here.setdefault(p.prompt_id, p)
    positions: dict[str, dict] = {}  # the other runs' records of problems this run lacks
    for run in (lines, *others):
        for r in run:
            if r.get("type") == "result" and r["arm"] in tiers:
                answers.setdefault((r["task_id"], r["arm"]), r)
            elif run is not lines and r.get("type") == "positions" and r["task_id"] not in here:
                positions.setdefault(r["task_id"], r)
    results = list(answers.values())
    both = list(dict.fromkeys(task for task, _ in answers if all((task, t) in answers for t in tiers)))
    # In file order, this run's first: the same files, the same figures.
    forced = [*here.values(), *_positions(list(positions.values()))]
    calibrated = next((a for a in derived["arms"] if a["kind"] == "calibrated"), None)
    # Item 6: the calibrated threshold's teacher-forced share on each half (it was chosen on a few
    # calibration problems), beside the share it promised and the live one.
    by_split = {}
    for split in SPLITS:
        mine = [p for p in forced if split_of(p.prompt_id) == split]
        if calibrated and mine:
            by_split[split] = {"problems": len(mine), **_teacher_forced(calibrated, mine, tier_bytes, None)}
    return {
        "problems": len(both),
        "teacher_forced_problems": len(forced),
        "tiers": {
            name: _figures([r for r in results if r["arm"] == name and r["task_id"] in both], names[-1], True)
            for name in tiers
        },
        "separating": _separating(*tiers, results, both),
        "teacher_forced": {
            arm["name"]: _teacher_forced(arm, forced, tier_bytes, live["top_share"])
            for arm, live in zip(derived["arms"], arms, strict=True)
        },
        "teacher_forced_curve": share_curve(forced, tier_bytes, _signal(derived)),
        "calibrated_by_split": by_split,
    }


def _separating(bottom: str, top: str, results: list[dict], problems: list[str]) -> list[str]:
    """The problems both tiers alone answered, one passing and the other not."""
    passed = _verdicts(results, (bottom, top))
    both = set(passed[bottom]) & set(passed[top])
    return [task for task in problems if task in both and passed[bottom][task] != passed[top][task]]


def _verdicts(results: list[dict], arms: tuple[str, ...]) -> dict[str, dict[str, bool]]:
    """Each of `arms`: task id → passed, from its results."""
    passed: dict[str, dict[str, bool]] = {name: {} for name in arms}
    for r in results:
        if r["arm"] in passed:
            passed[r["arm"]][r["task_id"]] = r["passed"]
    return passed


def _lossless(arm: dict) -> bool:
    """Every token is the top tier's sample: speculative decoding, or verified drafting."""
    return arm["kind"] in LOSSLESS or (arm["router"] is not None and DecodingMode.of_record(arm).verify)


def _ids(record: dict) -> list[int]:
    return [t["id"] for t in record["tokens"]]


def _signal(derived: dict) -> str:
    """The signal the calibrated arm routes on (entropy when the run has none)."""
    routed = [a["router"] for a in derived["arms"] if a["kind"] == "calibrated" and a["router"]]
    return routed[0]["signal"] if routed else "entropy"


def _retained(arm: str, bottom: str, top: str, results: list[dict]) -> tuple[float | None, int]:
    """(pass_arm − pass_bottom) / (pass_top − pass_bottom) over the problems all three answered
    (a stopped run can leave one problem part-done), and how many those are."""
    passed = _verdicts(results, (arm, bottom, top))
    common = set(passed[arm]) & set(passed[bottom]) & set(passed[top])
    if not common:
        return None, 0
    a, b, t = (sum(passed[name][task] for task in common) for name in (arm, bottom, top))
    return ((a - b) / (t - b) if t != b else None), len(common)
