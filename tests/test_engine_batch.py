"""Continuous batching of verified drafting (decoding/engine.py) and the packed pass it runs
on (models/packed_cache.py, CacheGroup.score_together): the same logits as each conversation's own pass,
the same answers as one at a time, requests joining mid-way and leaving early, and the planner
not taught by seconds that were not one answer's."""

from __future__ import annotations

import dataclasses
import math

import mlx.core as mx
import pytest
from batch_helpers import Collector, run_batch

from mlxswitch.decoding.answer import AnswerSummary
from mlxswitch.decoding.draft_memory import DraftMemory
from mlxswitch.decoding.engine import ONE_AT_A_TIME, PACKED, Engine, batch_engine, batching, shares_passes
from mlxswitch.decoding.mode import DecodingMode
from mlxswitch.decoding.prompt_caches import PromptCaches
from mlxswitch.decoding.session import ChatSession, GenerationSettings
from mlxswitch.decoding.tiers import CacheGroup, Ladder, gear_ladder, pair_ladder, single_model_ladder
from mlxswitch.models.sources import load_model
from mlxswitch.routing.policies import make_policy
from mlxswitch.routing.router import RouterConfig

PROMPTS = ["Hello there", "Write a poem about the sea and the sky", "def add(a, b): return a + b", "Why?"]
INF = math.inf


@pytest.fixture(scope="module")
def models(tiny_pair):
    return load_model(str(tiny_pair[0])), load_model(str(tiny_pair[1]))


Decoding = tuple[RouterConfig, DecodingMode]


def _verify(tau: float = 2.0, draft: str = "adaptive", lookup: bool = True) -> Decoding:
    return RouterConfig(up=(tau,)), DecodingMode(verify=True, draft=draft, lookup=lookup)


def _ladder(models, twin: bool) -> Ladder:
    small, large = models
    return pair_ladder(large if twin else small, large)


def _session(ladder: Ladder, config: RouterConfig | Decoding, max_tokens: int = 40) -> ChatSession:
    router, mode = config if isinstance(config, tuple) else (config, DecodingMode())
    return ChatSession(
        ladder, router, GenerationSettings(max_tokens=max_tokens), decoding=mode, measure_signals=True
    )


def _alone(
    ladder: Ladder, config: RouterConfig | Decoding, prompt: str, max_tokens: int = 40, **settings
) -> AnswerSummary:
    session = _session(ladder, config, max_tokens)
    prepared = session.prepare_conversation(
        [{"role": "user", "content": prompt}], GenerationSettings(max_tokens=max_tokens, **settings)
    )
    for _ in session.stream_prepared(prepared):
        pass
    assert session.last_summary is not None
    return session.last_summary


def _add(engine, session, prompt: str, **settings) -> Collector:
    collected = Collector()
    prepared = session.prepare_conversation(
        [{"role": "user", "content": prompt}], GenerationSettings(**settings) if settings else None
    )
    engine.add(prepared, collected)
    return collected


def test_a_packed_pass_gives_each_conversation_the_logits_of_its_own_pass(models):
    ladder = single_model_ladder(models[1])
    histories = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16], [20]]
    new = [[6], [3, 4, 5], [17, 18], [21, 22, 23, 24, 25, 26]]
    rows = [1, 3, 2, 4]
    alone, packed = [], []
    for history, ids, n in zip(histories, new, rows, strict=True):
        group = ladder.fork().groups[0]
        group.score(mx.array(history), 1, None, 512)
        alone.append(group.score(mx.array(ids), n, None, 512))
        group = ladder.fork().groups[0]
        group.score(mx.array(history), 1, None, 512)
        packed.append(group)
    together = CacheGroup.score_together(
        [(g, mx.array(ids), n) for g, ids, n in zip(packed, new, rows, strict=True)], None, 512
    )
    for want, got in zip(alone, together, strict=True):
        assert got.shape == want.shape
        assert mx.allclose(got, want, atol=1e-4).item()
    # Each cache now holds its own conversation, and the next packed step reads only that.
    nxt = CacheGroup.score_together([(g, mx.array([5]), 1) for g in packed], None, 512)
    for history, ids, group, got in zip(histories, new, packed, nxt, strict=True):
        assert group.seen == len(history) + len(ids) + 1
        whole = ladder.fork().groups[0].score(mx.array(history + ids + [5]), 1, None, 512)
        assert mx.allclose(got, whole, atol=1e-4).item()


def _ladder_named(models, gears, name: str) -> Ladder:
    if name == "gears":
        return gear_ladder(gears, [4, 8])
    if name == "one":
        return single_model_ladder(models[1])
    return _ladder(models, twin=name == "twin")


ROUTED = RouterConfig(up=(1.5,), down=(1.0,), policy="peek", window=1, min_run=1)
LADDERS_AND_RULES = [
    ("pair", _verify(draft="adaptive", lookup=True)),
    ("pair", _verify(draft="fixed", lookup=False)),
    ("twin", _verify(draft="fixed", lookup=False)),  # drafts all kept: long packed checks
    ("pair", ROUTED),  # the token loop: peek moves between the models per position
    ("pair", RouterConfig(up=(1.5,), down=(1.0,), window=3, min_run=2)),  # the threshold policy
    ("gears", ROUTED),  # one model, one cache per answer, two gears packed apart
    ("gears", _verify(draft="fixed", lookup=False)),
    ("one", RouterConfig(up=())),  # one model, as `serve --model` batches it
]


@pytest.mark.parametrize(("name", "config"), LADDERS_AND_RULES)
def test_batched_answers_are_the_answers_made_one_at_a_time(models, tiny_gears_4_8, name, config):
    alone = [_alone(_ladder_named(models, tiny_gears_4_8, name), config, p) for p in PROMPTS]
    session = _session(_ladder_named(models, tiny_gears_4_8, name), config)
    engine = Engine(session, max_batch=3)  # one of the four waits for a place
    got = [_add(engine, session, p) for p in PROMPTS[:2]]
    engine.step()
    engine.step()  # the others join mid-way, at a step boundary
    got += [_add(engine, session, p) for p in PROMPTS[2:]]
    run_batch(engine)
    tiers: dict[str, int] = {}
    for want, collected in zip(alone, got, strict=True):
        summary = collected.summary
        assert summary is not None
        assert [e.id for e in summary.tokens] == [e.id for e in want.tokens]
        assert [e.id for e in collected.events] == [e.id for e in want.tokens]  # each event once, in order
        assert [e.tier for e in summary.tokens] == [e.tier for e in want.tokens]  # the same routing
        assert summary.text == want.text and summary.finish_reason == want.finish_reason
        for tier, count in summary.tier_counts.items():
            tiers[tier] = tiers.get(tier, 0) + count
    if name == "twin" or config is ROUTED:
        assert len([t for t, count in tiers.items() if count]) == 2  # both tiers made tokens


def test_a_cancelled_answer_leaves_and_the_others_go_on(models):
    ladder = _ladder(models, twin=True)
    session = _session(ladder, _verify(draft="fixed", lookup=False))
    engine = Engine(session, max_batch=4)
    left = _add(engine, session, PROMPTS[0])
    stays = _add(engine, session, PROMPTS[1])
    for _ in range(3):
        engine.step()
    engine.cancel(0)
    assert left.summary is not None and left.summary.finish_reason == "interrupted"
    run_batch(engine)
    want = _alone(_ladder(models, twin=True), RouterConfig(up=(-INF,)), PROMPTS[1])
    assert stays.summary is not None and [e.id for e in stays.summary.tokens] == [e.id for e in want.tokens]
    engine.cancel(0)  # already gone: nothing happens


def test_stop_strings_log_probabilities_and_a_kept_conversation(models):
    config = _verify(draft="fixed", lookup=False)
    want = _alone(_ladder(models, twin=False), config, PROMPTS[1], max_tokens=30)
    stop = want.text[len(want.text) // 2 :][:3]
    caches = PromptCaches(size=2)
    session = _session(_ladder(models, twin=False), config, max_tokens=30)
    engine = Engine(session, max_batch=2, prompt_caches=caches)
    stopped = _add(engine, session, PROMPTS[1], max_tokens=30, stop=(stop,))
    logged = _add(engine, session, PROMPTS[0], max_tokens=30, top_logprobs=2)
    run_batch(engine)
    assert stopped.summary is not None and stopped.summary.finish_reason == "stop"
    assert stopped.summary.text == want.text[: want.text.find(stop)]
    assert logged.summary is not None
    assert all(e.logprob is not None and len(e.top_logprobs) == 2 for e in logged.summary.tokens)
    # A conversation that goes on takes its kept cache: its history is not fed again.
    turn = [
        {"role": "user", "content": PROMPTS[0]},
        {"role": "assistant", "content": logged.summary.text},
        {"role": "user", "content": "More"},
    ]
    again = Collector()
    engine.add(session.prepare_conversation(turn), again)
    run_batch(engine)
    assert again.summary is not None
    assert 0 < again.summary.prefilled_tokens < again.summary.prompt_tokens
    alone = _session(_ladder(models, twin=False), config, max_tokens=30)
    for _ in alone.stream_prepared(alone.prepare_conversation(turn)):
        pass
    assert alone.last_summary is not None
    assert [e.id for e in again.summary.tokens] == [e.id for e in alone.last_summary.tokens]


def test_the_planner_learns_no_seconds_from_a_shared_pass(models):
    ladder = _ladder(models, twin=True)
    ladder.draft_memory = DraftMemory()
    session = _session(ladder, _verify(), max_tokens=12)
    engine = Engine(session, max_batch=2)
    # The same request twice: the two answers run side by side from the first pass to the last,
    # every pass packed with the other's, so no pass was one answer's and nothing is learned.
    _add(engine, session, PROMPTS[0])
    _add(engine, session, PROMPTS[0])
    run_batch(engine)
    assert not ladder.draft_memory.check.known and not ladder.draft_memory.draft.known
    # One answer alone has its passes to itself: the planner learns from them as it always does.
    _add(engine, session, PROMPTS[0])
    run_batch(engine)
    assert ladder.draft_memory.check.known


def test_which_sessions_batch_and_with_which_engine(models, tiny_gears_4_8):
    pair = _session(_ladder(models, twin=False), _verify())
    routed = ChatSession(_ladder(models, twin=False), ROUTED, GenerationSettings())
    geared = ChatSession(gear_ladder(tiny_gears_4_8, [4, 8]), ROUTED, GenerationSettings())
    for session in (pair, routed, geared):
        assert shares_passes(session) and isinstance(batch_engine(session, 2), Engine)
    one = ChatSession(single_model_ladder(models[1]), RouterConfig(up=()), GenerationSettings())
    assert shares_passes(one) and isinstance(batch_engine(one, 2), Engine)  # one model: the same engine
    bounded = ChatSession(
        single_model_ladder(models[1]), RouterConfig(up=()), GenerationSettings(max_kv_size=64)
    )
    assert not shares_passes(bounded) and isinstance(batch_engine(bounded, 2), Engine)  # each pass alone
    controlled = dataclasses.replace(routed.prepare_text("a"), control=make_policy)  # the bench's controls
    assert not shares_passes(routed, controlled)  # decoded beside the others, each pass alone
    # The engines follow the one rule (engine.batching) that `serve` picks its worker by.
    assert batching(False, ROUTED.signal) == PACKED and batching(False, "entropy") == PACKED


@pytest.mark.parametrize(
    ("cloud", "signal", "kind"),
    [
        (False, "entropy", PACKED),
        (False, "margin", PACKED),
        (True, "entropy", ONE_AT_A_TIME),
        (False, "probe", ONE_AT_A_TIME),
    ],
)
def test_how_a_server_batches_a_profile(cloud, signal, kind):
    assert batching(cloud, signal) == kind


def test_forks_share_the_split_checked_once_per_model(models, monkeypatch):
    # The check runs the model: a batch's answers must not each pay it on their first pass.
    from mlxswitch.decoding import tiers

    checks: list[str] = []
    real = tiers.split_model
    monkeypatch.setattr(tiers, "split_model", lambda model, name: checks.append(name) or real(model, name))
    ladder = _ladder(models, twin=False)
    for _ in range(4):
        assert all(group.checked_split() is not None for group in ladder.fork().groups)
    assert len(checks) == 2  # once for each model of the pair
