"""Where every second of an arm went, from its answers' pass ledgers (decoding/ledger.py), and how
far the arm is from the floor — shared by the suites (the prompt bench and HumanEval; the everyday
suite sums its ledgers with merged_passes).

Each engine answer's raw record keeps `passes`: "MODEL KIND" → {passes, rows, seconds} (KIND is
"prefill" or the row bucket "1", "2-3", …, "33+") plus "rest_s", what no pass claimed. Summed over
an arm's answers:

- bottom s: the passes of every model below the top one (a pair's small model), prefill aside;
- top s by bucket: the top model's passes by rows (1: a token of its own; more: a check of a
  draft, or a catch-up), prefill aside; prefill s: every model's prompt passes; rest s; total s;
- floor s: the least a switching arm can take here: every token at the bottom tier alone's
  seconds per token (its own answers'), its prompt pass, and the top model's (it must read the
  prompt to check or take over anything) — per answer, at the arm's own token count;
- a projection, not a measurement: each pass reads its model's weights once, so
  passes × bytes ÷ a chip's peak bandwidth (metrics.APPLE_BANDWIDTH_GBPS); a model that holds
  several gears (one cache) is counted at the top gear for its prompt passes (it prefills there)
  and at the arm's mean bytes per token for the others (the ledger does not say which gear).

An answer without `passes` (mlx-lm's, or a record from before the ledger) leaves the arm's pass
figures None ("–"); its total, tokens and floor still count.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..decoding.ledger import ROW_BUCKETS, row_bucket
from . import metrics

BUCKETS = tuple(row_bucket(lo) for lo, _ in ROW_BUCKETS)  # "1", "2-3", …, "33+"
PREFILL = "prefill"
PROJECTION_NOTE = (
    "projection, not a measurement: each pass reads its model's weights once, "
    "passes × bytes ÷ peak bandwidth (55–85% of it is attainable)"
)


def group_of(tier: str, groups: Sequence[str]) -> str:
    """The model (cache group) a tier decodes with: a pair's tier is its own, a gear ("g4") is
    the gear ladder's one model ("g4+g8")."""
    for group in groups:
        if tier == group or tier in group.split("+"):
            return group
    return tier


def _split(key: str) -> tuple[str, str]:
    model, _, kind = key.rpartition(" ")
    return model, kind


def _merged(records: list[dict]) -> tuple[dict[str, dict], float] | None:
    """Every answer's passes summed by key, and their rest; None if an answer has none."""
    return merged_passes([r.get("passes") or {} for r in records])


def merged_passes(ledgers: list[dict]) -> tuple[dict[str, dict], float] | None:
    """Answers' pass ledgers (decoding/ledger.py's records: passes, rows and seconds by model and
    kind, and `rest_s`) summed by key, and their rest; None if there are none or one is empty."""
    if not ledgers or any(not ledger for ledger in ledgers):
        return None
    out: dict[str, dict] = {}
    rest = 0.0
    for ledger in ledgers:
        for key, entry in ledger.items():
            if key == "rest_s":
                rest += entry
                continue
            total = out.setdefault(key, {"passes": 0, "rows": 0, "seconds": 0.0})
            for field in total:
                total[field] += entry[field]
    return dict(sorted(out.items())), rest


def _seconds(passes: dict[str, dict], model: str | None = None, kind: str | None = None) -> float:
    return sum(
        e["seconds"]
        for key, e in passes.items()
        if (model is None or _split(key)[0] == model) and (kind is None or _split(key)[1] == kind)
    )


def drafting_net(answers: Sequence[tuple[dict, int]], top_tier: str) -> dict | None:
    """What drafting saved an arm, from its own answers' pass ledgers alone (so the other arms'
    drift does not enter it): each answer given as (its ledger, tokens generated), `top_tier` the
    checking tier (its model, `top`, as the ledgers name it: group_of). Its first token comes from
    the prompt's pass and each other token from a step of `top` (a pass of one row) or a check; had
    every token a check gave cost a step, at the arm's own seconds a step, instead of the checks
    and every pass of the drafter (its prompt's too), the answers would have taken `saved_s`
    longer. A projection from measured passes, not a measurement; None where there was no check,
    or no step to price one by."""
    named = sorted({_split(key)[0] for ledger, _ in answers for key in ledger if key != "rest_s"})
    top = group_of(top_tier, named)
    steps = check_tokens = 0
    step_s = check_s = draft_s = 0.0
    for ledger, generated in answers:
        ones = ledger.get(f"{top} 1", {"passes": 0, "seconds": 0.0})
        steps, step_s = steps + ones["passes"], step_s + ones["seconds"]
        check_tokens += max(generated - 1 - ones["passes"], 0)
        for key, entry in ledger.items():
            if key == "rest_s":  # what no pass claimed: neither drafting's nor a check's
                continue
            model, kind = _split(key)
            if model != top:  # the drafter's passes, its prompt's included: drafting's alone
                draft_s += entry["seconds"]
            elif kind not in (PREFILL, "1"):
                check_s += entry["seconds"]
    if not check_tokens or not steps:
        return None
    per_step = step_s / steps
    return {
        "step_s": per_step,
        "check_tokens": check_tokens,
        "check_s": check_s,
        "draft_s": draft_s,
        "saved_s": check_tokens * per_step - check_s - draft_s,
    }


class Ladder:
    """The models of a ladder as its records name them: tiers, their bytes, the models' names."""

    def __init__(self, tier_names: Sequence[str], tier_bytes: Sequence[float], records: list[dict]):
        named = sorted({_split(k)[0] for r in records for k in (r.get("passes") or {}) if k != "rest_s"})
        self.tiers = list(tier_names)
        self.tier_bytes = list(tier_bytes)
        self.models = list(dict.fromkeys(group_of(t, named) for t in self.tiers))
        self.bottom, self.top = self.models[0], self.models[-1]

    def bytes_range(self, model: str) -> list[float]:
        """The bytes per token of the tiers `model` runs (one for a pair's model, each gear's)."""
        return [
            b for t, b in zip(self.tiers, self.tier_bytes, strict=True) if group_of(t, self.models) == model
        ]

    def pass_bytes(self, model: str, kind: str, mean_bytes: float) -> float:
        """Weight bytes one pass of `model` reads (see the module's note for a gear ladder)."""
        sizes = self.bytes_range(model) or [max(self.tier_bytes)]
        if len(sizes) == 1 or kind == PREFILL:
            return max(sizes)
        return min(max(mean_bytes, min(sizes)), max(sizes)) if math.isfinite(mean_bytes) else max(sizes)


def _rates(ladder: Ladder, by_arm: dict[str, list[dict]]) -> dict | None:
    """The floor's parts per answer and per token, from the tiers alone: the bottom tier's
    prompt pass and seconds per token after it, the top model's prompt pass."""
    bottom = by_arm.get(f"{ladder.tiers[0]} alone") or []
    merged = _merged(bottom)
    tokens = sum(r["generated"] for r in bottom)
    if merged is None or not tokens:
        return None
    passes, _ = merged
    prefill = _seconds(passes, ladder.bottom, PREFILL)
    out = {
        "bottom_prefill_s": prefill / len(bottom),
        "bottom_s_per_token": (sum(r["elapsed_s"] for r in bottom) - prefill) / tokens,
        "top_prefill_s": 0.0,
    }
    if ladder.top != ladder.bottom:
        top = by_arm.get(f"{ladder.tiers[-1]} alone") or []
        merged_top = _merged(top)
        if merged_top is None:
            return None
        out["top_prefill_s"] = _seconds(merged_top[0], ladder.top, PREFILL) / len(top)
    return out


def _projection(ladder: Ladder, passes: dict[str, dict] | None, answers: int, tokens: int, mean_bytes: float):
    """Seconds per chip at peak bandwidth: the arm's passes, and the floor's (each token one
    bottom pass; each answer the bottom's prompt pass and, on two models, the top's)."""
    bottom_bytes = min(ladder.bytes_range(ladder.bottom) or ladder.tier_bytes[:1])
    floor_bytes = tokens * bottom_bytes + answers * ladder.pass_bytes(ladder.bottom, PREFILL, math.nan)
    if ladder.top != ladder.bottom:
        floor_bytes += answers * ladder.pass_bytes(ladder.top, PREFILL, math.nan)
    out: dict = {"note": PROJECTION_NOTE}
    if passes is not None:
        read = sum(
            e["passes"] * ladder.pass_bytes(_split(key)[0], _split(key)[1], mean_bytes)
            for key, e in passes.items()
        )
        out["seconds"] = {chip: read / (gbps * 1e9) for chip, gbps in metrics.APPLE_BANDWIDTH_GBPS.items()}
    out["floor_seconds"] = {
        chip: floor_bytes / (gbps * 1e9) for chip, gbps in metrics.APPLE_BANDWIDTH_GBPS.items()
    }
    return out


def where_seconds(
    arms: Sequence[str], records: Sequence[dict], tier_names: Sequence[str], tier_bytes: Sequence[float]
) -> dict:
    """Per arm (by name, from `records`, each with its "arm"): where its seconds went, its floor
    and the projection; with the models the columns name (`bottom`, `top`)."""
    ladder = Ladder(tier_names, tier_bytes, list(records))
    by_arm: dict[str, list[dict]] = {name: [] for name in arms}
    for r in records:
        if r["arm"] in by_arm:
            by_arm[r["arm"]].append(r)
    rates = _rates(ladder, by_arm)
    out: dict[str, dict] = {}
    for name in arms:
        mine = by_arm[name]
        answers, tokens = len(mine), sum(r["generated"] for r in mine)
        # Records from before answers kept their seconds have no total.
        known = all("elapsed_s" in r for r in mine)
        total = sum(r["elapsed_s"] for r in mine) if known else math.nan
        sources: dict[str, int] = {}
        for r in mine:
            for source, count in (r.get("sources") or {}).items():
                sources[source] = sources.get(source, 0) + count
        entry: dict = {
            "answers": answers,
            "tokens": tokens,
            "total_s": total if answers and known else None,
            "sources": sources,
            "passes": None,
            "rest_s": None,
            "bottom_s": None,
            "top_s": None,
            "prefill_s": None,
            "floor_s": None,
            "over_floor": None,
        }
        merged = _merged(mine)
        if merged is not None:
            passes, rest = merged
            below = [m for m in ladder.models if m != ladder.top]
            entry.update(
                passes=passes,
                rest_s=rest,
                bottom_s=sum(_seconds(passes, m) - _seconds(passes, m, PREFILL) for m in below)
                if below
                else None,
                top_s={b: _seconds(passes, ladder.top, b) for b in BUCKETS},
                prefill_s=_seconds(passes, kind=PREFILL),
            )
        if rates is not None and answers:
            floor = (
                answers * (rates["bottom_prefill_s"] + rates["top_prefill_s"])
                + tokens * rates["bottom_s_per_token"]
            )
            entry["floor_s"] = floor
            entry["over_floor"] = total / floor if floor > 0 and known else None
        if answers:
            mean_bytes = (
                sum(r["mean_bytes_per_token"] * r["generated"] for r in mine) / tokens if tokens else math.nan
            )
            entry["projection"] = _projection(ladder, entry["passes"], answers, tokens, mean_bytes)
        out[name] = entry
    return {"models": {"bottom": ladder.bottom, "top": ladder.top}, "arms": out, "floor_rates": rates}
