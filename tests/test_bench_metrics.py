"""mlxswitch.bench: the prompt suite loader/checker, the metrics, and the figures the report derives."""

from __future__ import annotations

import json
import math
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

from mlxswitch.bench import metrics as M
from mlxswitch.bench import simulate
from mlxswitch.bench.prompts import (
    CATEGORIES,
    BenchPrompt,
    check_answer,
    default_suite_path,
    load_prompts,
    numbers_in,
    select,
)
from mlxswitch.bench.report import summarize_bench
from mlxswitch.bench.runner import Arm, BenchRun, forced_config, make_arms, sweep_config
from mlxswitch.decoding.mode import DecodingMode
from mlxswitch.errors import ConfigError, UsageError
from mlxswitch.routing.router import RouterConfig


def _data(seed: int, n: int = 400):
    """Random per-position NLLs where the top tier is better on average, and a noisy signal."""
    rng = np.random.default_rng(seed)
    b = rng.gamma(2.0, 1.0, n)
    gain = rng.normal(0.5, 1.0, n)
    t = np.maximum(b - gain, 0.0)
    signal = (b - t) + rng.normal(0.0, 1.0, n)
    return b, t, signal


# ---------------------------------------------------------------- retained fidelity and controls


def _positions(seed: int, prompts: int = 2, n: int = 200) -> list[simulate.Positions]:
    """Teacher-forced arrays for a pair: the bottom tier's entropy is a noisy view of the gain."""
    out = []
    for k in range(prompts):
        b, t, signal = _data(seed * 10 + k, n)
        out.append(simulate.Positions(f"p{k}", np.stack([signal, signal]), np.stack([b, t])))
    return out


def _pooled(positions):
    return (np.concatenate([p.nll[0] for p in positions]), np.concatenate([p.nll[-1] for p in positions]))


def test_reported_quality_endpoints_and_the_retained_formula():
    positions = _positions(0)
    tier_bytes = [100, 300]
    alone = [simulate.quality(positions, simulate.forced(positions, r), tier_bytes) for r in (0, 1)]
    assert alone[0].retained == 0.0 and alone[0].top_share == 0.0 and alone[0].bytes_per_token == 100
    assert alone[1].retained == pytest.approx(1.0) and alone[1].top_share == 1.0
    assert M.retained(3.0, 2.0, 1.0) == 0.5 and math.isnan(M.retained(1.0, 1.0, 1.0))
    # An escalated position costs both tiers: 100 + 300 bytes, then a cheap one 100.
    hand = simulate.Positions("h", np.array([[5.0, 0.0], [0.5, 0.0]]), np.array([[2.0, 1.0], [1.0, 1.0]]))
    config = RouterConfig(up=(1.0,), window=1, min_run=1, policy="peek")
    q = simulate.quality([hand], [simulate.route(config, hand)], tier_bytes)
    assert (q.top_share, q.bytes_per_token, q.retained) == (0.5, 250, 1.0)


def test_retained_hand_case_and_zero_gap():
    b, t = [3.0, 1.0], [1.0, 1.0]  # gap 1.0 nat in the mean, all at position 0
    assert M.retained_fidelity(b, t, [True, False]) == pytest.approx(1.0)
    assert M.retained_fidelity(b, t, [False, True]) == pytest.approx(0.0)
    assert math.isnan(M.retained_fidelity([1.0, 2.0], [1.0, 2.0], [True, False]))
    assert math.isnan(M.retained_fidelity([], [], []))
    with pytest.raises(ValueError):
        M.retained_fidelity([1.0], [1.0, 2.0], [True])


@pytest.mark.parametrize("seed", range(5))
def test_the_oracle_bounds_every_replayed_policy_and_the_random_control(seed):
    positions = _positions(seed)
    b, t = _pooled(positions)
    for policy in ("ead", "peek"):
        for tau in simulate.sweep_thresholds(positions, 5):
            config = RouterConfig(up=(tau,), window=1, min_run=1, policy=policy)
            q = simulate.quality(positions, [simulate.route(config, p) for p in positions], [1, 2])
            rc = M.random_control(b, t, q.top_share, seed=seed, draws=200)
            assert M.oracle(b, t, q.top_share) >= max(q.retained, rc.mean, rc.p95) - 1e-12
            assert rc.p5 <= rc.draws_mean <= rc.p95
    assert M.oracle(b, t, 0.0) == 0.0 and M.oracle(b, t, 1.0) == pytest.approx(1.0)
    # The informative signal beats random at a moderate share, deciding on the same position.
    config = RouterConfig(up=(float(np.quantile(b - t, 0.7)),), window=1, min_run=1, policy="peek")
    q = simulate.quality(positions, [simulate.route(config, p) for p in positions], [1, 2])
    assert q.retained > M.random_control(b, t, q.top_share).p95


def test_random_expectation_equals_share():
    b, t, _ = _data(7, n=300)
    for sh in (0.1, 0.3, 0.5, 0.9):
        rc = M.random_control(b, t, sh, seed=1, draws=2000)
        assert rc.k == M.count_for_share(sh, b.size)
        assert rc.mean == pytest.approx(rc.k / b.size)
        assert rc.mean == pytest.approx(sh, abs=1 / b.size)
        assert rc.draws_mean == pytest.approx(sh, abs=0.03)
    a = M.random_control(b, t, 0.3, seed=5)
    assert a == M.random_control(b, t, 0.3, seed=5)  # seeded: reproducible


def test_oracle_ties_and_rounding():
    # Equal gains everywhere: ties go to earlier positions; k = floor(share*n + 0.5).
    assert M.top_k_mask([1.0, 1.0, 1.0, 1.0], 2).tolist() == [True, True, False, False]
    assert M.count_for_share(0.5, 5) == 3 and M.count_for_share(0.25, 2) == 1
    assert M.oracle([2.0, 5.0, 1.0], [1.0, 1.0, 1.0], 1 / 3) == pytest.approx(4 / 5)
    with pytest.raises(ValueError):
        M.count_for_share(1.5, 10)


# ---------------------------------------------------------------- the bench's report


def _record(arm, tiers, decode_s, generated=5, prompt="p0"):
    tokens = [
        {"id": i, "tier": tier, **({"tried": tried} if tried else {})}
        for i, (tier, tried) in enumerate(tiers)
    ]
    counts = Counter(t["tier"] for t in tokens)
    return {
        "arm": arm,
        "repeat": 0,
        "prompt_id": prompt,
        "generated": generated,
        "prefilled": 10,
        "first_token_s": 0.5,
        "decode_s": decode_s,
        "peak_memory_gb": 1.0,
        "switches": 0,
        "catch_up_tokens": 0,
        "tier_counts": dict(counts),
        "mean_bytes_per_token": 150.0,
        "tokens": tokens,
        "correct": None,
    }


def _summary(positions):
    profile = SimpleNamespace(
        router=RouterConfig(up=(1.0,), window=1, min_run=1, policy="peek"), decoding=DecodingMode()
    )
    tiers = [SimpleNamespace(bytes_per_token=100), SimpleNamespace(bytes_per_token=300)]
    ladder = SimpleNamespace(tier_names=["small", "large"], tiers=tiers)
    peek = sweep_config("peek", 1.0, 2)
    arms = [
        Arm("small alone", "tier", forced_config(2, 0), tier=0),
        Arm("large alone", "tier", forced_config(2, 1), tier=1),
        Arm("peek τ=1", "sweep", peek, policy="peek", tau=1.0),
    ]
    runs = [
        _record("small alone", [("small", None)] * 5, 0.4),  # 0.1 s per decoded token
        _record("large alone", [("large", None)] * 5, 0.8),  # 0.2 s
        # One escalated token (both tiers computed it) and three cheap ones: ideal 0.3 + 3 × 0.1.
        _record("peek τ=1", [("small", None), ("large", ["small", "large"])] + [("small", None)] * 3, 0.9),
    ]
    run = BenchRun(arms=arms, runs=runs, positions=positions, taus=[1.0])
    return summarize_bench(run, profile, ladder), profile


def test_the_report_counts_every_tier_an_escalated_token_ran_in_the_overhead():
    summary, _ = _summary(_positions(1))
    arms = {a["name"]: a for a in summary["arms"]}
    assert arms["small alone"]["speed"]["overhead"]["median"] == pytest.approx(1.0)
    assert arms["peek τ=1"]["speed"]["overhead"]["median"] == pytest.approx(0.9 / 0.6)
    assert arms["peek τ=1"]["speed"]["decode_tok_per_s"]["median"] == pytest.approx(4 / 0.9)
    assert arms["peek τ=1"]["speed"]["top_share"]["median"] == pytest.approx(1 / 5)


def test_the_reported_curves_and_controls_are_the_metrics_at_each_share():
    positions = _positions(3)
    summary, profile = _summary(positions)
    b, t = _pooled(positions)
    curves = summary["curves"]
    assert curves["share"][0] == 0.0 and curves["share"][-1] == 1.0 and len(curves["share"]) == 21
    for i, sh in enumerate(curves["share"]):
        assert curves["oracle"][i] == pytest.approx(M.oracle(b, t, sh))
        assert curves["random"][i] == pytest.approx(M.random_control(b, t, sh).mean)
    # Where the top tier is worse at some positions the oracle beats top-only (retained > 1) mid-curve.
    assert max(curves["oracle"]) > 1.0 and curves["oracle"][-1] == pytest.approx(1.0)
    for policy, points in curves["policies"].items():
        for point in points:
            config = sweep_config(policy, point["tau"], 2)
            q = simulate.quality(positions, [simulate.route(config, p) for p in positions], [100, 300])
            assert point["retained"] == pytest.approx(q.retained) and point["top_share"] == q.top_share
    peek = next(a for a in summary["arms"] if a["name"] == "peek τ=1")
    assert peek["random_control"]["mean"] == pytest.approx(
        M.random_control(b, t, peek["quality"]["top_share"]).mean
    )
    assert peek["oracle"] == pytest.approx(M.oracle(b, t, peek["quality"]["top_share"]))
    flat = [simulate.Positions("f", np.ones((2, 3)), np.ones((2, 3)))]
    assert all(v is None for v in _summary(flat)[0]["curves"]["oracle"])  # no gap: null, not NaN


@pytest.mark.parametrize(
    "config",
    [
        RouterConfig(up=(1.0,), policy="peek", window=1, min_run=1),
        RouterConfig(up=(1.0,), policy="ead", window=4, min_run=3),
    ],
    ids=["peek", "ead-window-4-min-run-3"],
)
def test_the_threshold_for_a_share_is_the_naive_search_over_the_quantiles(config):
    """One replay per distinct threshold, shared by every target share, picks what replaying the
    whole search for each target picks (the first nearest on ties)."""
    positions = _positions(5, prompts=3, n=120)
    pooled = np.concatenate([p.entropy[0] for p in positions])
    candidates = simulate.share_by_threshold(config, positions)
    for target in (0.0, 0.05, 0.2, 0.37, 1.0):
        best = (math.nan, math.nan)
        for q in np.linspace(0.5, 0.99, 50):
            tau = round(float(np.quantile(pooled, q)), 4)
            tried = [simulate.route(config.with_thresholds((tau,)), p) for p in positions]
            share = simulate.quality(positions, tried, [0, 0]).top_share
            if math.isnan(best[1]) or abs(share - target) < abs(best[1] - target):
                best = (tau, share)
        assert simulate.threshold_for_share(candidates, target) == best
    assert simulate.share_by_threshold(config, []) == []
    assert all(math.isnan(v) for v in simulate.threshold_for_share([], 0.2))


def test_the_ead_sweep_runs_as_its_paper_whatever_the_profiles_timing():
    """A profile tuned for peek (window 1, min run 1) must not turn the bench's `ead` into a lagged
    peek: the swept `ead` arms read a 5-token mean and wait 10 tokens; the profile arm keeps its own."""
    profile = SimpleNamespace(
        router=RouterConfig(up=(3.0,), window=1, min_run=1, policy="peek"), decoding=DecodingMode()
    )
    ladder = SimpleNamespace(
        tier_names=["small", "large"],
        tiers=[SimpleNamespace(group=object()), SimpleNamespace(group=object())],
    )
    arms = make_arms(profile, ladder, {"ead": [0.5, 1.0], "peek": [0.5, 1.0]})
    timing = {
        (a.kind, a.policy, a.tau): (c.window, c.min_run, c.up)
        for a in arms
        if a.kind in ("sweep", "profile")
        for c in [a.engine_config()]
    }
    assert timing == {
        ("profile", "peek", None): (1, 1, (3.0,)),
        ("sweep", "ead", 0.5): (5, 10, (0.5,)),
        ("sweep", "ead", 1.0): (5, 10, (1.0,)),
        ("sweep", "peek", 0.5): (1, 1, (0.5,)),
        ("sweep", "peek", 1.0): (1, 1, (1.0,)),
    }


NAIVE = (
    ("peek", RouterConfig(up=(1.0,), policy="peek", window=1, min_run=1)),
    ("ead", RouterConfig(up=(1.0,), policy="ead", window=5, min_run=10)),
)


def _nearest_naive(positions, config, target):
    """Among the 50 quantiles (0.5 to 0.99) of the bottom tier's entropy, rounded to 4 places, the
    threshold whose replay gives the share nearest `target` (the first on ties), and its quality."""
    pooled = np.concatenate([p.entropy[0] for p in positions])
    best = None
    for q in np.linspace(0.5, 0.99, 50):
        tau = round(float(np.quantile(pooled, q)), 4)
        tried = [simulate.route(config.with_thresholds((tau,)), p) for p in positions]
        quality = simulate.quality(positions, tried, [100, 300])
        if best is None or abs(quality.top_share - target) < abs(best[1].top_share - target):
            best = (tau, quality)
    return best


def test_a_humaneval_sweep_runs_each_policy_at_its_own_threshold_for_each_share():
    """`ead` and `peek` swept at the same shares, each at its own threshold (at one threshold they
    send very different shares): per target, the naive nearest, once per distinct threshold."""
    from mlxswitch.bench.humaneval.run import sweep_points, sweep_shares

    assert sweep_shares(3) == [0.1, 0.2, 0.3] and sweep_shares(5) == [0.1, 0.15, 0.2, 0.25, 0.3]
    assert sweep_shares(1) == [0.2]
    positions = _positions(3, prompts=3, n=150)
    sweep = sweep_points(positions, ["ead", "peek"], 2, 3)
    assert list(sweep) == ["ead", "peek"]
    for policy, config in NAIVE:
        expected = {}
        for target in (0.1, 0.2, 0.3):
            tau, quality = _nearest_naive(positions, config, target)
            expected.setdefault(tau, (target, quality.top_share))
        assert [(p["tau"], (p["target_share"], p["promised_share"])) for p in sweep[policy]] == list(
            expected.items()
        )
    assert [p["tau"] for p in sweep["ead"]] != [p["tau"] for p in sweep["peek"]]
    # A coarse signal: two targets on one threshold run once, under the first target.
    coarse = [simulate.Positions("c", np.array([[0.0] * 8 + [2.0] * 2] * 2), np.ones((2, 10)))]
    assert [p["target_share"] for p in sweep_points(coarse, ["peek"], 2, 3)["peek"]] == [0.1]


def test_the_humaneval_curves_ead_column_is_the_papers_rule_at_its_nearest_share():
    """Each row's `ead_*`: ead with window 5 and min run 10 at the quantile threshold whose share is
    nearest the row's target (the first on ties), replayed naively; the peek columns beside it."""
    from mlxswitch.bench.humaneval.report import share_curve

    positions = _positions(7, prompts=3, n=150)
    curve = share_curve(positions, [100, 300], "entropy")
    assert [row["target_share"] for row in curve] == [0.05, 0.1, 0.15, 0.2, 0.25, 0.3]
    for row in curve:
        figures = {name: _nearest_naive(positions, config, row["target_share"]) for name, config in NAIVE}
        assert (row["tau"], row["top_share"]) == (figures["peek"][0], figures["peek"][1].top_share)
        assert row["retained"] == pytest.approx(figures["peek"][1].retained)
        assert (row["ead_tau"], row["ead_top_share"]) == (figures["ead"][0], figures["ead"][1].top_share)
        assert row["ead_retained"] == pytest.approx(figures["ead"][1].retained)


# ---------------------------------------------------------------- AUROC


def _auroc_naive(scores, labels):
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    if not pos or not neg:
        return math.nan
    wins = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p in pos for q in neg)
    return wins / (len(pos) * len(neg))


def test_auroc_hand_cases():
    assert M.auroc([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1]) == 1.0
    assert M.auroc([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1]) == 0.0
    assert M.auroc([0.5, 0.5, 0.5, 0.5], [0, 1, 0, 1]) == 0.5
    assert M.auroc([1, 2, 2, 3], [0, 0, 1, 1]) == pytest.approx(_auroc_naive([1, 2, 2, 3], [0, 0, 1, 1]))
    assert math.isnan(M.auroc([1, 2, 3], [1, 1, 1])) and math.isnan(M.auroc([1, 2], [0, 0]))


def test_auroc_matches_naive_reference():
    rng = np.random.default_rng(11)
    for _ in range(30):
        n = int(rng.integers(2, 60))
        scores = rng.integers(0, 6, n).astype(float)  # many ties
        labels = rng.random(n) < 0.4
        expect = _auroc_naive(scores.tolist(), labels.tolist())
        got = M.auroc(scores, labels)
        assert (math.isnan(expect) and math.isnan(got)) or got == pytest.approx(expect)


# ---------------------------------------------------------------- speed helpers


def test_summarize_and_bounds():
    assert M.summarize([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert math.isnan(M.summarize([])["median"])
    bound = M.apple_bound_tok_s(1e9)  # 1 GB per token
    assert set(bound) == set(M.APPLE_BANDWIDTH_GBPS)
    assert bound["M4 Max"] == pytest.approx(546.0) and bound["M1"] == pytest.approx(68.0)
    assert M.apple_bound_tok_s(1e9, efficiency=0.5)["M2 Ultra"] == pytest.approx(400.0)
    with pytest.raises(ValueError):
        M.apple_bound_tok_s(0)


# ---------------------------------------------------------------- prompt suite


def test_bundled_suite_loads_and_is_balanced():
    path = default_suite_path()
    assert path.name == "suite.jsonl"
    prompts = load_prompts(path)
    assert len(prompts) >= 60
    cats = Counter(p.category for p in prompts)
    assert set(cats) == set(CATEGORIES) and min(cats.values()) >= 10
    splits = Counter(p.split for p in prompts)
    assert set(splits) == {"calibration", "heldout"}
    assert 0.3 <= splits["calibration"] / len(prompts) <= 0.5
    for cat in CATEGORIES:
        in_cat = [p for p in prompts if p.category == cat]
        assert {p.split for p in in_cat} == {"calibration", "heldout"}
        assert sum(p.split == "calibration" for p in in_cat) / len(in_cat) == pytest.approx(0.4, abs=0.1)
    checkable = [p for p in prompts if p.checkable]
    assert len(checkable) >= 50 and all(p.max_tokens is None or p.max_tokens <= 64 for p in prompts)
    assert all(p.max_tokens <= 48 for p in checkable if p.max_tokens is not None)


def test_select_quick_and_split():
    prompts = load_prompts(default_suite_path())
    quick = select(prompts, quick=True)
    assert Counter(p.category for p in quick) == {c: 2 for c in CATEGORIES}
    assert quick == select(prompts, quick=True)
    cal = select(prompts, quick=False, split="calibration")
    held = select(prompts, quick=False, split="heldout")
    assert len(cal) + len(held) == len(prompts) and all(p.split == "calibration" for p in cal)
    assert all(p.split == "heldout" for p in select(prompts, quick=True, split="heldout"))
    with pytest.raises(UsageError):
        select(prompts, quick=False, split="train")
    with pytest.raises(UsageError):
        select([p for p in prompts if p.split == "heldout"], quick=False, split="calibration")


GOOD = {"id": "a-1", "category": "facts", "prompt": "Capital of France?", "answer": {"regex": "(?i)paris"}}


@pytest.mark.parametrize(
    "bad_line, needle",
    [
        ("{not json", "bad JSON"),
        ('["a list"]', "JSON object"),
        (json.dumps({"category": "facts", "prompt": "x"}), 'missing "id"'),
        (json.dumps({**GOOD, "id": "a-1"}), 'duplicate id "a-1" (first on line 1)'),
        (json.dumps({**GOOD, "id": "a-2", "prompt": "   "}), '"prompt" must be a non-empty string'),
        (json.dumps({**GOOD, "id": "a-2", "answer": {"regex": "(unclosed"}}), "bad answer regex"),
        (json.dumps({**GOOD, "id": "a-2", "answer": {"exact": "x"}}), 'unknown answer kind "exact"'),
        (json.dumps({**GOOD, "id": "a-2", "answer": {"number": "forty"}}), "finite JSON number"),
        (json.dumps({**GOOD, "id": "a-2", "answer": {"number": True}}), "finite JSON number"),
        (json.dumps({**GOOD, "id": "a-2", "max_tokens": 0}), "positive integer"),
        (json.dumps({**GOOD, "id": "a-2", "split": "train"}), '"split" must be'),
        (json.dumps({**GOOD, "id": "a-2", "anwser": None}), "unknown key(s) 'anwser'"),
    ],
)
def test_load_prompts_errors_name_file_and_line(tmp_path, bad_line, needle):
    path = tmp_path / "suite.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + bad_line + "\n")
    with pytest.raises(ConfigError) as info:
        load_prompts(path)
    message = str(info.value)
    assert message.startswith(f"{path}:3: "), message
    assert needle in message and "\n" not in message
    assert info.value.exit_code == 3


def test_load_prompts_file_level_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such prompt file"):
        load_prompts(tmp_path / "missing.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n")
    with pytest.raises(ConfigError, match="no prompts"):
        load_prompts(empty)
    ok = tmp_path / "ok.jsonl"
    ok.write_text(
        json.dumps(GOOD) + "\n" + json.dumps({"id": "c", "category": "chat", "prompt": "hi"}) + "\n"
    )
    a, c = load_prompts(ok)
    assert (a.answer_kind, a.answer_value, a.split, a.max_tokens) == ("regex", "(?i)paris", "heldout", None)
    assert c.answer_kind is None and not c.checkable


def _p(kind, value):
    return BenchPrompt("x", "arithmetic", "q", kind, value, None, "heldout")


def test_check_answer():
    forty_two = _p("number", 42.0)
    assert check_answer(forty_two, "42") is True
    assert check_answer(forty_two, "17 + 25 = 42.") is True
    assert check_answer(forty_two, "The answer is 42.0") is True
    assert check_answer(forty_two, "42 is wrong, it is 43") is False  # the last number counts
    assert check_answer(forty_two, "forty-two") is False
    assert check_answer(forty_two, "") is False
    assert check_answer(_p("number", 4000.0), "1,250 + 2,750 = 4,000") is True
    assert check_answer(_p("number", -3.0), "It is -3") is True
    assert check_answer(_p("number", 0.5), "0.5000000001") is True
    assert check_answer(_p("regex", r"(?i)\bparis\b"), "The capital is Paris.") is True
    assert check_answer(_p("regex", r"(?i)\bparis\b"), "Lyon") is False
    assert check_answer(_p(None, None), "anything") is None
    assert numbers_in("H2O, 1,2,3 and 3.14") == [1.0, 2.0, 3.0, 3.14]


def test_bundled_answers_accept_a_model_reply():
    """Each checkable suite item accepts a plausible correct reply (guards against typos in regexes)."""
    replies = {
        "code-01": "len(items)",
        "code-03": 'print("hello")',
        "code-05": "a + b",
        "code-10": "[x**2 for x in nums]",
        "code-11": "s[::-1]",
        "code-13": "[1, 2, 3]",
        "code-15": "def is_even(n):\n    return n % 2 == 0",
        "arith-14": "4,000",
        "facts-09": "H2O",
        "instr-01": "Yes.",
        "instr-05": "1, 2, 3, 4, 5",
        "instr-07": "apple",
        "instr-09": "tac",
        "instr-12": "apple, mango, pear",
        "instr-14": "C, B, A",
        "chat-12": "hat",
    }
    by_id = {p.id: p for p in load_prompts(default_suite_path())}
    for pid, reply in replies.items():
        assert check_answer(by_id[pid], reply) is True, pid
    assert check_answer(by_id["instr-07"], "apple pie is nice") is False
