"""Router decisions on hand-made entropy sequences: the contract the telemetry re-derives from."""

from __future__ import annotations

import math
import random

import pytest

from mlxswitch.errors import UsageError
from mlxswitch.router import Router, RouterConfig, derive_tiers, parse_thresholds

INF = math.inf


def tiers(up, entropies, h0=0.0, down=None, window=1, min_run=1, num=2, **kw):
    config = RouterConfig(up=tuple(up), down=None if down is None else tuple(down), window=window,
                          min_run=min_run, **kw)
    return derive_tiers(h0, entropies, config, num)


def test_plus_infinity_stays_at_the_bottom_minus_infinity_at_the_top():
    noisy = [0.0, 9.0, 3.0, 12.0, 0.1] * 4
    assert set(tiers([INF], noisy, h0=50.0)) == {0}
    assert set(tiers([-INF], noisy, h0=0.0)) == {1}
    assert set(tiers([-INF, -INF], noisy, num=3)) == {2}


def test_start_climbs_from_the_prompt_entropy():
    assert tiers([1.0, 2.0], [], h0=0.5, num=3) == [0]
    assert tiers([1.0, 2.0], [], h0=1.5, num=3) == [1]
    assert tiers([1.0, 2.0], [], h0=2.5, num=3) == [2]  # several rungs at once, only at start


def test_window_and_min_run_place_the_switches_exactly():
    # window 3, min run 2, up 1.0, down 0.5. W starts [0]; tier of token k+1 follows token k.
    # tok0 H=0: W=[0,0] c=1 → stay 0.  tok1 H=3: W=[0,0,3] mean 1.0, c=2 → not > 1.0, stay.
    # tok2 H=3: W=[0,3,3] mean 2.0 > 1.0, c=3 → up (c=0).  tok3 H=0: W=[3,3,0] c=1 < 2 → stay 1.
    # tok4 H=0: W=[3,0,0] mean 1.0, c=2 → not < 0.5, stay.  tok5 H=0: mean 0 < 0.5 → down.
    got = tiers([1.0], [0, 3, 3, 0, 0, 0, 0], down=[0.5], window=3, min_run=2)
    assert got == [0, 0, 0, 1, 1, 1, 0, 0]


def test_hysteresis_band_holds_both_ways():
    # Entropies between down (0.5) and up (2.0) never move the router, whichever tier it is on.
    band = [1.0, 1.9, 0.6, 1.5] * 5
    assert set(tiers([2.0], band, h0=0.0, down=[0.5])) == {0}
    assert set(tiers([2.0], band, h0=5.0, down=[0.5])) == {1}


def test_min_run_delays_every_move():
    # Min run 4: even a huge entropy waits until the tier made 4 tokens.
    got = tiers([1.0], [9, 9, 9, 9, 9], min_run=4)
    assert got == [0, 0, 0, 0, 1, 1]


def test_one_rung_per_decision_on_three_tiers():
    got = tiers([1.0, 2.0], [9, 9, 9, 0, 0, 0], down=[0.5, 1.5], num=3)
    assert got == [0, 1, 2, 2, 1, 0, 0]


def test_normalisation_compares_fractions_of_log2_v():
    v = 1024  # log2 V = 10 bits
    # 3 bits = 0.3 of the maximum: above an up threshold of 0.25, below 0.35.
    assert tiers([0.25], [3.0, 3.0], normalize=True, vocab_size=v)[-1] == 1
    assert tiers([0.35], [3.0, 3.0], normalize=True, vocab_size=v)[-1] == 0


def test_guard_jumps_to_the_top_after_two_near_maximal_tokens_only():
    v = 1024  # guard above 9 bits (90% of 10)
    config = RouterConfig(up=(INF, INF), min_run=50, vocab_size=v)
    router = Router(config, 3)
    router.start(0.0)
    first = router.observe(9.5)
    assert first.rung == 0 and not first.guard  # one is not enough
    second = router.observe(9.6)
    assert second.rung == 2 and second.guard and second.moved == 2  # ignores min run
    calm = router.observe(9.6)
    assert calm.rung == 2 and not calm.guard


def test_guard_streak_is_broken_by_a_normal_token():
    router = Router(RouterConfig(up=(INF,), min_run=50, vocab_size=1024), 2)
    router.start(0.0)
    assert [router.observe(h).rung for h in (9.5, 1.0, 9.5, 1.0)] == [0, 0, 0, 0]


def test_nan_triggers_the_guard_and_never_enters_the_mean():
    router = Router(RouterConfig(up=(INF,), window=3, min_run=50), 2)
    router.start(1.0)
    decision = router.observe(float("nan"))
    assert decision.guard and decision.rung == 1
    assert router.mean == 1.0  # the window still holds only real entropies


def test_guard_respects_top_local_below_a_cloud_rung():
    router = Router(RouterConfig(up=(INF, INF), min_run=50, vocab_size=1024, top_local=1), 3)
    router.start(0.0)
    assert router.observe(float("nan")).rung == 1


def test_missing_entropy_counts_toward_min_run_but_not_the_window():
    router = Router(RouterConfig(up=(1.0,), window=2, min_run=3), 2)
    router.start(5.0)  # climbs at start: rung 1, c = 0
    assert router.rung == 1
    router.observe(None)
    router.observe(None)
    assert router.mean == 5.0
    assert router.observe(0.0).rung == 1  # c = 3 now, mean of [5, 0] = 2.5: stays up


def test_derive_tiers_equals_live_decisions_on_random_sequences():
    rng = random.Random(7)
    for _ in range(200):
        num = rng.choice([2, 3])
        up = sorted(rng.uniform(0, 4) for _ in range(num - 1))
        down = [u * rng.uniform(0.3, 1.0) for u in up]
        config = RouterConfig(up=tuple(up), down=tuple(down), window=rng.randint(1, 6),
                              min_run=rng.randint(1, 8), vocab_size=64)
        entropies = [rng.choice([rng.uniform(0, 6), 5.5, float("nan")]) for _ in range(60)]
        router = Router(config, num)
        live = [router.start(2.0).rung]
        run = 0
        for h in entropies:
            decision = router.observe(h)
            run += 1
            if decision.moved and not decision.guard:
                assert run >= config.min_run and abs(decision.moved) == 1
            if decision.moved:
                run = 0
            live.append(decision.rung)
        assert derive_tiers(2.0, entropies, config, num) == live


def test_validation_messages():
    with pytest.raises(UsageError, match="3 tiers need 2 up threshold"):
        RouterConfig(up=(1.0,)).validate(3)
    with pytest.raises(UsageError, match="exceeds up threshold"):
        RouterConfig(up=(1.0,), down=(2.0,)).validate(2)
    with pytest.raises(UsageError, match="at least 1"):
        RouterConfig(up=(1.0,), window=0).validate(2)
    with pytest.raises(UsageError, match="single tier"):
        RouterConfig(up=(1.0,)).validate(1)


def test_parse_thresholds():
    assert parse_thresholds("0.5, 1.25") == (0.5, 1.25)
    assert parse_thresholds("inf") == (INF,) and parse_thresholds("-inf") == (-INF,)
    with pytest.raises(UsageError, match="comma-separated numbers"):
        parse_thresholds("0.5,abc")
    with pytest.raises(UsageError, match="NaN"):
        parse_thresholds("nan")
