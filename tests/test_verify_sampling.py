"""Verified drafting with a sampler: each answer is drawn from the top tier's own distribution.

A two-sample chi-square test compares the second token of many sampled answers (the first one
the bottom tier drafts) with the top tier sampling alone, and the same test must reject a loop
with a planted bias (the first drafted token kept unchecked). Seeds are fixed: the outcome is
deterministic, not flaky.
"""

from __future__ import annotations

import math
from collections import Counter

import mlx.core as mx
import pytest
from mlx_lm.sample_utils import make_sampler

from mlxswitch.decoding import verified_round
from mlxswitch.decoding.drafting import DraftPlanner, kept_prefix
from mlxswitch.decoding.session import ChatSession, GenerationSettings
from mlxswitch.decoding.tiers import pair_ladder
from mlxswitch.decoding.verify import VerifyLoop
from mlxswitch.models.sources import load_model
from mlxswitch.routing.router import RouterConfig

SAMPLES = 300
TEMPERATURE = 2.0
PROMPT = "Count: one two"


def _keeps_the_first_draft_token(draft, samples):
    """A planted bias: the first drafted token stands whatever the top tier samples there."""
    return max(kept_prefix(draft, samples), min(1, len(draft)))


def _chi_square_p(a: Counter, b: Counter) -> float:
    """p-value of a two-sample chi-square test of homogeneity (rare tokens pooled)."""
    total_a, total_b = sum(a.values()), sum(b.values())
    common = [t for t in set(a) | set(b) if a[t] + b[t] >= 10]
    rows = [(a[t], b[t]) for t in common]
    rest = (total_a - sum(r[0] for r in rows), total_b - sum(r[1] for r in rows))
    if sum(rest) > 0:
        rows.append(rest)
    n = total_a + total_b
    stat = 0.0
    for x, y in rows:
        for observed, total in ((x, total_a), (y, total_b)):
            expected = (x + y) * total / n
            stat += (observed - expected) ** 2 / expected
    k = len(rows) - 1
    # Wilson–Hilferty: (X/k)^(1/3) is close to normal; plenty for a p-value cut at 1e-3.
    z = ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


@pytest.fixture(scope="module")
def pair(tiny_pair):
    small, large = tiny_pair
    return pair_ladder(load_model(str(small)), load_model(str(large)))


def _second_tokens(ladder, seed: int) -> Counter:
    session = ChatSession(ladder, RouterConfig(up=(-math.inf,)))
    prompt_ids = session.render([{"role": "user", "content": PROMPT}])
    sampler = make_sampler(temp=TEMPERATURE)
    mx.random.seed(seed)
    counts: Counter = Counter()
    for _ in range(SAMPLES):
        ladder.reset()
        # Fixed drafting with no threshold: the bottom tier drafts every position after the first.
        loop = VerifyLoop(
            ladder, list(prompt_ids), math.inf, sampler, planner=DraftPlanner(4, adaptive=False), lookup=False
        )
        tokens = [step.token for step in loop.steps(2)]
        counts[tokens[1] if len(tokens) > 1 else -1] += 1  # -1: the answer ended first
    return counts


def _top_alone(ladder, seed: int) -> Counter:
    settings = GenerationSettings(max_tokens=2, temperature=TEMPERATURE, seed=seed)
    session = ChatSession(ladder, RouterConfig(up=(-math.inf,)), settings)
    counts: Counter = Counter()
    for _ in range(SAMPLES):
        session.reset()
        answer = session.ask(PROMPT)
        counts[answer.tokens[1].id if answer.generated > 1 else -1] += 1
    return counts


def test_sampled_verified_tokens_follow_the_top_tiers_distribution_and_a_planted_bias_is_caught(
    pair, monkeypatch
):
    reference = _top_alone(pair, seed=1)
    assert len(reference) > 3, "the test needs a spread distribution to have power"
    verified = _second_tokens(pair, seed=2)
    assert _chi_square_p(verified, reference) > 1e-3
    monkeypatch.setattr(verified_round, "kept_prefix", _keeps_the_first_draft_token)
    biased = _second_tokens(pair, seed=2)
    assert _chi_square_p(biased, reference) < 1e-3


def test_pipelined_verified_tokens_follow_the_top_tiers_distribution(pair):
    """The same test on lazy passes (a Mac's route, MLX ops forced): the first round's one-row pass
    is queued ahead, and the drafted round's check reads it as its first row."""
    from mlxswitch.kernels.route import kernels_override

    reference = _top_alone(pair, seed=1)
    with kernels_override("mx"):
        verified = _second_tokens(pair, seed=2)
    assert _chi_square_p(verified, reference) > 1e-3
