"""Routing on the probe (`--signal probe`): the rule, the engine against a naive reference, the CLI."""

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
from mlxswitch.decoding.tiers import pair_ladder
from mlxswitch.errors import SettingError, UsageError
from mlxswitch.models.heads import split_model
from mlxswitch.models.sources import load_model
from mlxswitch.routing.policies import PeekPolicy
from mlxswitch.routing.probe import Probe, probe_path
from mlxswitch.routing.router import RouterConfig
from mlxswitch.routing.walk import derive_rungs, derive_tried

PROMPTS = ["What is the capital of France?", "Count: one two three"]


def _config(up=0.5, down=0.3, window=1, min_run=1, tiers=2):
    return RouterConfig(
        up=(up,) * (tiers - 1),
        down=(down,) * (tiers - 1),
        window=window,
        min_run=min_run,
        policy="peek",
        signal="probe",
    )


# -- the rule on hand-made sequences -----------------------------------------------------------


def test_the_probe_needs_peek_and_probabilities():
    with pytest.raises(SettingError, match="needs the peek policy"):
        RouterConfig(up=(0.5,), signal="probe")
    with pytest.raises(SettingError, match="probabilities, between 0 and 1; got 1.5"):
        RouterConfig(up=(1.5,), policy="peek", signal="probe")


def test_every_position_starts_cheap_and_an_escalation_holds_while_the_cheap_mean_stays_high():
    policy = PeekPolicy(_config(up=0.6, down=0.4, window=2, min_run=2), 2)
    assert policy.start(0.9).rung == 0
    assert policy.review(0, 0.2) is None and policy.commit(0, 0.2).rung == 0
    assert policy.review(0, 0.7) == 1  # the same position goes up
    assert not policy.may_review(1)  # the strong tier measures no probe
    assert policy.commit(1, None).rung == 0  # the next position is computed cheap first again…
    assert policy.review(0, 0.45) == 1  # …and held up: c = 1 < min run
    assert policy.commit(1, None).rung == 0  # c = 2, mean(0.7, 0.45) = 0.575 ≥ down: still held
    assert policy.review(0, 0.1) == 1
    assert policy.commit(1, None).rung == 0  # mean(0.45, 0.1) = 0.275 < down: released
    assert policy.review(0, 0.35) is None  # below up, nothing held
    assert policy.commit(0, 0.35).rung == 0
    assert policy.review(0, math.nan) == 1  # the guard


def test_three_tiers_go_to_the_highest_boundary_the_score_crosses_and_step_down_one_at_a_time():
    config = RouterConfig(up=(0.3, 0.7), down=(0.2, 0.6), window=1, min_run=1, policy="peek", signal="probe")
    policy = PeekPolicy(config, 3)
    policy.start(None)
    assert policy.review(0, 0.5) == 1
    policy.commit(1, None)  # mean 0.5 ≥ down[0]: rung 1 held
    assert policy.review(0, 0.9) == 2
    policy.commit(2, None)
    assert policy.review(0, 0.65) == 2  # held: the last mean (0.9) was above down[1]
    policy.commit(2, None)
    assert policy.review(0, 0.25) == 2  # 0.65 ≥ down[1]: still held
    policy.commit(2, None)  # 0.25 < down[1]: one rung down
    assert policy.review(0, 0.1) == 1
    policy.commit(1, None)  # 0.1 < down[0]: released
    assert policy.review(0, 0.1) is None


def test_the_cloud_is_reached_on_the_window_of_cheap_scores_and_never_reviewed_into():
    config = RouterConfig(
        up=(0.5, 0.8), down=(0.3, 0.6), window=1, min_run=1, policy="peek", signal="probe", top_local=1
    )
    policy = PeekPolicy(config, 3)
    policy.start(None)
    assert policy.review(0, 0.95) == 1  # the top local rung, not the cloud
    assert policy.commit(1, None).rung == 2  # mean 0.95 > up[top local]: a cloud span next
    assert policy.resume(1).rung == 0  # local decoding resumes on the cheap rung…
    assert policy.review(0, 0.1) == 1  # …with the top local rung held
    assert policy.commit(1, None).rung == 0  # 0.1 < down[0]: released


def test_records_rederive_from_the_bottom_values_alone():
    config = _config(up=0.6, down=0.4, window=2, min_run=2)
    tried = [[0.2], [0.7, None], [0.45, None], [0.1, None], [0.35]]
    assert derive_tried(config, 2, None, tried) == [[0], [0, 1], [0, 1], [0, 1], [0]]
    assert derive_rungs(config, 2, None, tried) == [0, 1, 1, 1, 0]


# -- the engine against a naive reference ------------------------------------------------------


@pytest.fixture(scope="module")
def ladder(tiny_pair):
    small, large = tiny_pair
    return pair_ladder(load_model(str(small)), load_model(str(large)))


def _probe(hidden_size: int, seed: int = 3) -> Probe:
    rng = np.random.default_rng(seed)
    dims = hidden_size + 3
    return Probe(
        rng.normal(size=dims) * 0.1, 1.0 + rng.random(dims), rng.normal(size=dims) * 2 / math.sqrt(dims), 0.0
    )


def _naive_score(probe: Probe, hidden: np.ndarray, logits: np.ndarray) -> float:
    """The probe's formula written out: sigmoid(((x − mean) / scale) · w + b), float64 from scratch."""
    x = logits.astype(np.float64)
    p = np.exp(x - x.max())
    p /= p.sum()
    nz = p > 0
    bits = np.log2(p[nz])
    entropy = -(p[nz] * bits).sum()
    varentropy = (p[nz] * bits * bits).sum() - entropy**2
    top2 = np.sort(p)[-2:]
    features = np.concatenate([hidden.astype(np.float64), [entropy, varentropy, 1 - (top2[1] - top2[0])]])
    return float(1 / (1 + np.exp(-(((features - probe.mean) / probe.scale) @ probe.weights + probe.bias))))


def naive_probe_peek(ladder, prompt_ids, config, probe, max_tokens):
    """Every position: the small model on the whole prefix (no cache), its probe score, the rule."""
    small, large = (t.model.model for t in ladder.tiers)
    policy = PeekPolicy(config, 2)
    policy.start(None)
    ids, tokens, tried, scores = list(prompt_ids), [], [], []
    for _ in range(max_tokens):
        x = mx.array(ids)[None]
        hidden = small.model(x)[0, -1]
        logits = small(x)[0, -1]
        score = _naive_score(
            probe, np.asarray(hidden.astype(mx.float32)), np.asarray(logits.astype(mx.float32))
        )
        higher = policy.review(0, score)
        rungs = [0] if higher is None else [0, higher]
        if higher is not None:
            logits = large(x)[0, -1]
        token = int(mx.argmax(logits).item())
        ids.append(token)
        policy.commit(rungs[-1], score if higher is None else None)
        if token in ladder.tokenizer.eos_token_ids:
            break
        tokens.append(token)
        tried.append(rungs)
        scores.append(score)
    return tokens, tried, scores


def _run(ladder, prompt, config, max_tokens=24):
    session = ChatSession(ladder, config, GenerationSettings(max_tokens=max_tokens))
    events = [e for e in session.stream(prompt) if isinstance(e, TokenEvent)]
    return session, events


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("up,down,window,min_run", [(0.5, 0.5, 1, 1), (0.6, 0.35, 2, 3)])
def test_probe_routing_matches_the_naive_reference(ladder, prompt, up, down, window, min_run):
    split = split_model(ladder.tiers[0].model.model, "small")
    ladder.attach_probe(_probe(split.hidden_size))
    config = _config(up, down, window, min_run)
    session, events = _run(ladder, prompt, config)
    ids = session.render([{"role": "user", "content": prompt}])
    tokens, tried, scores = naive_probe_peek(ladder, ids, config, ladder.probe, 24)
    assert [e.id for e in events] == tokens
    assert [[0, 1] if e.tried else [e.rung] for e in events] == tried
    assert any(len(t) > 1 for t in tried) and any(len(t) == 1 for t in tried)
    # The records carry the bottom's score at every position; the tiers re-derive from them.
    values = [list(e.tried_signals) if e.tried else [e.signal] for e in events]
    assert np.allclose([v[0] for v in values], scores, rtol=0, atol=2e-5)
    assert derive_rungs(config, 2, None, values) == [e.rung for e in events]


def test_a_session_refuses_the_probe_signal_without_a_probe(tiny_pair):
    small, large = tiny_pair
    bare = pair_ladder(load_model(str(small)), load_model(str(large)))
    with pytest.raises(UsageError, match="needs the probe that `mlxswitch calibrate` trains"):
        ChatSession(bare, _config())


def test_a_probe_for_another_hidden_size_is_refused(ladder):
    with pytest.raises(UsageError, match="reads 5 hidden dimensions"):
        ladder.attach_probe(_probe(5))


# -- the CLI: missing probe, then a saved one loaded automatically ------------------------------


def test_chat_on_the_probe_loads_it_from_the_user_directory(tiny_pair, isolated_home, tmp_path):
    small, large = tiny_pair
    args = [
        "chat",
        "--small",
        str(small),
        "--large",
        str(large),
        "--json",
        "--policy",
        "peek",
        "--signal",
        "probe",
        "--tau",
        "0.5",
        "--tau-down",
        "0.5",
        "--window",
        "1",
        "--min-run",
        "1",
        "--max-tokens",
        "12",
    ]
    missing = CliRunner().invoke(app, args, input="Hello there\n")
    assert missing.exit_code != 0 and missing.stdout == ""
    assert missing.stderr.startswith("error: no probe is trained for profile 'ad-hoc pair'")
    assert missing.stderr.count("\n") == 1
    hidden = split_model(load_model(str(small)).model, "small").hidden_size
    path = probe_path("ad-hoc pair", (str(small), str(large)), ("small", "large"))
    _probe(hidden).save(path, {"test": True})
    telemetry = tmp_path / "t.jsonl"
    result = CliRunner().invoke(app, args + ["--telemetry", str(telemetry)], input="Hello there\n")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["router"]["signal"] == "probe"
    config = _config(0.5, 0.5)
    lines = [json.loads(line) for line in telemetry.read_text().splitlines()]
    for tokens in (record["tokens"], [r for r in lines if "index" in r]):
        tried = [
            [None if v is None else float(v) for _, v in t["tried"]] if "tried" in t else [float(t["signal"])]
            for t in tokens
        ]
        rungs = derive_rungs(config, 2, None, tried)
        assert [record["router"]["tiers"][r] for r in rungs] == [t["tier"] for t in tokens]
    assert any("tried" in t for t in record["tokens"]) and any("tried" not in t for t in record["tokens"])


def stepwise_probe_gears(model, split, prompt_ids, config, probe, max_tokens, eos):
    """One shared cache, no pipelining: each position at gear 4 first (body, then head), scored;
    an escalated position is trimmed and re-fed at gear 8."""
    from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

    policy = PeekPolicy(config, 2)
    cache = make_prompt_cache(model)
    model.gear_state.set(8)  # the prompt is prefilled at the top gear
    model(mx.array(prompt_ids[:-1])[None], cache=cache)
    last = prompt_ids[-1]
    policy.start(None)
    tokens, tried, scores = [], [], []
    for _ in range(max_tokens):
        model.gear_state.set(4)
        hidden = split.body(mx.array([last])[None], cache=cache)[0, -1]
        logits = split.head(hidden)
        score = _naive_score(
            probe, np.asarray(hidden.astype(mx.float32)), np.asarray(logits.astype(mx.float32))
        )
        higher = policy.review(0, score)
        if higher is not None:
            trim_prompt_cache(cache, 1)  # this position's K/V comes from the gear that redoes it
            model.gear_state.set(8)
            logits = model(mx.array([last])[None], cache=cache)[0, -1]
        last = int(mx.argmax(logits).item())
        policy.commit(1 if higher else 0, None if higher else score)
        if last in eos:
            break
        tokens.append(last)
        tried.append([0, 1] if higher else [0])
        scores.append(score)
    return tokens, tried, scores


def test_probe_routing_on_shared_gears_matches_the_stepwise_reference(tiny_gears_4_8):
    from mlxswitch.decoding.tiers import gear_ladder

    loaded = tiny_gears_4_8
    ladder = gear_ladder(loaded, [4, 8])
    ladder.attach_probe(_probe(loaded.model.args.hidden_size, seed=5))
    config = _config(0.5, 0.4, window=2, min_run=2)
    prompt = "The quick brown fox"
    session, events = _run(ladder, prompt, config)
    ids = session.render([{"role": "user", "content": prompt}])
    tokens, tried, scores = stepwise_probe_gears(
        loaded.model, ladder.bottom_split(), ids, config, ladder.probe, 24, ladder.tokenizer.eos_token_ids
    )
    assert [e.id for e in events] == tokens
    assert [[0, 1] if e.tried else [e.rung] for e in events] == tried
    assert any(len(t) > 1 for t in tried) and any(len(t) == 1 for t in tried)
    assert np.allclose([(e.tried_signals or (e.signal,))[0] for e in events], scores, rtol=0, atol=2e-5)


def test_calibrate_saves_the_probe_that_a_probe_profile_then_routes_on(tiny_pair, isolated_home):
    small, large = tiny_pair
    (isolated_home / "models.toml").write_text(
        f'[profiles.tiny]\nmode = "pair"\nsmall = "{small}"\nlarge = "{large}"\n'
        'policy = "peek"\nsignal = "probe"\nup = [0.5]\nwindow = 1\nmin_run = 1\n'
    )
    before = CliRunner().invoke(
        app, ["chat", "--profile", "tiny", "--json", "--max-tokens", "8"], input="Hi\n"
    )
    assert before.exit_code != 0 and "no probe is trained for profile 'tiny'" in before.stderr
    # Calibrating a profile that routes on the probe does not need one: it trains it.
    calibrated = CliRunner().invoke(
        app, ["calibrate", "--profile", "tiny", "--target-share", "0.3", "--quick", "--max-tokens", "24"]
    )
    assert calibrated.exit_code == 0, calibrated.stderr
    assert "best on probe" in calibrated.stdout, calibrated.stdout
    after = CliRunner().invoke(
        app, ["chat", "--profile", "tiny", "--json", "--max-tokens", "8"], input="Hi\n"
    )
    assert after.exit_code == 0, after.stderr
    record = json.loads(after.stdout)
    assert record["router"]["signal"] == "probe" and 0 <= record["router"]["initial_signal"] <= 1


def test_a_model_whose_logits_are_not_its_heads_output_has_no_split(ladder):
    # e.g. Gemma 2's soft-capped logits: the checked split refuses it (one position suffices)
    model = ladder.tiers[0].model.model
    split = split_model(model, "small")
    body, head = split.body, split.head

    class Capped:
        def __init__(self):
            self.model, self.lm_head = body, head

        def __call__(self, inputs, cache=None):
            return mx.tanh(head(body(inputs, cache=cache)) / 3.0) * 3.0

    with pytest.raises(UsageError, match="gives no hidden state the probe can read"):
        split_model(Capped(), "capped")
