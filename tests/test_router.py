"""Router decisions on hand-made entropy sequences: the contract the telemetry re-derives from."""

from __future__ import annotations

import math
import random

import pytest

from mlxswitch.errors import UsageError
from mlxswitch.routing.router import Decision, Router, RouterConfig, derive_tiers, parse_thresholds, replay

INF = math.inf
NAN = math.nan


def tiers(up, entropies, h0=0.0, down=None, window=1, min_run=1, num=2, **kw):
    config = RouterConfig(
        up=tuple(up), down=None if down is None else tuple(down), window=window, min_run=min_run, **kw
    )
    return derive_tiers(h0, entropies, config, num)


# -- thresholds, window, min run ------------------------------------------------------------


def test_plus_infinity_stays_at_the_bottom_minus_infinity_at_the_top():
    noisy = [0.0, 9.0, 3.0, 12.0, 0.1] * 4
    assert set(tiers([INF], noisy, h0=50.0)) == {0}
    assert set(tiers([INF, INF], noisy, h0=50.0, num=3, window=3, min_run=2)) == {0}
    assert set(tiers([-INF], noisy, h0=0.0)) == {1}
    assert set(tiers([-INF, -INF], noisy, num=3, window=5, min_run=10)) == {2}  # from token 0


def test_start_climbs_several_rungs_from_the_prompt_entropy():
    config = RouterConfig(up=(1.0, 2.0))
    assert [Router(config, 3).start(h).rung for h in (0.5, 1.0, 1.5, 2.5)] == [0, 0, 1, 2]
    climbed = Router(config, 3).start(2.5)
    assert climbed.moved == 2 and not climbed.guard and climbed.mean == 2.5


def test_window_and_min_run_place_the_switches_exactly():
    # window 3, min run 2, up 1.0, down 0.5. W starts [0]; tier of token k+1 follows token k.
    # tok0 H=0: W=[0,0] c=1 → stay 0.  tok1 H=3: W=[0,0,3] mean 1.0, c=2 → not > 1.0, stay.
    # tok2 H=3: W=[0,3,3] mean 2.0 > 1.0, c=3 → up (c=0).  tok3 H=0: W=[3,3,0] c=1 < 2 → stay 1.
    # tok4 H=0: W=[3,0,0] mean 1.0, c=2 → not < 0.5, stay.  tok5 H=0: mean 0 < 0.5 → down.
    got = tiers([1.0], [0, 3, 3, 0, 0, 0, 0], down=[0.5], window=3, min_run=2)
    assert got == [0, 0, 0, 1, 1, 1, 0, 0]


def test_ead_defaults_place_the_switches_exactly():
    # window 5, min run 10, up 1.0, down 0.5, H0 = 0. Tokens 0-11 at 0 bits: mean 0, c reaches 12.
    # tok12 H=2: W=[0,0,0,0,2] mean 0.4.  tok13: mean 0.8.  tok14: W=[0,0,2,2,2] mean 1.2 > 1.0
    # → up: token 15 is the first on tier 1. Then 0 bits: the mean is below 0.5 from tok18
    # (W=[2,0,0,0,0] 0.4) but c counts 1..10 over tok15..tok24 → down after tok24: token 25.
    entropies = [0.0] * 12 + [2.0] * 3 + [0.0] * 12
    got = derive_tiers(0.0, entropies, RouterConfig(up=(1.0,), down=(0.5,)), 2)
    assert got == [0] * 15 + [1] * 10 + [0] * 3


def test_min_run_delays_every_move():
    # Min run 4: even a huge entropy waits until the tier made 4 tokens.
    assert tiers([1.0], [9, 9, 9, 9, 9], min_run=4) == [0, 0, 0, 0, 1, 1]


def test_hysteresis_band_holds_both_ways():
    # Means between down (0.5) and up (2.0), the ends included, never move the router.
    band = [1.0, 1.9, 0.6, 1.5, 0.5, 2.0] * 5
    assert set(tiers([2.0], band, h0=0.0, down=[0.5])) == {0}
    assert set(tiers([2.0], band, h0=5.0, down=[0.5])) == {1}


def test_default_down_is_sixty_percent_of_a_positive_up():
    assert RouterConfig(up=(2.0, 0.5)).downs() == pytest.approx((1.2, 0.3))
    # Infinite or non-positive up keeps itself (0.6 x a negative up would exceed it).
    assert RouterConfig(up=(INF, -INF, -1.0, 0.0)).downs() == (INF, -INF, -1.0, 0.0)
    assert RouterConfig(up=(2.0,), down=(2.0,)).downs() == (2.0,)  # explicit: no band
    # up 1.0 → down 0.6: 0.7 holds the top tier, 0.5 brings it down.
    assert tiers([1.0], [0.7, 0.7, 0.5], h0=5.0) == [1, 1, 1, 0]


def test_one_rung_per_decision_on_three_tiers():
    # window 1, min run 1: 9 bits is above both ups, 0 below both downs; still one rung a token.
    config = RouterConfig(up=(1.0, 2.0), down=(0.5, 1.5), window=1, min_run=1)
    decisions = replay(0.0, [9, 9, 9, 0, 0, 0], config, 3)
    assert [d.rung for d in decisions] == [0, 1, 2, 2, 1, 0, 0]
    assert [d.moved for d in decisions] == [0, 1, 1, 0, -1, -1, 0]


def test_normalisation_compares_fractions_of_log2_v():
    v = 1024  # log2 V = 10 bits
    # 3 bits = 0.3 of the maximum: above an up threshold of 0.25, below 0.35.
    assert tiers([0.25], [3.0, 3.0], normalize=True, vocab_size=v)[-1] == 1
    assert tiers([0.35], [3.0, 3.0], normalize=True, vocab_size=v)[-1] == 0
    router = Router(RouterConfig(up=(0.25,), window=2, normalize=True, vocab_size=v), 2)
    assert router.start(2.0).mean == pytest.approx(0.2)  # the window holds fractions
    assert router.observe(4.0).mean == pytest.approx(0.3)


# -- catastrophic guard -----------------------------------------------------------------------


def test_guard_jumps_to_the_top_after_two_near_maximal_tokens_only():
    v = 1024  # guard above 9 bits (90% of 10)
    router = Router(RouterConfig(up=(INF, INF), min_run=50, vocab_size=v), 3)
    router.start(9.9)  # H0 never starts a streak: token 0 is sampled from that distribution
    first = router.observe(9.5)
    assert first.rung == 0 and not first.guard  # one is not enough
    second = router.observe(9.6)
    assert second.rung == 2 and second.guard and second.moved == 2  # ignores min run
    assert router.count == 0
    calm = router.observe(9.6)
    assert calm.rung == 2 and not calm.guard and calm.moved == 0


def test_guard_threshold_is_strict_and_its_count_configurable():
    exactly = Router(RouterConfig(up=(INF,), min_run=50, vocab_size=1024), 2)
    exactly.start(0.0)
    assert [exactly.observe(9.0).rung for _ in range(4)] == [0, 0, 0, 0]  # 9.0 is not above 90%
    three = Router(RouterConfig(up=(INF,), min_run=50, vocab_size=1024, guard_count=3), 2)
    three.start(0.0)
    assert [three.observe(9.5).guard for _ in range(3)] == [False, False, True]


def test_guard_streak_is_broken_by_a_normal_token():
    router = Router(RouterConfig(up=(INF,), min_run=50, vocab_size=1024), 2)
    router.start(0.0)
    assert [router.observe(h).rung for h in (9.5, 1.0, 9.5, 1.0)] == [0, 0, 0, 0]


def test_guard_needs_the_vocabulary_except_for_nan():
    router = Router(RouterConfig(up=(INF,), min_run=50), 2)
    router.start(0.0)
    assert [router.observe(1e9).rung for _ in range(3)] == [0, 0, 0]
    assert router.observe(NAN).guard


def test_guard_is_marked_on_the_decision_that_makes_the_next_token():
    # min run 3, window 1, up 1.0 (down 0.6): two hot tokens jump at once; the guarded tier
    # then needs its own min run before the calm tokens bring it down after tok4.
    config = RouterConfig(up=(1.0,), window=1, min_run=3, vocab_size=1024)
    decisions = replay(0.0, [9.5, 9.5, 0.0, 0.0, 0.0], config, 2)
    assert [d.rung for d in decisions] == [0, 0, 1, 1, 1, 0]
    assert [d.guard for d in decisions] == [False, False, True, False, False, False]


def test_nan_fires_the_guard_at_once_and_never_enters_the_mean():
    router = Router(RouterConfig(up=(INF,), window=3, min_run=50), 2)
    router.start(1.0)
    decision = router.observe(NAN)
    assert decision.guard and decision.rung == 1 and decision.moved == 1
    assert router.mean == 1.0 and decision.mean == 1.0  # W still holds only real entropies
    assert router.observe(4.0).mean == 2.5  # W = [1, 4]: the NaN left no trace
    assert math.isfinite(router.observe(INF).mean)  # inf is treated as NaN, not averaged


def test_nan_counts_toward_min_run():
    # window 2, min run 2, up 1.0 (down 0.6). Start W=[3] → rung 1. NaN: c=1. 0.0: c=2,
    # W=[3,0] mean 1.5 → stay. 0.0: c=3, W=[0,0] → down.
    assert tiers([1.0], [NAN, 0.0, 0.0], h0=3.0, window=2, min_run=2) == [1, 1, 1, 0]


def test_nan_at_the_prompt_starts_on_the_top_local_tier():
    router = Router(RouterConfig(up=(INF, INF), top_local=1), 3)
    decision = router.start(NAN)
    assert (decision.rung, decision.moved, decision.guard) == (1, 1, True)
    assert math.isnan(router.mean)
    assert router.observe(2.0).mean == 2.0


def test_guard_respects_top_local_below_a_cloud_rung():
    router = Router(RouterConfig(up=(INF, INF), min_run=50, vocab_size=1024, top_local=1), 3)
    router.start(0.0)
    assert router.observe(NAN).rung == 1
    # On the cloud rung the guard never moves down.
    cloud = Router(RouterConfig(up=(0.5, 1.0), min_run=1, window=1, top_local=1), 3)
    assert cloud.start(5.0).rung == 2
    assert [(d.rung, d.guard) for d in map(cloud.observe, (NAN, NAN, None))] == [(2, False)] * 3


# -- no entropy (cloud tokens) ------------------------------------------------------------------


def test_missing_entropy_counts_toward_min_run_but_not_the_window():
    router = Router(RouterConfig(up=(1.0,), down=(0.5,), window=2, min_run=3), 2)
    router.start(5.0)  # climbs at start: rung 1, c = 0
    assert router.rung == 1
    router.observe(None)
    router.observe(None)
    assert router.mean == 5.0 and router.count == 2
    assert router.observe(0.0).rung == 1  # c = 3 now, mean of [5, 0] = 2.5: stays up
    assert router.observe(0.0).rung == 0  # mean of [0, 0]


def test_missing_entropy_lets_a_move_happen_on_the_next_real_one():
    # min run 3, window 2: None, None, then 5 bits: c = 3, W = [0, 5], mean 2.5 > 1 → up.
    assert tiers([1.0], [None, None, 5.0], window=2, min_run=3) == [0, 0, 0, 1]


def test_missing_entropy_breaks_a_guard_streak():
    router = Router(RouterConfig(up=(INF,), min_run=50, vocab_size=1024), 2)
    router.start(0.0)
    assert [router.observe(h).guard for h in (9.5, None, 9.5, 9.5)] == [False, False, False, True]


def test_cloud_rung_holds_while_no_entropy_arrives():
    config = RouterConfig(up=(0.5, 1.0), min_run=2, window=3, top_local=1)
    assert set(derive_tiers(5.0, [None] * 30, config, 3)) == {2}


# -- state ----------------------------------------------------------------------------------


def test_start_resets_a_used_router():
    config = RouterConfig(up=(1.0,), window=2, min_run=1)
    router = Router(config, 2)
    router.start(5.0)
    router.observe(5.0)
    assert router.start(0.0) == Decision(0, 0, False, 0.0)
    assert router.count == 0 and router.mean == 0.0


def test_derive_tiers_equals_the_live_decisions():
    config = RouterConfig(up=(1.0, 2.0), down=(0.5, 1.5), window=2, min_run=2, vocab_size=1024)
    entropies = [0.0, 3.0, 3.0, 3.0, 3.0, 0.0, 0.0, 0.0, 9.5, 9.6, 0.0, NAN, None, 0.0]
    router = Router(config, 3)
    live = [router.start(0.3).rung] + [router.observe(h).rung for h in entropies]
    assert derive_tiers(0.3, entropies, config, 3) == live
    assert len(live) == len(entropies) + 1 and len(set(live)) == 3


# -- property: the live router, its replay and a naive reference agree -------------------------


def _reference(h0, entropies, config: RouterConfig, num):
    """The module docstring's contract, recomputed from the whole history at every step."""
    top = num - 1
    top_local = top if config.top_local is None else config.top_local
    downs = config.down if config.down is not None else tuple(min(u, 0.6 * u) for u in config.up)
    log2v = math.log2(config.vocab_size) if config.vocab_size else None
    units = (lambda h: h / log2v) if config.normalize else (lambda h: h)
    limit = config.guard_fraction * log2v if log2v else INF
    hot = lambda h: h is not None and (not math.isfinite(h) or h > limit)
    kept: list[float] = []

    def mean():
        w = kept[-config.window :]
        return math.fsum(w) / len(w) if w else NAN

    out = []
    r = c = 0
    if h0 is not None and not math.isfinite(h0):
        r = max(r, top_local)
    else:
        if h0 is not None:
            kept.append(units(h0))
        while r < top and mean() > config.up[r]:
            r += 1
    out.append((r, mean()))
    for k, h in enumerate(entropies):
        c += 1
        if h is not None and math.isfinite(h):
            kept.append(units(h))
        streak = 0
        while streak <= k and hot(entropies[k - streak]):
            streak += 1
        broken = h is not None and not math.isfinite(h)
        if (broken or streak >= config.guard_count) and r < top_local:
            r, c = top_local, 0
        elif c >= config.min_run:
            if r < top and mean() > config.up[r]:
                r, c = r + 1, 0
            elif r > 0 and mean() < downs[r - 1]:
                r, c = r - 1, 0
        out.append((r, mean()))
    return out


def _random_case(rng: random.Random):
    num = rng.choice([2, 3, 4])
    normalize = rng.random() < 0.3
    scale = 1.0 / 6.0 if normalize else 1.0  # log2 V = 6 bits for V = 64
    up = sorted(
        rng.choice([rng.uniform(0, 4) * scale, INF, -INF])
        if rng.random() < 0.1
        else rng.uniform(0, 4) * scale
        for _ in range(num - 1)
    )
    down = (
        None
        if rng.random() < 0.3
        else tuple(u * rng.uniform(0.3, 1.0) if math.isfinite(u) else u for u in up)
    )
    config = RouterConfig(
        up=tuple(up),
        down=down,
        window=rng.randint(1, 6),
        min_run=rng.randint(1, 8),
        normalize=normalize,
        vocab_size=64 if normalize or rng.random() < 0.7 else None,
        guard_count=rng.randint(1, 3),
        top_local=rng.choice([None, rng.randint(0, num - 1)]),
    )

    def entropy():
        return rng.choice([rng.uniform(0, 6), rng.uniform(0, 2), 5.8, NAN, None, INF])

    h0 = entropy() if rng.random() < 0.2 else rng.uniform(0, 4)
    return config, num, h0, [entropy() for _ in range(80)]


def test_random_sequences_replay_and_respect_min_run():
    rng = random.Random(7)
    for _ in range(400):
        config, num, h0, entropies = _random_case(rng)
        router = Router(config, num)
        first = router.start(h0)
        live = [first]
        run = 0
        for h in entropies:
            decision = router.observe(h)
            run += 1
            if decision.guard:
                assert decision.rung == router.top_local and decision.moved > 0
            elif decision.moved:
                assert run >= config.min_run and abs(decision.moved) == 1
            if decision.moved:
                run = 0
            assert router.count == run
            live.append(decision)
        assert derive_tiers(h0, entropies, config, num) == [d.rung for d in live]
        replayed = replay(h0, entropies, config, num)
        assert [(d.rung, d.moved, d.guard) for d in replayed] == [(d.rung, d.moved, d.guard) for d in live]
        reference = _reference(h0, entropies, config, num)
        assert [d.rung for d in live] == [r for r, _ in reference]
        for d, e, (_, m) in zip(live, replayed, reference, strict=True):
            assert _same(d.mean, m) and _same(d.mean, e.mean)


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


# -- validation and parsing -------------------------------------------------------------------


@pytest.mark.parametrize(
    "build,num,message",
    [
        (lambda: RouterConfig(up=(1.0,)), 3, "3 tiers need 2 up threshold(s), got 1"),
        (lambda: RouterConfig(up=(1.0,)), 1, "single tier"),
        (lambda: RouterConfig(up=(1.0, 2.0), down=(0.5,)), 3, "need 2 down threshold(s), got 1"),
        (lambda: RouterConfig(up=(1.0,), down=(2.0,)), 2, "down threshold 2 exceeds up threshold 1"),
        (lambda: RouterConfig(up=(NAN,)), 2, "cannot be NaN"),
        (lambda: RouterConfig(up=(1.0,), window=0), 2, "window must be at least 1"),
        (lambda: RouterConfig(up=(1.0,), min_run=0), 2, "min run must be at least 1"),
        (lambda: RouterConfig(up=(0.1,), normalize=True), 2, "need the vocabulary size"),
        (lambda: RouterConfig(up=(1.0,), vocab_size=1), 2, "vocabulary size must be at least 2"),
        (lambda: RouterConfig(up=(1.0,), guard_fraction=0.0), 2, "guard fraction"),
        (lambda: RouterConfig(up=(1.0,), guard_count=0), 2, "guard count"),
        (lambda: RouterConfig(up=(1.0,), top_local=2), 2, "top local tier must be between 0 and 1"),
        (lambda: RouterConfig(up=(2.0,), normalize=True, vocab_size=1024), 2, "between 0 and 1; got 2"),
    ],
)
def test_validation_messages(build, num, message):
    # Intrinsic rules fire when the config is built; the ladder's shape in validate(); the
    # vocabulary only the router needs. Whichever fires, the text is the rule's one text.
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        Router(build(), num)
    assert "\n" not in str(err.value)


def test_valid_edge_configs_pass():
    RouterConfig(up=()).validate(1)  # a single tier routes nothing
    RouterConfig(up=(1.0,), down=(1.0,), window=1, min_run=1, top_local=0).validate(2)


def test_parse_thresholds():
    assert parse_thresholds("0.5, 1.25") == (0.5, 1.25)
    assert parse_thresholds("inf") == (INF,) and parse_thresholds("-inf") == (-INF,)
    assert parse_thresholds("-inf,inf") == (-INF, INF)
    for junk in ("0.5,abc", "", "0.5,,1", "1,", "0.5 1"):
        with pytest.raises(UsageError, match="comma-separated numbers"):
            parse_thresholds(junk)
    with pytest.raises(UsageError, match="NaN"):
        parse_thresholds("nan")
