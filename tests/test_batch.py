"""Continuous batching of single-model answers (decoding/batch.py): the same answers as one at a
time, requests joining mid-way and leaving early, stop strings, prompt caches reused."""

from __future__ import annotations

import mlx.core as mx
import pytest
from batch_helpers import Collector, run_batch

from mlxswitch.decoding.answer import AnswerSummary
from mlxswitch.decoding.batch import BatchedAnswers, LastRowLogits, batchable
from mlxswitch.decoding.prompt_caches import PromptCaches
from mlxswitch.decoding.session import ChatSession, GenerationSettings
from mlxswitch.decoding.tiers import pair_ladder, single_model_ladder
from mlxswitch.models.heads import SplitModel
from mlxswitch.models.sources import load_model
from mlxswitch.routing.router import RouterConfig

PROMPTS = ["Hello there", "Write a poem about the sea and the sky", "1 2 3", "Why?"]


@pytest.fixture(scope="module")
def loaded(tiny_pair):
    return load_model(str(tiny_pair[1]))


def _session(loaded, max_tokens=12, **settings) -> ChatSession:
    return ChatSession(
        single_model_ladder(loaded),
        RouterConfig(up=()),
        GenerationSettings(max_tokens=max_tokens, **settings),
        measure_signals=True,  # the batch gives each token's entropy: compared below
    )


def _alone(loaded, prompt: str, **settings) -> AnswerSummary:
    session = _session(loaded, **settings)
    for _ in session.stream_prepared(session.prepare_conversation([{"role": "user", "content": prompt}])):
        pass
    assert session.last_summary is not None
    return session.last_summary


def test_batched_answers_are_the_answers_made_one_at_a_time(loaded):
    alone = [_alone(loaded, p) for p in PROMPTS]
    session = _session(loaded)
    engine = BatchedAnswers(session, max_batch=3)  # one of the four waits for a free row
    got = []
    for prompt in PROMPTS[:2]:
        got.append(Collector())
        engine.add(session.prepare_conversation([{"role": "user", "content": prompt}]), got[-1])
    engine.step()
    engine.step()  # the others join mid-way, at a step boundary
    for prompt in PROMPTS[2:]:
        got.append(Collector())
        engine.add(session.prepare_conversation([{"role": "user", "content": prompt}]), got[-1])
    run_batch(engine)
    for want, collected in zip(alone, got, strict=True):
        summary = collected.summary
        assert summary is not None
        assert [e.id for e in summary.tokens] == [e.id for e in want.tokens]
        assert [e.id for e in collected.events] == [e.id for e in want.tokens]  # each event once, in order
        assert summary.text == want.text and summary.finish_reason == want.finish_reason
        assert summary.prompt_tokens == want.prompt_tokens
        for mine, theirs in zip(summary.tokens, want.tokens, strict=True):
            assert mine.entropy == pytest.approx(theirs.entropy, abs=1e-3)
            assert mine.tier == theirs.tier


def test_the_batch_computes_the_output_head_for_the_last_position_only(loaded):
    """mlx-lm's batch reads only the last position's logits, so the head runs on it alone: the
    same logits there as the whole model's, one row where the whole model gives every one."""
    engine = BatchedAnswers(_session(loaded), max_batch=2)
    assert isinstance(engine.generator.model, LastRowLogits)
    split = engine.tier.group.checked_split()
    assert split is not None
    heads: list[tuple[int, ...]] = []

    def head(hidden: mx.array) -> mx.array:
        heads.append(tuple(hidden.shape))
        return split.head(hidden)

    model = LastRowLogits(loaded.model, SplitModel(split.body, head, split.hidden_size))
    ids = mx.array([[1, 2, 3, 4, 5, 6]])
    whole = loaded.model(ids)
    got = model(ids)
    assert got.shape == (1, 1, whole.shape[-1]) and heads == [(1, 1, split.hidden_size)]
    assert mx.allclose(got[:, -1], whole[:, -1], rtol=1e-4, atol=1e-4).item()


def test_a_cancelled_answer_leaves_and_the_others_go_on(loaded):
    session = _session(loaded, max_tokens=20)
    engine = BatchedAnswers(session, max_batch=4)
    left, stays = Collector(), Collector()
    uid = engine.add(session.prepare_conversation([{"role": "user", "content": PROMPTS[0]}]), left)
    engine.add(session.prepare_conversation([{"role": "user", "content": PROMPTS[1]}]), stays)
    for _ in range(4):
        engine.step()
    engine.cancel(uid)
    assert left.summary is not None and left.summary.finish_reason == "interrupted"
    run_batch(engine)
    want = _alone(loaded, PROMPTS[1], max_tokens=20)
    assert stays.summary is not None and [e.id for e in stays.summary.tokens] == [e.id for e in want.tokens]


def test_stop_strings_and_log_probabilities_in_a_batch(loaded):
    want = _alone(loaded, PROMPTS[1], max_tokens=12)
    stop = want.text[len(want.text) // 2 :][:3]
    session = _session(loaded, max_tokens=12)
    engine = BatchedAnswers(session, max_batch=2)
    stopped, logged = Collector(), Collector()
    settings = GenerationSettings(max_tokens=12, stop=(stop,))
    engine.add(session.prepare_conversation([{"role": "user", "content": PROMPTS[1]}], settings), stopped)
    logs = GenerationSettings(max_tokens=12, top_logprobs=2)
    engine.add(session.prepare_conversation([{"role": "user", "content": PROMPTS[0]}], logs), logged)
    run_batch(engine)
    assert stopped.summary is not None and stopped.summary.finish_reason == "stop"
    assert stopped.summary.text == want.text[: want.text.find(stop)]
    assert logged.summary is not None
    assert all(e.logprob is not None and len(e.top_logprobs) == 2 for e in logged.summary.tokens)


def test_a_conversation_that_goes_on_reuses_its_kept_cache(loaded):
    caches = PromptCaches(size=2)
    session = _session(loaded, max_tokens=6)
    engine = BatchedAnswers(session, max_batch=2, prompt_caches=caches)
    first = Collector()
    turn = [{"role": "user", "content": PROMPTS[1]}]
    engine.add(session.prepare_conversation(turn), first)
    run_batch(engine)
    assert first.summary is not None and len(caches) == 1
    turn = turn + [{"role": "assistant", "content": first.summary.text}, {"role": "user", "content": "More"}]
    second = Collector()
    prepared = session.prepare_conversation(turn)
    engine.add(prepared, second)
    run_batch(engine)
    assert second.summary is not None
    assert 0 < second.summary.prefilled_tokens < second.summary.prompt_tokens  # the history was not fed again
    alone = _session(loaded, max_tokens=6)
    for _ in alone.stream_prepared(alone.prepare_conversation(turn)):
        pass
    assert alone.last_summary is not None
    assert [e.id for e in second.summary.tokens] == [e.id for e in alone.last_summary.tokens]


def test_only_one_local_tier_is_batched(tiny_pair, loaded):
    assert batchable(_session(loaded))
    small = load_model(str(tiny_pair[0]))
    pair = ChatSession(pair_ladder(small, loaded), RouterConfig(up=(1.5,)), GenerationSettings())
    assert not batchable(pair)
    with pytest.raises(ValueError):
        BatchedAnswers(pair, max_batch=2)


def test_requests_that_share_only_a_beginning_each_reuse_it():
    caches = PromptCaches(size=2)
    kept = [_FakeCache(10)]
    caches.keep(list(range(10)), kept)
    first = caches.take([0, 1, 2, 3, 4, 99, 98])
    second = caches.take([0, 1, 2, 3, 77])
    assert first is not None and first[1] == 5 and first[0][0].offset == 5
    assert second is not None and second[1] == 4 and second[0][0].offset == 4
    assert len(caches) == 1 and kept[0].offset == 10  # the kept one is untouched, still kept
    whole = caches.take(list(range(12)))  # continues it whole: handed over, no copy
    assert whole is not None and whole[1] == 10 and whole[0][0] is kept[0] and len(caches) == 0


class _FakeCache:
    """A trimmable cache of `offset` tokens (what trim_prompt_cache and cache_nbytes read)."""

    def __init__(self, offset: int):
        self.offset = offset
        self.nbytes = 4 * offset

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self.offset, n)
        self.offset -= n
        return n


def _sampled(engine, session, prompt: str, seed: int | None) -> Collector:
    settings = GenerationSettings(max_tokens=12, temperature=1.0, seed=seed)
    collected = Collector()
    engine.add(session.prepare_conversation([{"role": "user", "content": prompt}], settings), collected)
    return collected


def test_a_seeded_answer_is_the_same_whoever_shares_the_batch(loaded):
    # Each seeded row draws from its own stream: a sampled neighbour (seeded or not) drawing in
    # the same steps changes nothing, and a different seed gives a different answer.
    session = _session(loaded)
    engine = BatchedAnswers(session, max_batch=4)
    alone = _sampled(engine, session, PROMPTS[1], seed=7)
    run_batch(engine)
    crowded = [
        _sampled(engine, session, PROMPTS[0], seed=None),
        _sampled(engine, session, PROMPTS[1], seed=7),
        _sampled(engine, session, PROMPTS[1], seed=8),
        _sampled(engine, session, PROMPTS[2], seed=None),
    ]
    run_batch(engine)
    ids = [[e.id for e in c.summary.tokens] for c in (alone, *crowded) if c.summary is not None]
    assert len(ids) == 5
    assert ids[2] == ids[0]  # seed 7 beside three sampled neighbours: as alone
    assert ids[3] != ids[0]  # seed 8: another answer


def test_each_tiers_cache_is_kept_and_taken_apart_and_bounded_per_tier():
    caches = PromptCaches(size=2)
    small, large = [_FakeCache(10)], [_FakeCache(6)]  # the large tier computed less of it
    caches.keep(list(range(10)), small, "small")
    caches.keep(list(range(6)), large, "large")
    assert len(caches) == 2  # one conversation, an entry per tier
    got = caches.take(list(range(12)), "large")
    assert got is not None and got[0][0] is large[0] and got[1] == 6  # never the other tier's
    assert caches.take(list(range(12)), "model") is None
    for start in (100, 200, 300):  # three more conversations on the small tier: two are kept
        caches.keep(list(range(start, start + 5)), [_FakeCache(5)], "small")
    assert caches.kept == [tuple(range(200, 205)), tuple(range(300, 305))]
