"""mlxswitch.bench: the prompt suite loader/checker and the pure routing/speed metrics."""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest

from mlxswitch.bench import metrics as M
from mlxswitch.bench.prompts import (
    CATEGORIES,
    BenchPrompt,
    check_answer,
    default_suite_path,
    load_prompts,
    numbers_in,
    select,
)
from mlxswitch.errors import ConfigError, UsageError


def _data(seed: int, n: int = 400):
    """Random per-position NLLs where the top tier is better on average, and a noisy signal."""
    rng = np.random.default_rng(seed)
    b = rng.gamma(2.0, 1.0, n)
    gain = rng.normal(0.5, 1.0, n)
    t = np.maximum(b - gain, 0.0)
    signal = (b - t) + rng.normal(0.0, 1.0, n)
    return b, t, signal


# ---------------------------------------------------------------- retained fidelity and controls


def test_retained_endpoints():
    b, t, _ = _data(0)
    assert M.retained_fidelity(b, t, np.zeros(b.size, bool)) == 0.0
    assert M.retained_fidelity(b, t, np.ones(b.size, bool)) == pytest.approx(1.0)
    assert M.share(np.zeros(4, bool)) == 0.0 and M.share([1, 0, 0, 1]) == 0.5
    assert math.isnan(M.share([]))


def test_retained_hand_case_and_zero_gap():
    b, t = [3.0, 1.0], [1.0, 1.0]  # gap 1.0 nat in the mean, all at position 0
    assert M.retained_fidelity(b, t, [True, False]) == pytest.approx(1.0)
    assert M.retained_fidelity(b, t, [False, True]) == pytest.approx(0.0)
    assert math.isnan(M.retained_fidelity([1.0, 2.0], [1.0, 2.0], [True, False]))
    assert math.isnan(M.retained_fidelity([], [], []))
    with pytest.raises(ValueError):
        M.retained_fidelity([1.0], [1.0, 2.0], [True])


@pytest.mark.parametrize("seed", range(5))
def test_oracle_dominates_signal_and_random(seed):
    b, t, s = _data(seed)
    for sh in (0.0, 0.1, 0.25, 0.5, 0.8, 1.0):
        o = M.oracle(b, t, sh)
        r = M.ranked_by_signal(b, t, s, sh)
        rc = M.random_control(b, t, sh, seed=seed, draws=200)
        assert o >= r - 1e-12
        assert o >= rc.mean - 1e-12 and o >= rc.p95 - 1e-12
        assert rc.p5 <= rc.draws_mean <= rc.p95
    assert M.oracle(b, t, 0.0) == 0.0 and M.oracle(b, t, 1.0) == pytest.approx(1.0)
    # The informative signal beats random at a moderate share.
    assert M.ranked_by_signal(b, t, s, 0.3) > M.random_control(b, t, 0.3).p95


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


def test_curve_matches_pointwise():
    b, t, s = _data(3, n=200)
    c = M.curve(b, t, s, seed=2, draws=50)
    assert c.share[0] == 0.0 and c.share[-1] == 1.0 and len(c.share) == 21
    for i, sh in enumerate(c.share):
        assert c.oracle[i] == pytest.approx(M.oracle(b, t, sh))
        assert c.signal[i] == pytest.approx(M.ranked_by_signal(b, t, s, sh))
        assert c.random_mean[i] == pytest.approx(M.random_control(b, t, sh).mean)
    # Where the top tier is worse at some positions the oracle beats top-only (retained > 1) mid-curve.
    assert np.all(c.oracle >= c.signal - 1e-12) and c.oracle.max() > 1.0 and c.oracle[-1] == pytest.approx(1.0)
    d = c.to_dict()
    assert json.loads(json.dumps(d))["k"][-1] == 200
    shares, retained = M.threshold_curve(b, t, s, [-np.inf, np.inf])
    assert shares.tolist() == [1.0, 0.0] and retained[0] == pytest.approx(1.0) and retained[1] == 0.0
    flat = M.curve([1.0, 1.0], [1.0, 1.0])
    assert np.isnan(flat.oracle).all() and flat.signal is None


# ---------------------------------------------------------------- AUROC


def _auroc_naive(scores, labels):
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
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


def test_summarize_bounds_and_overhead():
    assert M.summarize([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert math.isnan(M.summarize([])["median"])
    bound = M.apple_bound_tok_s(1e9)  # 1 GB per token
    assert set(bound) == set(M.APPLE_BANDWIDTH_GBPS)
    assert bound["M4 Max"] == pytest.approx(546.0) and bound["M1"] == pytest.approx(68.0)
    assert M.apple_bound_tok_s(1e9, efficiency=0.5)["M2 Ultra"] == pytest.approx(400.0)
    with pytest.raises(ValueError):
        M.apple_bound_tok_s(0)
    ideal = 80 * 0.01 + 20 * 0.05  # 1.8 s
    assert M.overhead_ratio(2.7, {"small": 80, "large": 20}, {"small": 0.01, "large": 0.05}) == pytest.approx(1.5)
    assert ideal == pytest.approx(1.8)
    assert math.isnan(M.overhead_ratio(1.0, {"small": 0}, {"small": 0.01}))
    with pytest.raises(ValueError):
        M.overhead_ratio(1.0, {"cloud": 3}, {"small": 0.01})


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
    ok.write_text(json.dumps(GOOD) + "\n" + json.dumps({"id": "c", "category": "chat", "prompt": "hi"}) + "\n")
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
        "code-01": "len(items)", "code-03": 'print("hello")', "code-05": "a + b",
        "code-10": "[x**2 for x in nums]", "code-11": "s[::-1]", "code-13": "[1, 2, 3]",
        "code-15": "def is_even(n):\n    return n % 2 == 0", "arith-14": "4,000", "facts-09": "H2O",
        "instr-01": "Yes.", "instr-05": "1, 2, 3, 4, 5", "instr-07": "apple", "instr-09": "tac",
        "instr-12": "apple, mango, pear", "instr-14": "C, B, A", "chat-12": "hat",
    }
    by_id = {p.id: p for p in load_prompts(default_suite_path())}
    for pid, reply in replies.items():
        assert check_answer(by_id[pid], reply) is True, pid
    assert check_answer(by_id["instr-07"], "apple pie is nice") is False
