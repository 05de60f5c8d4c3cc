"""Verified drafting's round, written once: plan, draft, check, settle.

Two places run it. The live loop (verify.py) gives it the ladder's models (round_models.py), whose
drafts and checks are passes yielded to the engine. The replay (bench/replay_drafting.py) gives it
a recorded answer's models, which read the drafter's tokens and the top tier's samples from the
trace and price each pass from a table: no pass runs, so its round finishes without yielding.

From a sequence whose ids the top tier has all checked, a round goes:
- plan: the planner (drafting.py) picks the draft's source and length, against what prompt lookup
  offers (none: the top tier alone; the opening round is always none, after the prompt's prefill);
- draft: lookup's tokens, or the bottom tier's, position by position (ModelDraft.take decides
  where it ends), then settled (ModelDraft.settle: the prefix worth checking);
- check: the top tier samples every drafted position and the one after, in one pass;
- settle: the draft stands up to the first token the top tier samples differently (kept_prefix);
  the planner learns the round (its source, length, kept share and seconds); the models keep the
  kept ids.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Generator
from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx

from .drafting import DraftPlanner, ModelDraft, Plan, kept_prefix
from .lookup import LookupIndex
from .passes import Score
from .round_clock import RoundClock

OPENING = Plan(0, "none", math.nan)  # the top tier opens the answer: its first token after its prefill alone


class RoundModels(Protocol):
    """The two tiers as a round uses them: the sequence they decode, the drafter's draft, the top
    tier's check, and what they keep. Drafts and checks are generators of the passes they need."""

    threshold: float  # a drafted position whose routed signal exceeds it ends the draft
    eos: Collection[int]
    lookup_index: LookupIndex | None  # the sequence's n-grams (None: prompt lookup off)

    @property
    def ids(self) -> list[int]:
        """The prompt and the answer so far, every id checked by the top tier."""
        ...

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def drafter_seen(self) -> int:
        """How many of `ids` the drafter has read."""
        ...

    def draft(self, made: ModelDraft, planner: DraftPlanner) -> Generator[Score, mx.array, None]:
        """The drafter's positions after `ids`, each offered to `made.take` until it declines."""
        ...

    def check(self, draft: list[int], room: int) -> Generator[Score, mx.array, list[int]]:
        """The top tier's samples at each drafted position and the one after."""
        ...

    def keep(self, kept: int) -> None:
        """Forget every id after `ids` and the first `kept` of the draft."""
        ...


@dataclass
class Round:
    """A round as settled: where its draft came from, the draft, the drafter's record of it, the
    top tier's samples and how much of the draft they kept."""

    source: str  # "none", "lookup" or "model"
    draft: list[int]
    made: ModelDraft
    samples: list[int]
    kept: int


def verified_round(
    models: RoundModels, planner: DraftPlanner, clock: RoundClock, room: int, opening: bool
) -> Generator[Score, mx.array, Round]:
    """One round of at most `room` tokens (see the module docstring); `opening`: the answer's first."""
    clock.start_round()
    plan, offered = (OPENING, []) if opening else _plan(models, planner, room)
    made = ModelDraft(models.threshold, plan.length, models.eos)
    if plan.source == "lookup":
        draft = offered[: plan.length]
    else:
        yield from models.draft(made, planner)
        made.settle(planner)
        draft = made.tokens
    samples = yield from models.check(draft, room)
    kept = kept_prefix(draft, samples)
    planner.record_round(plan.source, len(draft), kept, made.entropies, clock.round_seconds())
    models.keep(kept)
    return Round(plan.source, draft, made, samples, kept)


def _plan(models: RoundModels, planner: DraftPlanner, room: int) -> tuple[Plan, list[int]]:
    """This round's plan, and the prompt lookup's offer it was chosen against."""
    ids, index, prompt_tokens = models.ids, models.lookup_index, models.prompt_tokens
    offered = [] if index is None else index.draft(ids, min(room, planner.max_draft))
    seen = models.drafter_seen
    in_answer = index is not None and index.found_at >= prompt_tokens
    plan = planner.plan(room, len(offered), len(ids) - seen, in_answer, max(0, prompt_tokens - seen))
    return plan, offered
