"""The engine against references: mlx-lm's own greedy decoding, and naive full-prefix EAD."""

from __future__ import annotations

import math
from itertools import pairwise

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import stream_generate

from mlxswitch.decoding.answer import TokenEvent
from mlxswitch.decoding.session import ChatSession, GenerationSettings
from mlxswitch.decoding.tiers import pair_ladder
from mlxswitch.errors import PromptTooLongError
from mlxswitch.models.sources import load_model
from mlxswitch.routing.router import Router, RouterConfig, derive_tiers

INF = math.inf
PROMPTS = ["What is the capital of France?", "Count: one two three", "def add(a, b):"]


@pytest.fixture(scope="module")
def ladder(tiny_pair):
    small, large = tiny_pair
    return pair_ladder(load_model(str(small)), load_model(str(large)))


def _entropy_bits(logits: mx.array) -> float:
    x = np.asarray(logits.astype(mx.float32), dtype=np.float64)
    x = x - x.max()
    p = np.exp(x) / np.exp(x).sum()
    nz = p > 0
    return float(-(p[nz] * np.log2(p[nz])).sum())


def naive_reference(ladder, prompt_ids, config: RouterConfig, max_tokens: int):
    """EAD run naively: the chosen model recomputes the whole prefix for every token, no cache."""
    models = [t.model.model for t in ladder.tiers]
    eos = ladder.tokenizer.eos_token_ids

    def last_logits(model, ids):
        return model(mx.array(ids)[None])[0, -1]

    router = Router(config, len(models))
    ids = list(prompt_ids)
    rung = router.start(_entropy_bits(last_logits(models[0], ids))).rung
    tokens, tiers = [], []
    for _ in range(max_tokens):
        logits = last_logits(models[rung], ids)
        token = int(mx.argmax(logits).item())
        ids.append(token)
        if token in eos:
            break
        tokens.append(token)
        tiers.append(rung)
        rung = router.observe(_entropy_bits(logits)).rung
    return tokens, tiers


def _run(ladder, prompt, config, max_tokens=24):
    session = ChatSession(ladder, config, GenerationSettings(max_tokens=max_tokens))
    events = [e for e in session.stream(prompt) if isinstance(e, TokenEvent)]
    return session, events


def _prompt_ids(ladder, prompt):
    return ladder.tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True
    )


@pytest.mark.parametrize("prompt", PROMPTS[:2])
@pytest.mark.parametrize("which,tau", [(0, INF), (1, -INF)])
def test_infinite_thresholds_reproduce_each_model_alone(ladder, prompt, which, tau):
    config = RouterConfig(up=(tau,), window=5, min_run=10)
    _, events = _run(ladder, prompt, config)
    tier = ladder.tiers[which]
    expected = []
    for response in stream_generate(
        tier.model.model, tier.model.tokenizer, _prompt_ids(ladder, prompt), max_tokens=24
    ):
        if response.finish_reason == "stop" and response.token in ladder.tokenizer.eos_token_ids:
            break
        expected.append(response.token)
    assert [e.id for e in events] == expected
    assert {e.tier for e in events} == {tier.name}


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize(
    "up,down,window,min_run",
    [
        (1.5, 1.0, 3, 2),
        (1.0, 0.5, 2, 1),
        (2.0, 2.0, 1, 3),
        (0.8, 0.2, 5, 4),
    ],
)
def test_switching_matches_naive_reference(ladder, prompt, up, down, window, min_run):
    config = RouterConfig(up=(up,), down=(down,), window=window, min_run=min_run)
    _, events = _run(ladder, prompt, config)
    tokens, tiers = naive_reference(ladder, _prompt_ids(ladder, prompt), config, 24)
    assert [e.id for e in events] == tokens
    assert [e.rung for e in events] == tiers


def test_thresholds_used_in_tests_really_switch(ladder):
    # Guards the test above against vacuity: at least one setting moves both ways.
    config = RouterConfig(up=(1.5,), down=(1.0,), window=3, min_run=2)
    _, events = _run(ladder, PROMPTS[0], config)
    rungs = [e.rung for e in events]
    assert 0 in rungs and 1 in rungs
    assert any(a > b for a, b in pairwise(rungs))


def test_telemetry_tiers_rederive_from_entropies(ladder):
    config = RouterConfig(up=(1.2,), down=(0.7,), window=3, min_run=2)
    session, events = _run(ladder, PROMPTS[1], config, max_tokens=32)
    summary = session.last_summary
    derived = derive_tiers(summary.initial_entropy, [e.entropy for e in events], config, 2)
    assert derived[: len(events)] == [e.rung for e in events]


def test_multi_turn_reuses_the_conversation_cache(ladder):
    config = RouterConfig(up=(1.5,), down=(1.0,), window=3, min_run=2)
    session = ChatSession(ladder, config, GenerationSettings(max_tokens=8))
    first = session.ask("Hello, how are you?")
    second = session.ask("And the capital of Italy?")
    assert first.finish_reason in ("stop", "length")
    # The first turn's tokens are reused; only what follows them is prefilled.
    assert second.prefilled_tokens <= second.prompt_tokens - first.prompt_tokens
    # The answer equals a fresh session given the same history from scratch.
    fresh = ChatSession(ladder, config, GenerationSettings(max_tokens=8))
    fresh.conversation.messages = [
        {"role": "user", "content": "Hello, how are you?"},
        {"role": "assistant", "content": first.text},
    ]
    for group in ladder.groups:
        group.reset()
    replay = fresh.ask("And the capital of Italy?")
    assert [e.id for e in replay.tokens] == [e.id for e in second.tokens]


def test_each_answer_marks_where_its_own_ids_begin_on_every_cache_group(ladder):
    """Every tier's cache group knows where the answer being decoded begins (each turn's prompt
    length), so that its catch-ups on the answer's ids are computed as steps (tiers._prefill)."""
    config = RouterConfig(up=(1.5,), window=1, min_run=1)
    session = ChatSession(ladder, config, GenerationSettings(max_tokens=6))
    for prompt in ("Hello, how are you?", "And the capital of Italy?"):
        summary = session.ask(prompt)
        assert [group.answer_from for group in ladder.groups] == [summary.prompt_tokens] * len(ladder.groups)


def test_interrupted_answer_is_kept_in_history(ladder):
    config = RouterConfig(up=(INF,))
    session = ChatSession(ladder, config, GenerationSettings(max_tokens=20))
    stream = session.stream(PROMPTS[0])
    seen = [next(stream) for _ in range(3)]
    stream.close()
    summary = session.last_summary
    assert summary.finish_reason == "interrupted"
    assert [e.id for e in summary.tokens] == [e.id for e in seen]
    assert session.conversation.messages[-1] == {"role": "assistant", "content": summary.text}
    assert all(g.seen <= len(session.conversation.ids) for g in ladder.groups)
    # The session goes on after an interruption.
    assert session.ask("Next question").generated > 0


def test_prompt_longer_than_context_is_refused_and_session_survives(ladder):
    session = ChatSession(ladder, RouterConfig(up=(INF,)), GenerationSettings(max_tokens=4))
    with pytest.raises(PromptTooLongError, match="context holds 512"):
        session.ask("one two three " * 400)
    assert session.conversation.messages == []
    assert session.ask("Hello").generated > 0


def test_stop_strings_cut_the_answer(ladder):
    config = RouterConfig(up=(INF,))
    free = ChatSession(ladder, config, GenerationSettings(max_tokens=16)).ask(PROMPTS[0])
    assert len(free.text) > 4
    stop = free.text[2:4]
    cut = ChatSession(ladder, config, GenerationSettings(max_tokens=16, stop=(stop,))).ask(PROMPTS[0])
    assert cut.finish_reason == "stop"
    assert cut.text == free.text[: free.text.find(stop)]


def test_seeded_sampling_is_reproducible(ladder):
    config = RouterConfig(up=(1.5,), down=(1.0,), window=3, min_run=2)
    settings = GenerationSettings(max_tokens=12, temperature=0.8, top_p=0.9, seed=7)
    a = ChatSession(ladder, config, settings).ask(PROMPTS[0])
    b = ChatSession(ladder, config, settings).ask(PROMPTS[0])
    assert [e.id for e in a.tokens] == [e.id for e in b.tokens]


@pytest.mark.parametrize(
    "settings", [dict(temp=0.0), dict(temp=0.8), dict(temp=0.7, min_p=0.05), dict(temp=1.0, top_k=20)]
)
def test_samplers_without_top_p_need_no_log_sum_exp(settings):
    # The loop skips the normalisation pass unless top-p is on: these samplers pick the same
    # token from raw logits as from log-probabilities.
    from mlx_lm.sample_utils import make_sampler

    sampler = make_sampler(**settings)
    rng = np.random.default_rng(0)
    for seed in range(20):
        logits = mx.array(rng.normal(0, 4, size=(1, 500)).astype(np.float32))
        mx.random.seed(seed)
        raw = sampler(logits).item()
        mx.random.seed(seed)
        normalized = sampler(logits - mx.logsumexp(logits, axis=-1, keepdims=True)).item()
        assert raw == normalized


def test_the_wired_limit_counts_every_model_of_the_ladder(ladder, monkeypatch):
    import contextlib

    from mlx.utils import tree_reduce

    import mlxswitch.decoding.engine as engine_module

    seen = []

    @contextlib.contextmanager
    def recording(model, streams=None):
        seen.append(model)
        yield

    monkeypatch.setattr(engine_module, "wired_limit", recording)
    ChatSession(ladder, RouterConfig(up=(0.5,))).ask("Hi", max_tokens=2)

    def nbytes(tree):
        return tree_reduce(lambda acc, x: acc + x.nbytes if isinstance(x, mx.array) else acc, tree, 0)

    [given] = seen
    small, large = (nbytes(t.model.model) for t in ladder.tiers)
    assert nbytes(given) == small + large


def test_the_bottom_split_is_checked_once_and_leaves_the_gear_it_found(tiny_gears_4_8):
    from mlxswitch.decoding.tiers import gear_ladder

    gears = gear_ladder(tiny_gears_4_8, [4, 8])
    state = tiny_gears_4_8.model.gear_state
    state.set(8)
    split = gears.bottom_split()
    assert state.gear == 8 and gears.bottom_split() is split


def test_a_pass_splits_its_inputs_as_mlx_lm_splits_a_prompt(tiny_pair, monkeypatch):
    from mlxswitch.decoding.tiers import CacheGroup
    from mlxswitch.kernels.quant_cpu import INT8_MAX_POSITIONS

    loaded = load_model(str(tiny_pair[1]))
    ids = mx.array(_prompt_ids_of(loaded.tokenizer, PROMPTS[0] * 6))
    assert ids.size > INT8_MAX_POSITIONS + 16
    passes = []
    body = loaded.model.model
    real = type(body).__call__

    def counted(self, x, *args, **kwargs):
        passes.append(x.shape[1])
        return real(self, x, *args, **kwargs)

    monkeypatch.setattr(type(body), "__call__", counted)
    group = CacheGroup(loaded, "large")
    group.checked_split()  # the one-time check of the split (a forward pass of its own)
    short = ids[:INT8_MAX_POSITIONS]
    want = loaded.model(short[None])[0, -1]  # the whole prefix, no cache
    passes.clear()
    got, _ = group.feed(short, None, chunk=512)
    # a catch-up that fits one decoding pass rides in the pass that reads the logits
    assert passes == [short.size] and group.seen == short.size
    assert np.allclose(np.array(got[0]), np.array(want), rtol=1e-4, atol=1e-4)
    passes.clear()
    group.rewind(0)
    group.feed(ids, None, chunk=16)  # a prompt: all but its last id in chunks, then the last alone
    fill = ids.size - 1
    assert passes == [16] * (fill // 16) + ([fill % 16] if fill % 16 else []) + [1]


def test_a_quantized_model_answers_a_long_prompt_as_mlx_lm_generates(tmp_path, monkeypatch):
    """On the CPU default (int8 activations in decoding passes, fp32 in a prefill's) a prompt's
    last position computed inside its prefill got other bits than mlx-lm's generate (and serve's
    one-model batch) gives it; split as mlx-lm splits, the answer is the same."""
    import mlx.nn as nn
    from tinymodels import llama_config, make_model, save_model_dir, train_tokenizer

    from mlxswitch.api import open_chat, resolve_profile
    from mlxswitch.kernels import quant_cpu
    from mlxswitch.kernels.route import resolve_route

    resolve_route("auto", "cpu")
    monkeypatch.setattr(quant_cpu, "INT8_MIN_INPUTS", 32)  # this tiny model stands for a real one
    tok = train_tokenizer(320)
    config = llama_config(tok.get_vocab_size(), hidden=128, layers=2, heads=4, kv_heads=2, intermediate=256)
    model = make_model(config, 3)
    nn.quantize(model, group_size=32, bits=4)
    config["quantization"] = {"group_size": 32, "bits": 4}
    source = save_model_dir(tmp_path / "q4", model, config, tok)
    session = open_chat(resolve_profile(model=str(source)), settings=GenerationSettings(max_tokens=24))
    prompt = "Count the words: " + "one two three four five six seven eight nine ten " * 3
    ours = [e.id for e in session.ask(prompt).tokens]
    reference = load_model(str(source))
    expected = []
    for response in stream_generate(
        reference.model, reference.tokenizer, _prompt_ids_of(reference.tokenizer, prompt), max_tokens=24
    ):
        if response.finish_reason == "stop" and response.token in reference.tokenizer.eos_token_ids:
            break
        expected.append(response.token)
    assert len(_prompt_ids_of(reference.tokenizer, prompt)) > 33 and len(ours) > 8
    assert ours == expected


def _prompt_ids_of(tokenizer, prompt):
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
