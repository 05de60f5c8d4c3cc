"""The `peek` policy: same-position escalation, against naive references, and re-derived from records."""

from __future__ import annotations

import json
import math

import mlx.core as mx
import numpy as np
import pytest
from typer.testing import CliRunner

from mlxswitch.cli import app
from mlxswitch.decoding.answer import TokenEvent
from mlxswitch.decoding.session import ChatSession, GenerationSettings
from mlxswitch.decoding.tiers import gear_ladder, pair_ladder
from mlxswitch.models.sources import load_model
from mlxswitch.routing.policies import PeekPolicy
from mlxswitch.routing.router import RouterConfig
from mlxswitch.routing.walk import derive_rungs, derive_tried

PROMPTS = ["What is the capital of France?", "Count: one two three", "def add(a, b):"]


def _entropy_bits(logits: mx.array) -> float:
    x = np.asarray(logits.astype(mx.float32), dtype=np.float64)
    p = np.exp(x - x.max())
    p /= p.sum()
    nz = p > 0
    return float(-(p[nz] * np.log2(p[nz])).sum())


# -- the rule on hand-made sequences -----------------------------------------------------------


def test_peek_escalates_the_same_position_and_holds_while_the_mean_stays_high():
    policy = PeekPolicy(RouterConfig(up=(2.0,), down=(1.0,), window=2, min_run=2, policy="peek"), 2)
    assert policy.start(5.0).rung == 0  # H0 is reviewed as position 0, not used to climb
    assert policy.may_review(0) and not policy.may_review(1)
    assert policy.review(0, 1.5) is None and policy.commit(0, 1.5).rung == 0
    assert policy.review(0, 2.5) == 1  # the same position goes up
    assert policy.commit(1, 1.8).rung == 1  # c = 1 < min_run: held
    assert policy.commit(1, 0.5).rung == 1  # c = 2, mean(1.8, 0.5) = 1.15 ≥ down: held
    assert policy.commit(1, 0.4).rung == 0  # mean 0.45 < down: back to the cheap tier
    assert policy.review(0, math.nan) == 1  # the guard: a broken distribution goes to the top


def test_peek_with_window_and_min_run_one_decides_each_position_alone():
    policy = PeekPolicy(RouterConfig(up=(2.0,), window=1, min_run=1, policy="peek"), 2)
    policy.start(None)
    assert policy.review(0, 3.0) == 1
    assert policy.commit(1, 0.2).rung == 0  # the strong token was sure: next position cheap again


def test_derive_tried_flags_a_record_the_rule_disagrees_with():
    config = RouterConfig(up=(2.0,), window=1, min_run=1, policy="peek")
    assert derive_tried(config, 2, None, [[1.0], [3.0, 0.5], [1.0]]) == [[0], [0, 1], [0]]
    assert derive_tried(config, 2, None, [[3.0]]) == [[0, 1]]  # the rule escalates, the record did not


# -- the engine against naive references -------------------------------------------------------


@pytest.fixture(scope="module")
def ladder(tiny_pair):
    small, large = tiny_pair
    return pair_ladder(load_model(str(small)), load_model(str(large)))


def _prompt_ids(ladder, prompt):
    return ladder.tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True
    )


def _uncertainty(logits: mx.array, signal: str) -> float:
    x = np.asarray(logits.astype(mx.float32), dtype=np.float64)
    p = np.exp(x - x.max())
    p /= p.sum()
    if signal == "margin":
        top2 = np.sort(p)[-2:]
        return float(1.0 - (top2[1] - top2[0]))
    if signal == "varentropy":
        nz = p > 0
        bits = np.log2(p[nz])
        return float((p[nz] * bits * bits).sum() - (p[nz] * bits).sum() ** 2)
    return _entropy_bits(logits)


def naive_peek(ladder, prompt_ids, config, max_tokens):
    """Peek run naively: every computation recomputes the whole prefix on its model, no cache."""
    models = [t.model.model for t in ladder.tiers]
    policy = PeekPolicy(config, len(models))
    ids = list(prompt_ids)
    base = policy.start(None).rung
    tokens, tried = [], []
    for _ in range(max_tokens):
        rungs = [base]
        while True:
            logits = models[rungs[-1]](mx.array(ids)[None])[0, -1]
            entropy = _uncertainty(logits, config.signal)
            higher = policy.review(rungs[-1], entropy) if policy.may_review(rungs[-1]) else None
            if higher is None:
                break
            rungs.append(higher)
        token = int(mx.argmax(logits).item())
        ids.append(token)
        base = policy.commit(rungs[-1], entropy).rung
        if token in ladder.tokenizer.eos_token_ids:
            break
        tokens.append(token)
        tried.append(rungs)
    return tokens, tried


def _events(ladder, prompt, config, max_tokens=24):
    session = ChatSession(ladder, config, GenerationSettings(max_tokens=max_tokens))
    events = [e for e in session.stream(prompt) if isinstance(e, TokenEvent)]
    return session, events


def _tried(event: TokenEvent, names: list[str]) -> list[int]:
    return [names.index(t) for t in event.tried] if event.tried else [event.rung]


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("up,down,window,min_run", [(1.5, 1.0, 1, 1), (1.2, 0.8, 2, 3), (2.0, 0.5, 3, 2)])
def test_peek_matches_the_naive_reference_on_a_pair(ladder, prompt, up, down, window, min_run):
    config = RouterConfig(up=(up,), down=(down,), window=window, min_run=min_run, policy="peek")
    _, events = _events(ladder, prompt, config)
    tokens, tried = naive_peek(ladder, _prompt_ids(ladder, prompt), config, 24)
    assert [e.id for e in events] == tokens
    assert [_tried(e, ladder.tier_names) for e in events] == tried


def test_the_peek_reference_comparisons_escalate(ladder):
    config = RouterConfig(up=(1.5,), down=(1.0,), window=1, min_run=1, policy="peek")
    _, events = _events(ladder, PROMPTS[0], config)
    escalated = [e for e in events if len(e.tried) > 1]
    assert escalated and len(escalated) < len(events)  # both kinds of position occur


def test_an_escalated_token_costs_both_tiers(ladder):
    config = RouterConfig(up=(1.5,), down=(1.0,), window=1, min_run=1, policy="peek")
    session, events = _events(ladder, PROMPTS[0], config)
    summary = session.last_summary
    bytes_ = summary.tier_bytes
    expected = sum(bytes_["small"] + bytes_["large"] if e.tried else bytes_[e.tier] for e in events)
    assert summary.mean_bytes_per_token == pytest.approx(expected / len(events))


def stepwise_peek_gears(model, prompt_ids, config, max_tokens, eos):
    """One shared cache without pipelining: a re-computed position is trimmed and re-fed at its gear."""
    from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

    gears = model.gear_state.gears
    policy = PeekPolicy(config, len(gears))
    cache = make_prompt_cache(model)
    model.gear_state.set(gears[-1])  # the prompt is prefilled at the top gear
    model(mx.array(prompt_ids[:-1])[None], cache=cache)
    last, base = prompt_ids[-1], policy.start(None).rung
    tokens, tried = [], []
    for _ in range(max_tokens):
        rungs = [base]
        while True:
            model.gear_state.set(gears[rungs[-1]])
            logits = model(mx.array([last])[None], cache=cache)[0, -1]
            entropy = _entropy_bits(logits)
            higher = policy.review(rungs[-1], entropy) if policy.may_review(rungs[-1]) else None
            if higher is None:
                break
            trim_prompt_cache(cache, 1)  # this position's K/V comes from the gear that redoes it
            rungs.append(higher)
        last = int(mx.argmax(logits).item())
        base = policy.commit(rungs[-1], entropy).rung
        if last in eos:
            break
        tokens.append(last)
        tried.append(rungs)
    return tokens, tried


def test_peek_on_shared_gears_matches_the_stepwise_reference(tiny_gears_4_8):
    loaded = tiny_gears_4_8
    config = RouterConfig(
        up=(1.2,), down=(0.8,), window=1, min_run=1, policy="peek", vocab_size=loaded.vocab_size
    )
    ladder = gear_ladder(loaded, [4, 8])
    prompt = "The quick brown fox"
    session, events = _events(ladder, prompt, config)
    ids = session.render([{"role": "user", "content": prompt}])
    tokens, tried = stepwise_peek_gears(loaded.model, ids, config, 24, ladder.tokenizer.eos_token_ids)
    assert [e.id for e in events] == tokens
    assert [_tried(e, ladder.tier_names) for e in events] == tried
    assert any(len(t) > 1 for t in tried) and any(len(t) == 1 for t in tried)


# -- re-derived from --json and --telemetry ------------------------------------------------------


def test_peek_tiers_rederive_from_json_and_telemetry(tiny_pair, tmp_path):
    small, large = tiny_pair
    path = tmp_path / "t.jsonl"
    result = CliRunner().invoke(
        app,
        [
            "chat",
            "--small",
            str(small),
            "--large",
            str(large),
            "--json",
            "--policy",
            "peek",
            "--tau",
            "1.5",
            "--tau-down",
            "1.0",
            "--window",
            "1",
            "--min-run",
            "1",
            "--max-tokens",
            "16",
            "--telemetry",
            str(path),
        ],
        input="Hello there\nCount to three\n",
    )
    assert result.exit_code == 0, result.stderr
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    escalations = 0
    for number, record in enumerate(json.loads(line) for line in result.stdout.splitlines()):
        router = record["router"]
        assert router["policy"] == "peek"
        config = RouterConfig(
            up=tuple(map(float, router["up"])),
            down=tuple(map(float, router["down"])),
            window=router["window"],
            min_run=router["min_run"],
            policy="peek",
            normalize=router["normalized"],
            vocab_size=router["vocab_size"],
        )
        telemetry = [r for r in lines if r.get("answer") == number and "index" in r]
        for tokens in (record["tokens"], telemetry):
            tried = [
                [float(h) for _, h in t["tried"]] if "tried" in t else [float(t["entropy"])] for t in tokens
            ]
            rungs = derive_rungs(config, 2, float(router["initial_entropy"]), tried)
            assert [router["tiers"][r] for r in rungs] == [t["tier"] for t in tokens]
            escalations += sum("tried" in t for t in tokens)
    assert escalations > 0


@pytest.mark.parametrize("signal,up,down", [("margin", 0.5, 0.3), ("varentropy", 2.0, 1.2)])
def test_peek_on_another_signal_matches_the_naive_reference(ladder, signal, up, down):
    config = RouterConfig(up=(up,), down=(down,), window=1, min_run=1, policy="peek", signal=signal)
    _, events = _events(ladder, PROMPTS[0], config)
    tokens, tried = naive_peek(ladder, _prompt_ids(ladder, PROMPTS[0]), config, 24)
    assert [e.id for e in events] == tokens
    assert [_tried(e, ladder.tier_names) for e in events] == tried
    assert any(len(t) > 1 for t in tried) and any(len(t) == 1 for t in tried)
    # Every token records the value routed on; its tier re-derives from those values.
    values = [
        [h for _, h in zip(e.tried, e.tried_signals, strict=True)] if e.tried else [e.signal] for e in events
    ]
    assert all(e.signal is not None for e in events)
    assert derive_rungs(config, 2, None, values) == [e.rung for e in events]
