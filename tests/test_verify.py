"""Verified drafting (decoding/verify.py): the answer is the top tier's own, whatever the threshold."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from mlxswitch.cli import app
from mlxswitch.decoding import round_models, verify
from mlxswitch.decoding.mode import DecodingMode
from mlxswitch.decoding.session import ChatSession, GenerationSettings
from mlxswitch.decoding.tiers import gear_ladder, pair_ladder
from mlxswitch.errors import ConfigError, SettingError
from mlxswitch.models import heads
from mlxswitch.models.sources import load_model
from mlxswitch.profile_load import load_profiles
from mlxswitch.routing.router import RouterConfig

PROMPTS = ["What is the capital of France?", "Count: one two three", "def add(a, b):"]
INF = math.inf


Decoding = tuple[RouterConfig, DecodingMode]


def _verify(tau: float, draft: str = "fixed", lookup: bool = False) -> Decoding:
    # "fixed" without lookup: drafts end only where the drafter is unsure (deterministic shapes);
    # the adaptive rule's lengths follow wall-clock timings, so its tests check answers, not shapes.
    return RouterConfig(up=(tau,)), DecodingMode(verify=True, draft=draft, lookup=lookup)


def _answers(ladder, config: RouterConfig | Decoding, max_tokens: int, **settings) -> list:
    return _answers_for(ladder, config, max_tokens, PROMPTS, **settings)


def _answers_for(
    ladder,
    config: RouterConfig | Decoding,
    max_tokens: int,
    prompts,
    measure_signals: bool = False,
    **settings,
) -> list:
    router, mode = config if isinstance(config, tuple) else (config, DecodingMode())
    session = ChatSession(
        ladder,
        router,
        GenerationSettings(max_tokens=max_tokens, **settings),
        decoding=mode,
        measure_signals=measure_signals,
    )
    out = []
    for prompt in prompts:
        out.append(session.ask(prompt))
        session.reset()
    return out


@pytest.fixture(scope="module")
def pair(tiny_pair):
    small, large = tiny_pair
    return pair_ladder(load_model(str(small)), load_model(str(large)))


@pytest.fixture(scope="module")
def twin(tiny_pair):
    """The large model drafting for itself: every draft is kept, so whole drafts are checked."""
    large = load_model(str(tiny_pair[1]))
    return pair_ladder(large, large)


@pytest.mark.parametrize("ladder_name", ["pair", "twin", "gears"])
@pytest.mark.parametrize("tau", [0.0, 2.0, INF])
@pytest.mark.parametrize("draft", ["fixed", "adaptive"])
def test_greedy_verified_answer_is_the_top_tiers_answer(request, ladder_name, tau, draft, tiny_gears_4_8):
    if ladder_name == "gears":
        ladder = gear_ladder(tiny_gears_4_8, [4, 8])
    else:
        ladder = request.getfixturevalue(ladder_name)
    top = _answers(ladder, RouterConfig(up=(-INF,)), 70)
    checked = _answers(ladder, _verify(tau, draft, lookup=draft == "adaptive"), 70)
    for alone, ours in zip(top, checked, strict=True):
        assert [e.id for e in ours.tokens] == [e.id for e in alone.tokens]
        assert ours.text == alone.text and ours.finish_reason == alone.finish_reason


def test_a_drafter_proposes_only_its_heads_leading_ids_and_the_answer_stays_the_top_tiers(
    tiny_pair, monkeypatch
):
    """The drafter's passes read its draft head (the first DRAFT_IDS ids' logits, SplitModel):
    the large model drafting for itself proposes no id past them, the check makes those, and the
    answer is the top tier's own; routed and top-alone passes keep the whole head."""
    monkeypatch.setattr(heads, "DRAFT_IDS", 96)
    large = load_model(str(tiny_pair[1]))
    ladder = pair_ladder(large, large)  # its split, and so its draft head, checked under the patch
    split = ladder.tiers[0].group.checked_split()
    assert split is not None and split.draft_head is not None
    top = _answers(ladder, RouterConfig(up=(-INF,)), 60)
    checked = _answers(ladder, _verify(INF), 60)
    rare = 0
    for alone, ours in zip(top, checked, strict=True):
        assert [e.id for e in ours.tokens] == [e.id for e in alone.tokens]
        assert all(e.id < 96 for e in ours.tokens if e.tier == "small")
        rare += sum(e.id >= 96 for e in alone.tokens)
    assert rare > 0  # the answers hold ids the drafter cannot propose: the check made each
    assert sum(a.tier_counts["small"] for a in checked) > 0


def test_a_confident_drafter_makes_the_tokens_and_the_top_tier_checks_them_in_few_passes(twin):
    for answer in _answers(twin, _verify(INF), 70):
        counts = answer.tier_counts
        # The opening pass, then one per MAX_DRAFT drafted tokens: the top tier makes one token
        # per pass (the first token, then each draft's bonus).
        assert counts["large"] <= 1 + math.ceil((answer.generated - 1) / verify.MAX_DRAFT)
        assert answer.tokens[0].tier == "large" and answer.tokens[0].tried == ()
        assert counts["small"] + counts["large"] == answer.generated
        assert answer.catch_up_tokens["large"] >= counts["small"]  # it read every drafted token
        for event in answer.tokens:
            assert event.tried in ((), ("large",), ("small", "large"))


def test_threshold_zero_checks_every_position_and_the_top_tier_makes_them_all(pair):
    for answer in _answers(pair, _verify(0.0), 30):
        assert answer.tier_counts == {"small": 0, "large": answer.generated}
        # The top tier opens the answer alone; every later position was computed below first
        # (its doubt ended the draft), then by the top tier.
        assert answer.tokens[0].tried == ()
        assert all(event.tried == ("small", "large") for event in answer.tokens[1:])


@pytest.mark.parametrize("budget", [1, 5, verify.MAX_DRAFT + 3])
def test_the_budget_holds_mid_draft(twin, budget):
    top = _answers(twin, RouterConfig(up=(-INF,)), budget)
    for alone, ours in zip(top, _answers(twin, _verify(INF), budget), strict=True):
        assert ours.generated <= budget
        assert [e.id for e in ours.tokens] == [e.id for e in alone.tokens]


def test_log_probabilities_are_the_top_tiers(pair):
    top = _answers(pair, RouterConfig(up=(-INF,)), 12, top_logprobs=3)
    for alone, ours in zip(top, _answers(pair, _verify(2.0), 12, top_logprobs=3), strict=True):
        for a, b in zip(alone.tokens, ours.tokens, strict=True):
            assert b.logprob == pytest.approx(a.logprob, abs=1e-3)
            assert [i for i, _ in b.top_logprobs] == [i for i, _ in a.top_logprobs]


def test_sampled_verified_answers_are_reproducible_with_a_seed(pair):
    first = _answers(pair, _verify(2.0), 20, temperature=0.8, seed=3)
    again = _answers(pair, _verify(2.0), 20, temperature=0.8, seed=3)
    assert [a.text for a in first] == [b.text for b in again]


# -- the settings ------------------------------------------------------------------------------


@pytest.mark.parametrize("router", [{"policy": "ead"}, {"window": 3}, {"min_run": 2}, {"policy": "peek"}])
def test_verify_is_a_mode_beside_the_router_and_ignores_its_timing(pair, router):
    """The router's policy, window and min run do not reach verified drafting: the same greedy
    tokens, drafts and kept tokens whatever they are (drafts end on the signal and up[0] alone)."""
    mode = DecodingMode(verify=True, draft="fixed", lookup=False)
    reference = _answers(pair, (RouterConfig(up=(2.0,), policy="peek", window=1, min_run=1), mode), 30)
    answers = _answers(pair, (RouterConfig(up=(2.0,), **router), mode), 30)
    for ours, theirs in zip(answers, reference, strict=True):
        assert [(e.id, e.tier, e.proposer) for e in ours.tokens] == [
            (e.id, e.tier, e.proposer) for e in theirs.tokens
        ]


@pytest.mark.parametrize(
    ("router", "tiers", "key", "words"),
    [
        ({"up": (1.0, 2.0)}, 3, "verify", r"two local tiers, a drafter and a checker \(this ladder has 3\)"),
        ({"up": (0.5,), "normalize": True}, 2, "normalize", "in its own units: drop normalize"),
        (
            {"up": (0.5,), "signal": "probe", "policy": "peek"},
            2,
            "verify",
            "a signal of the logits, not the probe",
        ),
    ],
)
def test_verify_refuses_a_router_or_ladder_it_cannot_run(router, tiers, key, words):
    with pytest.raises(SettingError, match=words) as caught:
        DecodingMode(verify=True).validate(RouterConfig(**router), tiers)
    assert caught.value.key == key
    DecodingMode(verify=False).validate(RouterConfig(**router), tiers)  # routed: the router's to judge


def test_the_draft_rule_is_checked_when_the_mode_is_built():
    with pytest.raises(SettingError, match=r"the draft rule must be one of adaptive, fixed \(got 'long'\)"):
        DecodingMode(draft="long")


def test_a_profile_turns_verify_on_and_a_bad_value_names_its_line(tmp_path, monkeypatch):
    path = tmp_path / "models.toml"
    monkeypatch.setenv("MLXSWITCH_MODELS", str(path))
    table = '[profiles.v]\nmode = "pair"\nsmall = "a"\nlarge = "b"\nup = [1.0]\npolicy = "peek"\n'
    path.write_text(table + "window = 1\nmin_run = 1\nverify = true\n")
    assert load_profiles().get("v").decoding.verify
    path.write_text(table + "window = 1\nmin_run = 1\nverify = 1\n")
    with pytest.raises(ConfigError, match=r"models.toml:9: profile 'v': 'verify' must be true or false"):
        load_profiles()
    path.write_text(table + "verify = true\n")
    assert load_profiles().get("v").decoding.verify  # the router's window and min run do not matter
    path.write_text(table.replace("up = [1.0]", "up = [1.0]\nnormalize = true\nverify = true"))
    with pytest.raises(
        ConfigError, match=r"models.toml:6: profile 'v': verify compares the drafter's signal"
    ):
        load_profiles()


def test_chat_refuses_verify_on_a_single_model_before_loading(isolated_home):
    result = CliRunner().invoke(app, ["chat", "--profile", "embedded-plain", "--verify", "-p", "hi"])
    assert result.exit_code == 2
    assert (
        result.stderr == "error: verify needs two local tiers, a drafter and a checker (this ladder has 1)\n"
    )


def test_chat_with_verify_prints_the_large_models_answer(isolated_home, tiny_pair):
    small, large = str(tiny_pair[0]), str(tiny_pair[1])
    pair = ["chat", "--small", small, "--large", large, "--max-tokens", "24", "--no-color"]
    alone = CliRunner().invoke(app, [*pair, "--tau", "-inf", "-p", "Count: one two three"])
    verified = CliRunner().invoke(
        app,
        [*pair, "--tau", "2", "--verify", "-p", "Count: one two three"],
    )
    assert alone.exit_code == verified.exit_code == 0, verified.stderr
    assert verified.stdout == alone.stdout and verified.stdout.strip()


def test_a_verified_answers_record_has_no_initial_entropy(isolated_home, tiny_pair):
    """The top tier opens the answer, so no tier read the prompt's last position before it."""
    small, large = str(tiny_pair[0]), str(tiny_pair[1])
    result = CliRunner().invoke(
        app,
        ["chat", "--small", small, "--large", large, "--max-tokens", "6", "--json"]
        + ["--tau", "2", "--verify", "-p", "hi"],
    )
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["router"]["initial_entropy"] is None and "initial_signal" not in record["router"]
    assert record["tokens"][0]["tier"] == "large"


@pytest.mark.parametrize("corrupt_every", [0, 5])
def test_lookup_drafts_are_kept_marked_and_counted(pair, monkeypatch, corrupt_every):
    """Lookup offers the top tier's own answer (every n-th token wrong): what the check keeps is
    marked, counted and shown, and the answer is still the top tier's."""
    from mlxswitch.cli.ui import status_line

    (alone,) = _answers_for(pair, RouterConfig(up=(-INF,)), 40, PROMPTS[:1])
    reference = [e.id for e in alone.tokens]

    def oracle(ids, start, max_tokens, **_):
        at = len(ids) - prompt_length[0]
        offer = reference[at : at + max_tokens]
        if corrupt_every:
            offer = [t if (at + j) % corrupt_every else (t + 1) % 300 for j, t in enumerate(offer)]
        return offer

    prompt_length = [0]
    original = verify.VerifyLoop.rounds

    def rounds(self, budget):
        prompt_length[0] = self.sequence.prompt_tokens
        return original(self, budget)

    class OracleIndex:
        found_at = -1  # offered as if copied from the prompt: the planner takes it as such

        def draft(self, ids, max_tokens):
            return oracle(ids, 0, max_tokens)

    monkeypatch.setattr(round_models, "LookupIndex", OracleIndex)
    monkeypatch.setattr(verify.VerifyLoop, "rounds", rounds)
    (answer,) = _answers_for(
        pair, _verify(2.0, "adaptive", lookup=True), 40, PROMPTS[:1], measure_signals=True
    )
    assert [e.id for e in answer.tokens] == reference
    marked = [e for e in answer.tokens if e.source == "lookup"]
    assert marked, "the free drafts of the text were never taken"
    # A looked-up token is the top tier's own, checked in a batch: its tier, its distribution.
    assert all(e.tier == "large" and e.tried == () and e.entropy is not None for e in marked)
    assert all(e.record()["source"] == "lookup" for e in marked)
    assert answer.stats()["sources"] == {"lookup": len(marked)}
    assert all(e.record()["proposer"] == "lookup" for e in marked)
    proposers = answer.stats()["proposers"]
    assert proposers["lookup"] == len(marked) and sum(proposers.values()) == answer.generated
    assert answer.checked_by == "large" and answer.stats()["checked_by"] == "large"
    shares = {n: f"{100 * proposers.get(n, 0) / answer.generated:.0f}%" for n in ("small", "lookup", "large")}
    assert (
        f"proposed by small {shares['small']} · lookup {shares['lookup']} · large {shares['large']} "
        "· large checked every token"
    ) in status_line(answer).plain


def test_where_the_seconds_went_adds_up(pair):
    for answer in _answers(pair, _verify(2.0, "adaptive", lookup=True), 30):
        passes = answer.stats()["passes"]
        booked = sum(v["seconds"] for k, v in passes.items() if k != "rest_s")
        assert booked + passes["rest_s"] == pytest.approx(answer.elapsed_s, abs=0.02)
        assert "large prefill" in passes  # the top tier opens the answer
        assert sum(v["passes"] for k, v in passes.items() if k.startswith("large")) >= 1


def test_threads_change_no_answer(pair):
    """Greedy tokens are the same at one BLAS thread and at every core (the pair's verified and
    single-tier answers alike): threads change the rounding of a sum, not the answer."""
    from mlxswitch.kernels._common import set_blas_threads

    answers = {}
    for threads in (1, 2):
        set_blas_threads(threads)
        answers[threads] = [
            [e.id for e in a.tokens]
            for config in (RouterConfig(up=(-INF,)), _verify(2.0, "adaptive", lookup=True))
            for a in _answers(pair, config, 40)
        ]
    assert answers[1] == answers[2]


@pytest.mark.parametrize("ladder_name", ["pair", "twin"])
@pytest.mark.parametrize("draft", ["fixed", "adaptive"])
def test_on_lazy_passes_the_pipelined_loop_gives_the_top_tiers_answer(request, ladder_name, draft):
    """On a route whose passes stay lazy (a Mac's; MLX ops forced here) the top tier's next one-row
    pass is queued before its token is read, and becomes the next check's first row: the answer is
    still the top tier's, token for token, drafted rounds and lookup rounds alike."""
    from mlxswitch.kernels.route import kernels_override

    ladder = request.getfixturevalue(ladder_name)
    with kernels_override("mx"):
        top = _answers(ladder, RouterConfig(up=(-INF,)), 50)
        checked = _answers(ladder, _verify(2.0, draft, lookup=draft == "adaptive"), 50)
    for alone, ours in zip(top, checked, strict=True):
        assert [e.id for e in ours.tokens] == [e.id for e in alone.tokens]
        assert ours.finish_reason == alone.finish_reason


def test_only_lazy_passes_on_separate_caches_are_pipelined(pair, tiny_gears_4_8):
    """The NumPy route computes a pass as it is built (queuing it ahead overlaps nothing), and a
    gear ladder's bottom gear would write its draft into the top gear's cache first."""
    from mlxswitch.kernels.route import kernels_override

    def pipelined(ladder) -> bool:
        return verify.VerifyLoop(ladder, [1, 2, 3], 2.0, lambda x: x).pass_mode.pipelined

    gears = gear_ladder(tiny_gears_4_8, [4, 8])
    with kernels_override("auto"):
        assert not pipelined(pair)
    with kernels_override("mx"):
        assert pipelined(pair) and not pipelined(gears)


def test_the_top_tiers_signals_are_read_where_a_reader_asks_and_are_its_own(pair):
    """Unasked, the top tier's tokens carry no entropy (no router reads it: the planner measures
    lazily); asked (chat --shade, serve), each is the top tier's own, as when it decodes alone."""
    config = _verify(2.0, "adaptive", lookup=True)
    (alone,) = _answers_for(pair, RouterConfig(up=(-INF,)), 30, PROMPTS[:1], measure_signals=True)
    (unasked,) = _answers_for(pair, config, 30, PROMPTS[:1])
    (asked,) = _answers_for(pair, config, 30, PROMPTS[:1], measure_signals=True)
    assert [e.id for e in unasked.tokens] == [e.id for e in asked.tokens] == [e.id for e in alone.tokens]
    top = [i for i, e in enumerate(asked.tokens) if e.tier == "large"]
    assert top and all(unasked.tokens[i].entropy is None for i in top)
    for i in top:
        assert asked.tokens[i].entropy == pytest.approx(alone.tokens[i].entropy, abs=1e-3)


def test_the_top_tier_catches_up_only_on_ids_it_did_not_make(pair, twin):
    """Fed its own last token (its next input) the top tier is not catching up: alone in every
    round (threshold 0: nothing is drafted) it catches up on nothing; drafting, on the drafted ids."""
    for answer in _answers(pair, _verify(0.0), 20):
        assert answer.catch_up_tokens["large"] == 0
    for answer in _answers(twin, _verify(INF), 20):  # every draft kept
        assert answer.catch_up_tokens["large"] >= answer.tier_counts["small"] > 0
