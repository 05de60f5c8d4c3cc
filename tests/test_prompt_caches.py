"""Kept conversations (serve's --prompt-cache-size): a client that comes back after another one
reuses its own caches, and its answer is token for token what a fresh session gives."""

from __future__ import annotations

import pytest

from mlxswitch.api import build_ladder, resolve_profile
from mlxswitch.decoding.prompt_caches import KEEP_MIN_DROPPED, PromptCaches
from mlxswitch.decoding.session import ChatSession, GenerationSettings
from mlxswitch.errors import UsageError

# Long enough that leaving either conversation drops more than KEEP_MIN_DROPPED held tokens.
FIRST = "Tell me about the river, the bridge and the old mill by the water. " * 4
SECOND = "List some colours of the sky at dusk, and of the sea at dawn, please. " * 4


ROUTED = dict(tau="1.5", tau_down="1.0", window=2, min_run=2)
VERIFIED = dict(tau="3.0", verify=True)


@pytest.fixture(scope="module", params=[ROUTED, VERIFIED], ids=["routed", "verified"])
def pair(tiny_pair, request):
    small, large = tiny_pair
    # Thresholds that make the pair switch, so the two caches hold different counts of ids.
    profile = resolve_profile(small=str(small), large=str(large), **request.param)
    return profile, build_ladder(profile)


def _answer(session: ChatSession, messages: list[dict]):
    for _ in session.stream_conversation(messages):
        pass
    return session.last_summary


def _tokens(summary) -> list[tuple[int, str]]:
    return [(t.id, t.tier) for t in summary.tokens]


def test_a_client_returning_after_another_reuses_its_caches_and_answers_the_same(pair):
    profile, ladder = pair
    settings = GenerationSettings(max_tokens=12)
    kept = ChatSession(
        ladder, profile.router, settings, decoding=profile.decoding, prompt_caches=PromptCaches(2)
    )
    first = [{"role": "user", "content": FIRST}]
    answer = _answer(kept, first)
    assert len(kept.render(first)) > KEEP_MIN_DROPPED + 8
    _answer(kept, [{"role": "user", "content": SECOND}])  # another client: the first is kept
    assert len(kept.prompt_caches) == 1 and kept.prompt_caches.nbytes > 0
    again = _next_turn(first, answer)
    returned = _answer(kept, again)
    prompt = len(kept.render(again))
    assert returned.prefilled_tokens < prompt - len(kept.render(first)) + 8  # its history was kept

    # The same ladder, its caches started over.
    fresh = ChatSession(ladder, profile.router, settings, decoding=profile.decoding)
    fresh.reset()
    alone = _answer(fresh, again)
    assert alone.prefilled_tokens == prompt
    assert _tokens(returned) == _tokens(alone)
    if not profile.decoding.verify:  # (verified drafting feeds both caches whichever tier's token it keeps)
        assert {tier for _, tier in _tokens(alone)} == {"small", "large"}  # both caches were in play


def _fresh(pair, kept: int) -> ChatSession:
    profile, ladder = pair
    session = ChatSession(
        ladder,
        profile.router,
        GenerationSettings(max_tokens=6),
        decoding=profile.decoding,
        prompt_caches=PromptCaches(kept),
    )
    session.reset()
    return session


def _next_turn(first: list[dict], answer) -> list[dict]:
    return first + [{"role": "assistant", "content": answer.text}, {"role": "user", "content": "And then?"}]


def test_without_kept_conversations_the_returning_client_prefills_again(pair):
    session = _fresh(pair, 0)
    first = [{"role": "user", "content": FIRST}]
    answer = _answer(session, first)
    _answer(session, [{"role": "user", "content": SECOND}])
    returned = _answer(session, _next_turn(first, answer))
    assert len(session.prompt_caches) == 0
    assert returned.prefilled_tokens > len(session.render(first)) - 8  # only the template's head shared


def test_the_same_conversation_going_on_keeps_no_copy(pair):
    session = _fresh(pair, 2)
    first = [{"role": "user", "content": FIRST}]
    _answer(session, _next_turn(first, _answer(session, first)))
    assert len(session.prompt_caches) == 0  # nothing was left behind: no copy made


def test_a_negative_size_is_a_usage_error():
    with pytest.raises(UsageError, match="--prompt-cache-size must be ≥ 0"):
        PromptCaches(-1)


# Four clients, each opening with a different long question (the template's head is all they share).
CLIENTS = {
    name: [{"role": "user", "content": text * 4}]
    for name, text in {
        "A": "Tell me about the river, the bridge and the old mill by the water. ",
        "B": "List some colours of the sky at dusk, and of the sea at dawn, please. ",
        "C": "Which birds sing in the morning near the forest and the quiet lake? ",
        "D": "Describe a small town market on a sunny Saturday with fruit stalls. ",
    }.items()
}


@pytest.fixture(scope="module")
def routed(tiny_pair):
    small, large = tiny_pair
    profile = resolve_profile(small=str(small), large=str(large), **ROUTED)
    return profile, build_ladder(profile)


def _started(routed, caches: PromptCaches) -> ChatSession:
    """A session with new (empty) caches, so every run of a scenario keeps arrays of equal sizes."""
    profile, ladder = routed
    for group in ladder.groups:
        group.reset()
    session = ChatSession(
        ladder,
        profile.router,
        GenerationSettings(max_tokens=6),
        decoding=profile.decoding,
        prompt_caches=caches,
    )
    session.reset()
    return session


def _who(session: ChatSession) -> list[str]:
    """The clients whose conversations are kept, least recently used first."""
    assert session.prompt_caches is not None
    prompts = {name: tuple(session.render(messages)) for name, messages in CLIENTS.items()}
    return [
        next(name for name, ids in prompts.items() if kept[: len(ids)] == ids)
        for kept in session.prompt_caches.kept
    ]


def test_the_count_bound_evicts_the_least_recently_used_not_the_first_kept(routed):
    session = _started(routed, PromptCaches(2))
    answers = {name: _answer(session, CLIENTS[name]) for name in "ABC"}
    assert _who(session) == ["A", "B"]  # C is the one in use
    back = _answer(session, _next_turn(CLIENTS["A"], answers["A"]))  # A comes back: taken, C kept
    assert back.prefilled_tokens < back.prompt_tokens - len(session.render(CLIENTS["A"])) + 8
    assert _who(session) == ["B", "C"]
    _answer(session, CLIENTS["D"])  # keeping A (used after B) is one too many: B goes, not A
    assert _who(session) == ["C", "A"] and len(session.prompt_caches) == 2


def test_the_byte_bound_evicts_the_least_recently_used(routed):
    unbounded = _started(routed, PromptCaches(10))
    sizes = []
    for name in "ABCD":
        _answer(unbounded, CLIENTS[name])
        sizes.append(unbounded.prompt_caches.nbytes - sum(sizes))
    assert _who(unbounded) == ["A", "B", "C"] and all(size > 0 for size in sizes[1:])
    a, b, c = sizes[1:]  # what keeping A, then B, then C added

    session = _started(routed, PromptCaches(10, max_bytes=b + c))
    for name in "ABCD":
        _answer(session, CLIENTS[name])
    assert _who(session) == ["B", "C"]  # A out for the bytes; the count allowed ten
    assert session.prompt_caches.nbytes == b + c <= session.prompt_caches.max_bytes
    assert a > 0


def test_a_conversation_larger_than_the_byte_bound_is_not_kept(routed):
    session = _started(routed, PromptCaches(10, max_bytes=1024))
    for name in "AB":
        _answer(session, CLIENTS[name])
    assert len(session.prompt_caches) == 0 and session.prompt_caches.nbytes == 0
    nothing = _started(routed, PromptCaches(10, max_bytes=0))
    for name in "AB":
        _answer(nothing, CLIENTS[name])
    assert len(nothing.prompt_caches) == 0


def test_a_negative_byte_bound_is_a_usage_error():
    with pytest.raises(UsageError, match="--prompt-cache-bytes must be ≥ 0"):
        PromptCaches(2, max_bytes=-1)
