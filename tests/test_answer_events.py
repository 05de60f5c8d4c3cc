"""When a token's event is handed out: at once when its text is final, held to the next step (or
the end) while a stop string's beginning or the detokenizer's bytes may still add to it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from mlx_lm.tokenizer_utils import NaiveStreamingDetokenizer

from mlxswitch.decoding.answer import AnswerBuilder
from mlxswitch.decoding.steps import Step
from mlxswitch.models.sources import load_model


@pytest.fixture(scope="module")
def tokenizer(tiny_pair):
    return load_model(str(tiny_pair[0])).tokenizer


def _builder(tokenizer, stop: tuple[str, ...] = ()) -> AnswerBuilder:
    return AnswerBuilder("prompt", tokenizer, stop, ["model"], 3, 3, ["model"], {"model": 0})


def _step(token: int) -> Step:
    return Step(token=token, rung=0, entropy=1.0, mean=None, guard=False, tried=(0,), tried_signals=(1.0,))


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def test_each_token_is_handed_out_when_it_is_made(tokenizer):
    builder = _builder(tokenizer)
    ids = _ids(tokenizer, "the_cat_sat_on_the_mat")  # no space: every token's bytes are text at once
    streamed = []
    for i, token in enumerate(ids):
        released = builder.add(_step(token))
        assert [e.index for e in released] == [i]  # this step's own event, not the one before
        streamed += [e.text for e in released]
    last, summary = builder.finish("length", None, 0.0)
    assert last is None
    assert "".join(streamed) == summary.text == tokenizer.decode(ids)


def test_a_possible_stop_string_holds_the_event_until_the_next_step(tokenizer):
    builder = _builder(tokenizer, stop=("##",))
    first, hash_, after = _ids(tokenizer, "cat")[0], _ids(tokenizer, "#")[0], _ids(tokenizer, "x")[0]
    assert [e.index for e in builder.add(_step(first))] == [0]
    assert builder.add(_step(hash_)) == ()  # "#" may begin "##": its text is not final yet
    released = builder.add(_step(after))
    assert [(e.index, e.text) for e in released] == [(1, ""), (2, "#x")]
    last, summary = builder.finish("length", None, 0.0)
    assert last is None and summary.text.endswith("#x")


def test_a_held_event_gets_the_end_s_text_and_an_interrupted_one_is_dropped(tokenizer):
    space = _ids(tokenizer, " ")
    assert len(space) == 1
    builder = _builder(tokenizer)
    builder.add(_step(_ids(tokenizer, "cat")[0]))
    assert builder.add(_step(space[0])) == ()  # the detokenizer holds a lone space
    last, summary = builder.finish("length", None, 0.0)
    assert last is not None and last.index == 1 and last.text == " "
    assert summary.tokens[-1] == last

    builder = _builder(tokenizer)
    builder.add(_step(_ids(tokenizer, "cat")[0]))
    builder.add(_step(space[0]))
    last, summary = builder.finish("interrupted", None, 0.0)
    assert last is None and len(summary.tokens) == 1  # nobody received the held one


def test_a_detokenizer_that_may_hold_text_after_any_token_holds_every_event(tokenizer):
    builder = _builder(SimpleNamespace(detokenizer=NaiveStreamingDetokenizer(tokenizer)))
    ids = _ids(tokenizer, "the cat sat")
    assert builder.add(_step(ids[0])) == ()
    assert [e.index for e in builder.add(_step(ids[1]))] == [0]
    last, summary = builder.finish("length", None, 0.0)
    assert last is not None and last.index == 1
    assert summary.text == tokenizer.decode(ids[:2])
