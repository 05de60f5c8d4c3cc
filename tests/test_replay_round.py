"""The replay (bench/replay_drafting.py) runs verified drafting's round (decoding/verified_round.py)
as the live loop does, on a recorded answer's models: on an answer decoded live, it drafts, settles
and keeps the same tokens round for round."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import mlx.core as mx
import pytest

from mlxswitch.decoding.drafting import MAX_DRAFT, DraftPlanner, ModelDraft, kept_prefix
from mlxswitch.decoding.tiers import pair_ladder
from mlxswitch.decoding.verify import VerifyLoop
from mlxswitch.models.sources import load_model

ROOT = Path(__file__).resolve().parent.parent


def _replay_module():
    spec = importlib.util.spec_from_file_location("replay_drafting", ROOT / "bench" / "replay_drafting.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _RecordingPlanner(DraftPlanner):
    """The fixed rule (drafts to the round's room: no timing in its choices), recording each round
    as (source, drafted, kept)."""

    def __init__(self, max_draft: int):
        super().__init__(max_draft, adaptive=False)
        self.rounds: list[tuple[str, int, int]] = []

    def record_round(self, source, drafted, kept, entropies=(), seconds=math.nan, tokens=None):
        self.rounds.append((source, drafted, kept))
        super().record_round(source, drafted, kept, entropies, seconds, tokens)


@pytest.mark.parametrize("max_draft", [3, 7, MAX_DRAFT])
def test_the_replay_and_the_live_loop_make_the_same_rounds_on_a_live_answer(tiny_pair, max_draft):
    ladder = pair_ladder(load_model(str(tiny_pair[0])), load_model(str(tiny_pair[1])))
    prompt = ladder.tokenizer.encode("Count: one two three")
    budget = 40
    live = _RecordingPlanner(max_draft)
    loop = VerifyLoop(
        ladder, list(prompt), math.inf, lambda rows: mx.argmax(rows, axis=-1), planner=live, lookup=False
    )
    answer = [step.token for step in loop.steps(budget)]
    assert len(answer) == budget and not loop.ended_by_eos  # the cut by `room` is what is compared
    replay = _replay_module()
    trace = dict(
        prompt_ids=list(prompt),
        prompt_tokens=len(prompt),
        answer=answer,
        budget=budget,
        eos=sorted(ladder.tokenizer.eos_token_ids),
        **replay.trace_answer(ladder, list(prompt), answer),
    )
    costs = replay.Costs({1: 0.01, 2: 0.012, 64: 0.1})  # the fixed rule reads no cost
    modelled = _RecordingPlanner(max_draft)
    replay.replay(trace, costs, costs, math.inf, "entropy", modelled, lookup=False)
    assert live.rounds[0] == ("none", 0, 0)  # the top tier opens the answer
    assert any(drafted == max_draft for _, drafted, _ in live.rounds)  # drafts end at their room
    assert modelled.rounds == live.rounds


def test_a_draft_ends_at_an_unsure_position_without_its_token_and_settles_once():
    planner = DraftPlanner(4, adaptive=False)
    made = ModelDraft(threshold=1.0, room=4, eos={99})
    assert made.take(5, 0.1, 0.5, planner) and made.take(6, 0.2, 0.9, planner)
    assert not made.take(7, 0.3, 1.5, planner)  # unsure: the draft ends, 7 is not taken
    assert made.tokens == [5, 6] and made.signals == [0.5, 0.9, 1.5] and made.ended_unsure
    at_room = ModelDraft(threshold=1.0, room=2, eos={99})
    assert at_room.take(5, 0.1, 0.5, planner) and not at_room.take(6, 0.1, 0.5, planner)
    at_room.settle(planner)  # the fixed rule checks the whole draft, its last token included
    assert at_room.tokens == [5, 6] and not at_room.ended_unsure
    at_eos = ModelDraft(threshold=1.0, room=4, eos={99})
    assert not at_eos.take(99, 0.1, 0.5, planner)
    at_eos.settle(planner)
    assert at_eos.tokens == [99]


def test_kept_prefix_stops_at_the_first_difference():
    assert kept_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert kept_prefix([1, 2], [1, 2, 3]) == 2
    assert kept_prefix([], [7]) == 0
    assert kept_prefix([3], [4]) == 0
