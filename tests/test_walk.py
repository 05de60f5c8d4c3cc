"""One policy walk (routing/walk.py): the token loop, the bench's replay and the telemetry check
give the same tiers on recorded runs, for `ead` and `peek`, on entropy and on probe scores."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mlxswitch.bench import simulate
from mlxswitch.bench.teacher import teacher_forced
from mlxswitch.decoding.answer import TokenEvent
from mlxswitch.decoding.session import ChatSession, GenerationSettings
from mlxswitch.decoding.tiers import pair_ladder
from mlxswitch.models.heads import split_model
from mlxswitch.models.sources import load_model
from mlxswitch.routing.policies import PeekPolicy
from mlxswitch.routing.probe import Probe
from mlxswitch.routing.router import RouterConfig
from mlxswitch.routing.walk import RecordedPosition, Walk, derive_rungs, derive_tried

PROMPTS = ["What is the capital of France?", "def add(a, b):"]
MAX_TOKENS = 20
# Entropy thresholds around the tiny models' typical entropies (bits), so that both tiers make tokens.
ENTROPY_CONFIGS = [
    RouterConfig(up=(1.5,), down=(1.0,), window=2, min_run=2),
    RouterConfig(up=(2.5,), window=1, min_run=1),
    RouterConfig(up=(1.5,), down=(1.0,), window=1, min_run=1, policy="peek"),
    RouterConfig(up=(2.0,), down=(1.2,), window=3, min_run=2, policy="peek"),
]
PROBE_CONFIGS = [
    RouterConfig(up=(0.5,), down=(0.5,), window=1, min_run=1, policy="peek", signal="probe"),
    RouterConfig(up=(0.6,), down=(0.35,), window=2, min_run=3, policy="peek", signal="probe"),
]


@pytest.fixture(scope="module")
def ladder(tiny_pair):
    small, large = tiny_pair
    ladder = pair_ladder(load_model(str(small)), load_model(str(large)))
    hidden = split_model(ladder.tiers[0].model.model, "small").hidden_size
    rng = np.random.default_rng(3)
    dims = hidden + 3
    ladder.attach_probe(
        Probe(
            rng.normal(size=dims) * 0.1,
            1.0 + rng.random(dims),
            rng.normal(size=dims) * 2 / math.sqrt(dims),
            0.0,
        )
    )
    return ladder


def _recorded(ladder, prompt, config):
    """The engine's run: its tokens' rungs, the rungs tried, and the signals measured in order."""
    session = ChatSession(ladder, config, GenerationSettings(max_tokens=MAX_TOKENS))
    events = [e for e in session.stream(prompt) if isinstance(e, TokenEvent)]
    summary = session.last_summary
    names = ladder.tier_names
    tried = [[names.index(t) for t in e.tried] if e.tried else [e.rung] for e in events]
    routed = [e.signal if config.signal != "entropy" else e.entropy for e in events]
    values = [list(e.tried_signals) if e.tried else [v] for e, v in zip(events, routed, strict=True)]
    initial = summary.initial_signal if config.signal != "entropy" else summary.initial_entropy
    prompt_ids = session.render([{"role": "user", "content": prompt}])
    return [e.rung for e in events], tried, values, initial, prompt_ids, [e.id for e in events]


def _positions_from_record(config, tried, values, initial) -> simulate.Positions:
    """The record as teacher-forced arrays: each position's tried rungs hold what they measured,
    the others NaN (a replay that reads them takes another path: the guard fires on NaN)."""
    columns = np.full((2, len(tried)), np.nan)
    for t, (rungs, measured) in enumerate(zip(tried, values, strict=True)):
        for rung, value in zip(rungs, measured, strict=True):
            columns[rung, t] = np.nan if value is None else value
    if config.signal == "probe":
        return simulate.Positions("r", np.zeros_like(columns), np.zeros_like(columns), probe=columns[0])
    columns[0, 0] = initial  # the bottom tier's entropy at the end of the prompt is position 0's
    return simulate.Positions("r", columns, np.zeros_like(columns))


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize(
    "config",
    ENTROPY_CONFIGS + PROBE_CONFIGS,
    ids=lambda c: f"{c.policy}-{c.signal}-{c.up[0]:g}-w{c.window}-m{c.min_run}",
)
def test_the_loop_the_replay_and_the_telemetry_check_agree(ladder, prompt, config):
    rungs, tried, values, initial, _, _ = _recorded(ladder, prompt, config)
    assert derive_tried(config, 2, initial, values) == tried
    assert derive_rungs(config, 2, initial, values) == rungs
    assert simulate.route(config, _positions_from_record(config, tried, values, initial)) == tried


@pytest.mark.parametrize("config", ENTROPY_CONFIGS, ids=lambda c: f"{c.policy}-{c.up[0]:g}-w{c.window}")
def test_the_bench_replay_on_teacher_forced_arrays_equals_the_engine(ladder, config):
    # The bench replays along an answer by teacher forcing every tier; along the engine's own
    # answer that is what the engine saw, so the replay must put every token on the same tier.
    seen_both = False
    for prompt in PROMPTS:
        rungs, tried, _, _, prompt_ids, answer = _recorded(ladder, prompt, config)
        forced = teacher_forced(ladder, "p", prompt_ids, answer)
        assert simulate.route(config, forced) == tried
        seen_both |= len(set(rungs)) == 2 or any(len(t) > 1 for t in tried)
    assert seen_both  # the thresholds exercise both tiers


def test_both_kinds_of_position_occur_in_the_recorded_runs(ladder):
    kinds = set()
    for config in ENTROPY_CONFIGS + PROBE_CONFIGS:
        for prompt in PROMPTS:
            _, tried, *_ = _recorded(ladder, prompt, config)
            kinds |= {(config.policy, len(t)) for t in tried}
    assert {("ead", 1), ("peek", 1), ("peek", 2)} <= kinds


def test_a_recorded_position_ends_the_review_where_the_record_ends():
    walk = Walk(PeekPolicy(RouterConfig(up=(1.0, 2.0), window=1, min_run=1, policy="peek"), 3))
    walk.start(None)
    settled = walk.step(0, RecordedPosition([3.0]))  # the rule wants rung 1's review; none recorded
    assert settled.rungs == (0, 1) and settled.measured == (3.0, None) and settled.taken == 3.0
