"""The token loop's pipelining throws nothing away: the policy says when its next rung is certain,
and a step queued before the decision is never re-fed or rolled back on a pair."""

from __future__ import annotations

import copy
import random

import pytest

from mlxswitch.decoding.answer import TokenEvent
from mlxswitch.decoding.mode import DecodingMode
from mlxswitch.decoding.session import ChatSession, GenerationSettings
from mlxswitch.decoding.tiers import gear_ladder, pair_ladder
from mlxswitch.models.sources import load_model
from mlxswitch.routing.policies import EadPolicy, PeekPolicy
from mlxswitch.routing.router import RouterConfig

VOCAB = 49152  # log2 V ≈ 15.6 bits: the guard's hot entropies (≥ 0.9 log2 V) lie in the grid below
GRID = (0.0, 0.05, 0.3, 0.7, 1.0, 1.4, 2.0, 3.5, 6.0, 10.0, 14.5, 15.5)


def _configs(rng: random.Random, policy: str) -> list[tuple[RouterConfig, int]]:
    out = []
    for _ in range(40):
        tiers = rng.choice((2, 3))
        up = sorted(rng.uniform(0.2, 3.0) for _ in range(tiers - 1))
        down = tuple(u * rng.uniform(0.2, 1.0) for u in up)
        top_local = rng.choice((None, tiers - 2)) if tiers == 3 else None
        signal = "probe" if policy == "peek" and rng.random() < 0.3 else "entropy"
        if signal == "probe":
            up = sorted(rng.uniform(0.05, 0.95) for _ in range(tiers - 1))
            down = tuple(u * rng.uniform(0.2, 1.0) for u in up)
        config = RouterConfig(
            up=tuple(up),
            down=down,
            window=rng.choice((1, 2, 4)),
            min_run=rng.choice((1, 2, 3, 5)),
            policy=policy,
            signal=signal,
            guard_count=rng.choice((1, 2, 3)),
            vocab_size=VOCAB,
            top_local=top_local,
        )
        out.append((config, tiers))
    return out


@pytest.mark.parametrize("policy_class", [PeekPolicy, EadPolicy])
def test_a_certain_next_rung_is_the_one_every_value_commits_to(policy_class):
    """Walked over random values: where certain_next names a rung, commit names it for every value
    of the grid; where it names none, the grid reaches more than one rung at least sometimes."""
    rng = random.Random(7)
    certain, uncertain, split = 0, 0, 0
    for config, tiers in _configs(rng, policy_class.name):
        policy = policy_class(config, tiers)
        grid = [min(v, 1.0) for v in GRID] if config.signal == "probe" else list(GRID)
        rung = policy.start(rng.choice(grid)).rung
        for _ in range(60):
            if rung >= tiers - 1 and config.top_local is not None and rung > config.top_local:
                rung = policy.resume(config.top_local).rung  # the cloud span, as the loop does
            while policy.may_review(rung):
                higher = policy.review(rung, rng.choice(grid))
                if higher is None:
                    break
                rung = higher
            named = policy.certain_next(rung)
            reached = {copy.deepcopy(policy).commit(rung, value).rung for value in grid}
            if named is None:
                uncertain += 1
                split += len(reached) > 1
            else:
                certain += 1
                assert reached == {named}, (config, rung, named, reached)
            rung = policy.commit(rung, rng.choice(grid)).rung
    assert certain > 200 and uncertain > 200 and split > 50


@pytest.fixture(scope="module")
def pair(tiny_pair):
    return [load_model(str(path)) for path in tiny_pair]


@pytest.fixture(params=["auto", "mx"])
def route(request):
    """Both loops: the CPU's NumPy route (a step computes as it is built: none is queued ahead)
    and lazy passes (MLX ops forced, a Mac's route: the next step is queued before the read)."""
    from mlxswitch.kernels.route import kernels_override

    with kernels_override(request.param) as chosen:
        yield chosen


def _count_body_rows(monkeypatch, models) -> dict[int, int]:
    """Rows through each model's body (keyed by the body's id), every pass counted."""
    rows: dict[int, int] = {}
    for body_class in {type(m.model.model) for m in models}:
        real = body_class.__call__

        def counted(self, x, *args, _real=real, **kwargs):
            rows[id(self)] = rows.get(id(self), 0) + x.shape[1]
            return _real(self, x, *args, **kwargs)

        monkeypatch.setattr(body_class, "__call__", counted)
    return rows


@pytest.mark.parametrize(
    "config",
    [
        # Without lookup: its drafts and a review's guessed row feed ids that may be dropped, by
        # design (tests/test_loop_lookup.py checks those).
        RouterConfig(up=(1.5,), down=(1.0,), window=1, min_run=1, policy="peek"),
        RouterConfig(up=(1.2,), down=(0.8,), window=2, min_run=3, policy="peek"),
        RouterConfig(up=(1.5,), down=(1.0,), window=3, min_run=2),
        RouterConfig(up=(1.0,), down=(0.5,), window=2, min_run=1),
    ],
)
def test_on_a_switching_pair_no_model_is_fed_an_id_twice(pair, config, monkeypatch, route):
    """Each model's body sees each id once: a step queued on one model before the policy moved to
    the other stands as the first model's catch-up, nothing is rolled back and fed again."""
    ladder = pair_ladder(*pair)
    for group in ladder.groups:
        group.checked_split()  # the split's one-time check runs a pass of its own
    rows = _count_body_rows(monkeypatch, pair)
    session = ChatSession(
        ladder, config, GenerationSettings(max_tokens=32), decoding=DecodingMode(lookup=False)
    )
    events = [e for e in session.stream("What is the capital of France?") if isinstance(e, TokenEvent)]
    tiers = [e.rung for e in events]
    assert any(a != b for a, b in zip(tiers, tiers[1:], strict=False))  # the policy moved
    for group in ladder.groups:
        assert rows[id(group.model.model.model)] == group.seen, group.name


def test_on_shared_gears_only_a_recomputed_position_is_fed_again(tiny_gears_4_8, monkeypatch, route):
    """Gears share one cache, where a step queued at one gear is void at another: the loop queues
    there only where the next gear is certain, so the one id fed twice is each escalation's."""
    loaded = tiny_gears_4_8
    config = RouterConfig(up=(1.2,), down=(0.8,), window=1, min_run=1, policy="peek", vocab_size=VOCAB)
    ladder = gear_ladder(loaded, [4, 8])
    ladder.groups[0].checked_split()
    rows = _count_body_rows(monkeypatch, [loaded])
    session = ChatSession(ladder, config, GenerationSettings(max_tokens=24))
    events = [e for e in session.stream("The quick brown fox") if isinstance(e, TokenEvent)]
    escalated = sum(len(e.tried) > 1 for e in events)
    assert escalated and escalated < len(events)
    group = ladder.groups[0]
    assert rows[id(loaded.model.model)] == group.seen + escalated


def test_a_token_is_yielded_before_the_next_step_is_built_where_steps_compute_as_built(
    pair, monkeypatch, route
):
    """On the NumPy route building a step computes it, so the loop yields the token first (the
    first one right after the prefill); on lazy passes the next step is already queued then."""
    import mlx.core as mx

    from mlxswitch.decoding.loop import TokenLoop
    from mlxswitch.decoding.tiers import single_model_ladder
    from mlxswitch.routing.policies import make_policy

    ladder = single_model_ladder(pair[1])
    ladder.groups[0].checked_split()
    rows = _count_body_rows(monkeypatch, [pair[1]])
    prompt = [5, 6, 7, 8, 9, 10]
    loop = TokenLoop(
        ladder, list(prompt), make_policy(RouterConfig(up=()), 1), lambda x: mx.argmax(x, axis=-1)
    )
    fed_at_each_token = [rows[id(pair[1].model.model)] - len(prompt) for _ in loop.steps(4)]
    ahead = 0 if route.numpy_allowed else 1
    assert fed_at_each_token == [i + ahead for i in range(3)] + [3]  # nothing queued past the budget


def test_a_model_continuing_its_own_answer_catches_up_on_nothing(pair, tiny_gears_4_8, route):
    """Fed the token it just made, a model is not catching up, whether that step was queued
    ahead or built after the token was yielded: every decode pass is one row."""
    from mlxswitch.decoding.tiers import single_model_ladder

    settings = GenerationSettings(max_tokens=12)
    for ladder, config in (
        (single_model_ladder(pair[1]), RouterConfig(up=())),
        (pair_ladder(*pair), RouterConfig(up=(-float("inf"),))),
        (gear_ladder(tiny_gears_4_8, [4, 8]), RouterConfig(up=(float("inf"),))),
    ):
        session = ChatSession(ladder, config, settings)
        session.ask("Count: one two three")
        summary = session.last_summary
        assert set(summary.catch_up_tokens.values()) == {0}
        decode = {k for k in summary.passes if k != "rest_s" and not k.endswith("prefill")}
        assert decode and all(k.endswith(" 1") for k in decode), summary.passes


def _entropies(session: ChatSession, prompt: str) -> list[float | None]:
    return [e.entropy for e in session.stream(prompt) if isinstance(e, TokenEvent)]


def test_signals_are_measured_only_where_a_router_reads_them(pair, monkeypatch):
    """A single model decodes as plain decoding does: no signals computed, entropy None; asked for
    (the bench's records, --shade), they are the same numbers a routed loop measures."""
    import mlxswitch.decoding.positions as positions
    from mlxswitch.decoding.tiers import single_model_ladder

    calls = []
    real = positions.read_time_signals
    monkeypatch.setattr(positions, "read_time_signals", lambda logits: calls.append(1) or real(logits))
    settings = GenerationSettings(max_tokens=8)
    plain = ChatSession(single_model_ladder(pair[1]), RouterConfig(up=()), settings)
    assert _entropies(plain, "Count: one two three") == [None] * 8 and not calls
    assert plain.last_summary.initial_entropy is None

    plain = ChatSession(single_model_ladder(pair[1]), RouterConfig(up=()), settings, measure_signals=True)
    measured = _entropies(plain, "Count: one two three")
    assert len(calls) >= 8 and all(h is not None and h > 0 for h in measured)
    # The large model pinned in a pair (its "alone" arm) measures the same numbers when asked.
    forced = RouterConfig(up=(-float("inf"),))
    pinned = ChatSession(pair_ladder(*pair), forced, settings)
    assert _entropies(pinned, "Count: one two three") == [None] * 8
    pinned = ChatSession(pair_ladder(*pair), forced, settings, measure_signals=True)
    assert _entropies(pinned, "Count: one two three") == pytest.approx(measured, abs=1e-4)
    routed = ChatSession(pair_ladder(*pair), RouterConfig(up=(1.5,), down=(1.0,)), settings)
    assert all(h is not None for h in _entropies(routed, "Count: one two three"))
