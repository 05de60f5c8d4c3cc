"""Prompt lookup inside the token loop (decoding/loop.py): the rung the policy chose checks an
n-gram draft in one pass, and the answer is the one decoding without lookup gives."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from mlxswitch.bench.runner import PLAIN, forced_config
from mlxswitch.decoding import lookup_rounds, loop, rung_passes
from mlxswitch.decoding.mode import DecodingMode
from mlxswitch.decoding.session import ChatSession, GenerationSettings
from mlxswitch.decoding.tiers import gear_ladder, pair_ladder
from mlxswitch.models.sources import load_model
from mlxswitch.routing.policies import make_policy
from mlxswitch.routing.router import RouterConfig

PROMPTS = ["What is the capital of France?", "def add(a, b):"]
INF = math.inf
# Peek deciding each position alone, peek holding the strong tier (hysteresis), and ead; each at
# a threshold that sends some positions up and keeps others down on the tiny pair.
CONFIGS = {
    "peek": dict(up=(2.0,), window=1, min_run=1, policy="peek"),
    "peek-held": dict(up=(2.0,), down=(1.5,), window=2, min_run=2, policy="peek"),
    "ead": dict(up=(2.0,), window=2, min_run=2, policy="ead"),
}


@pytest.fixture(scope="module")
def pair(tiny_pair):
    small, large = tiny_pair
    return pair_ladder(load_model(str(small)), load_model(str(large)))


def _conversation(ladder, config: RouterConfig, lookup: bool, max_tokens: int = 40):
    """Both prompts asked in one conversation (the second reuses the first's caches), and the
    sequence after each answer. What the rungs learned before is forgotten: each run starts alike."""
    ladder.rung_memory.clear()
    session = ChatSession(
        ladder,
        config,
        GenerationSettings(max_tokens=max_tokens),
        decoding=DecodingMode(lookup=lookup),
        measure_signals=True,
    )
    answers, sequences = [], []
    for prompt in PROMPTS:
        answers.append(session.ask(prompt))
        sequences.append(list(session.conversation.ids))
    ladder.reset()
    return answers, sequences


def _oracle(sequences: list[list[int]], corrupt_every: int):
    """A lookup index that offers the rest of a known sequence, every n-th id wrong."""

    class OracleIndex:
        found_at = -1  # offered as if copied from the prompt: the planner takes it as such

        def draft(self, ids, max_tokens):
            for full in sequences:
                if len(ids) < len(full) and full[: len(ids)] == ids:
                    at = len(ids)
                    offer = full[at : at + max_tokens]
                    if corrupt_every:
                        offer = [
                            t if (at + j) % corrupt_every else (t + 1) % 300 for j, t in enumerate(offer)
                        ]
                    return offer
            return []

    return OracleIndex


@pytest.mark.parametrize("lazy", [False, True])
@pytest.mark.parametrize("corrupt_every", [0, 4])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_lookup_checked_by_the_chosen_rung_changes_no_token_and_no_route(
    pair, monkeypatch, name, corrupt_every, lazy
):
    """Offered the answer itself (every 4th id wrong, or none), the loop checks drafts on the rung
    the policy chose: every token, and the rungs that computed each position, are those of decoding
    without lookup; the second answer of the conversation too (the trimmed caches hold its prefix)."""
    from mlxswitch.kernels.route import kernels_override

    with kernels_override("mx" if lazy else "auto"):
        plain, sequences = _conversation(pair, RouterConfig(**CONFIGS[name]), False)
        monkeypatch.setattr(lookup_rounds, "LookupIndex", _oracle(sequences, corrupt_every))
        looked, _ = _conversation(pair, RouterConfig(**CONFIGS[name]), True)
    marked = 0
    for alone, ours in zip(plain, looked, strict=True):
        assert [e.id for e in ours.tokens] == [e.id for e in alone.tokens]
        assert [e.tier for e in ours.tokens] == [e.tier for e in alone.tokens]
        assert [e.tried for e in ours.tokens] == [e.tried for e in alone.tokens]
        assert ours.finish_reason == alone.finish_reason
        marked += sum(e.source == "lookup" for e in ours.tokens)
    assert marked, "no lookup draft was checked"
    assert {e.tier for a in looked for e in a.tokens} == {"small", "large"}


def test_a_lookup_pass_is_booked_once_with_its_rows(pair, monkeypatch):
    """The pass over a draft is one pass of its rows; the rows walked after its first add none."""
    _, sequences = _conversation(pair, RouterConfig(**CONFIGS["peek"]), False)
    monkeypatch.setattr(lookup_rounds, "LookupIndex", _oracle(sequences, 0))
    (answer, _), _ = _conversation(pair, RouterConfig(**CONFIGS["peek"]), True)
    multi_row = {key: e for key, e in answer.passes.items() if key != "rest_s" and not key.endswith(" 1")}
    assert any(key.startswith("small ") and "prefill" not in key for key in multi_row)
    passes = sum(e["passes"] for key, e in answer.passes.items() if key != "rest_s" and "prefill" not in key)
    assert passes < answer.generated  # rows of one pass made several tokens
    total = sum(e["seconds"] for key, e in answer.passes.items() if key != "rest_s")
    assert total + answer.passes["rest_s"] == pytest.approx(answer.elapsed_s, abs=0.02)


def test_lookup_stays_off_where_one_tier_decodes_alone_and_where_rows_cannot_stand(pair, tiny_gears_4_8):
    """A tier alone (a forced arm, the top tier pinned) decodes plainly; gears sharing one cache
    and the probe's bottom-only signal never check lookup drafts."""

    def planners(ladder, config: RouterConfig, lookup: bool = True) -> list[bool]:
        token_loop = loop.TokenLoop(
            ladder,
            [1, 2, 3],
            make_policy(config, len(ladder.tiers)),
            lambda x: x,
            signal=config.signal,
            pins_top=config.pins_top(),
            lookup=lookup,
        )
        checker = token_loop.passes.lookup
        return [checker is not None and checker.planner(r) is not None for r in range(len(ladder.tiers))]

    assert planners(pair, RouterConfig(**CONFIGS["peek"])) == [True, True]
    assert planners(pair, forced_config(2, 0), PLAIN.lookup) == [False, False]
    assert planners(pair, RouterConfig(up=(-INF,))) == [False, False]
    gears = gear_ladder(tiny_gears_4_8, [4, 8])
    assert planners(gears, RouterConfig(**CONFIGS["peek"])) == [False, False]


SAMPLES = 300
X = 17  # the id lookup offers for the second position, whatever came first


class _OffersX:
    """A lookup index that offers one fixed id for the answer's second position."""

    found_at = -1

    def __init__(self):
        self.prompt_tokens: int | None = None

    def draft(self, ids, max_tokens):
        if self.prompt_tokens is None:
            self.prompt_tokens = len(ids) - 1  # the first call comes after the first token
        return [X] if len(ids) == self.prompt_tokens + 1 else []


class _KeepsTheDraftedId(rung_passes.RungPasses):
    """A planted bias: a row after a drafted id takes that id, unchecked."""

    def produce_rows(self, rung, draft):
        rows = yield from super().produce_rows(rung, draft)
        import mlx.core as mx

        rows.rows[0].token = mx.array([draft[0]])
        return rows


def _second_tokens(ladder, monkeypatch, lookup: bool, seed: int, passes_class=rung_passes.RungPasses):
    import mlx.core as mx
    from mlx_lm.sample_utils import make_sampler

    monkeypatch.setattr(lookup_rounds, "LookupIndex", _OffersX)
    monkeypatch.setattr(loop, "RungPasses", passes_class)
    config = RouterConfig(**CONFIGS["peek"])
    session = ChatSession(ladder, config, decoding=DecodingMode(lookup=lookup))
    prompt_ids = session.render([{"role": "user", "content": PROMPTS[0]}])
    sampler = make_sampler(temp=2.0)
    mx.random.seed(seed)
    counts: Counter = Counter()
    for _ in range(SAMPLES):
        ladder.reset()
        ladder.rung_memory.clear()
        for rung in (0, 1):  # timed passes, so that the planner drafts from the second position on
            ladder.lookup_memory(rung).check.record(1, 0.01)
        token_loop = loop.TokenLoop(
            ladder, list(prompt_ids), make_policy(config, 2), sampler, lookup=lookup, signal=config.signal
        )
        tokens = [step.token for step in token_loop.steps(3)]  # room for a one-id draft
        counts[tokens[1] if len(tokens) > 1 else -1] += 1
    return counts


def test_sampled_tokens_with_lookup_follow_the_chosen_tiers_distribution_and_a_planted_bias_is_caught(
    pair, monkeypatch
):
    """Sampling, a row of a lookup pass is sampled from the tier's own distribution at that
    position: the second token's distribution is the one without lookup (chi-square), and a loop
    that keeps the drafted id unchecked is caught by the same test."""
    from test_verify_sampling import _chi_square_p

    plain = _second_tokens(pair, monkeypatch, lookup=False, seed=1)
    assert len(plain) > 3, "the test needs a spread distribution to have power"
    looked = _second_tokens(pair, monkeypatch, lookup=True, seed=2)
    assert _chi_square_p(looked, plain) > 1e-3
    biased = _second_tokens(pair, monkeypatch, lookup=True, seed=2, passes_class=_KeepsTheDraftedId)
    assert _chi_square_p(biased, plain) < 1e-3


@pytest.fixture(scope="module")
def twin(tiny_pair):
    """The large model below itself: a review takes the lower rung's token, so guesses hold."""
    large = load_model(str(tiny_pair[1]))
    return pair_ladder(large, large)


@pytest.mark.parametrize("ladder_name", ["pair", "twin"])
@pytest.mark.parametrize("name", ["peek", "peek-held"])
def test_a_reviews_guessed_row_changes_no_token_and_saves_the_next_pass(
    request, monkeypatch, name, ladder_name
):
    """A review's pass that also computes the next position on the lower rung's token (forced to
    pay here): the tokens and routes are those without it; on the twin, where the guesses hold,
    guessed rows were used and each one took no pass of its own."""
    pair = request.getfixturevalue(ladder_name)
    plain, _ = _conversation(pair, RouterConfig(**CONFIGS[name]), False)
    monkeypatch.setattr(rung_passes, "GUESS_USED", 100.0)
    used: list[bool] = []
    settle = rung_passes.RungPasses.settle_guesses

    def spy(self):
        used.extend(self.sequence.ids[-1] == guess for _, guess, _ in self.ahead.guessed)
        settle(self)

    monkeypatch.setattr(rung_passes.RungPasses, "settle_guesses", spy)
    guessed, _ = _conversation(pair, RouterConfig(**CONFIGS[name]), True)
    for alone, ours in zip(plain, guessed, strict=True):
        assert [e.id for e in ours.tokens] == [e.id for e in alone.tokens]
        assert [e.tried for e in ours.tokens] == [e.tried for e in alone.tokens]
    assert used, "no review made a guess"
    if ladder_name == "pair":
        return
    assert any(used), "no guess was ever the token taken"
    for alone, ours in zip(plain, guessed, strict=True):
        large = [
            sum(e["passes"] for k, e in a.passes.items() if k.startswith("large ")) for a in (alone, ours)
        ]
        assert large[1] < large[0]
