"""Pass costs learned by verified drafting are kept for the next run (mlxswitch/draft_store.py)."""

from __future__ import annotations

import pytest

from mlxswitch.decoding.tiers import pair_ladder
from mlxswitch.draft_store import load_draft_costs, save_draft_costs, store_path
from mlxswitch.kernels._common import set_blas_threads
from mlxswitch.models.sources import load_model


@pytest.fixture(scope="module")
def models(tiny_pair):
    small, large = tiny_pair
    return load_model(str(small)), load_model(str(large))


def test_costs_timed_in_one_run_are_there_in_the_next(models):
    first = pair_ladder(*models)
    first.draft_memory.check.record(1, 0.3)
    first.draft_memory.check.record(9, 1.1)
    first.draft_memory.draft.record(1, 0.12)
    first.draft_memory.binned.record([0.0] * 10, 10)
    save_draft_costs(first)
    later = pair_ladder(*models)
    assert load_draft_costs(later)
    assert later.draft_memory.check.seconds == {1: 0.3, 9: 1.1}
    assert later.draft_memory.draft.seconds == {1: 0.12}
    # The kept share belongs to the text, not the machine: it starts from the prior again.
    assert not any(later.draft_memory.binned.kept)


def test_another_thread_count_is_another_machine(models):
    ladder = pair_ladder(*models)
    ladder.draft_memory.check.record(1, 0.3)
    set_blas_threads(1)
    save_draft_costs(ladder)
    set_blas_threads(2)
    assert not load_draft_costs(pair_ladder(*models))


def test_an_unreadable_store_is_timed_again_and_an_unwritable_one_skipped(models, tmp_path, monkeypatch):
    ladder = pair_ladder(*models)
    path = store_path(ladder)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    assert not load_draft_costs(ladder)
    assert not ladder.draft_memory.check.known
    ladder.draft_memory.check.record(1, 0.3)
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("MLXSWITCH_HOME", str(blocked / "home"))  # a path through a file
    save_draft_costs(ladder)  # no error: learning is never a reason to fail


@pytest.mark.parametrize("batched", [False, True])
def test_a_sessions_answers_keep_the_costs_they_timed_alone_or_in_a_servers_batch(models, batched):
    """The engine keeps what drafting learned after every answer, where the session was opened to
    keep it (api.open_chat): a library's or a server's answers as much as a chat's."""
    from batch_helpers import Collector, run_batch

    from mlxswitch.decoding.engine import Engine
    from mlxswitch.decoding.mode import DecodingMode
    from mlxswitch.decoding.session import ChatSession, GenerationSettings
    from mlxswitch.routing.router import RouterConfig

    ladder = pair_ladder(*models)
    assert not load_draft_costs(ladder)  # nothing kept yet
    session = ChatSession(
        ladder,
        RouterConfig(up=(2.0,)),
        GenerationSettings(max_tokens=12),
        decoding=DecodingMode(verify=True, draft="adaptive"),
        keep_learned=save_draft_costs,
    )
    if batched:
        engine = Engine(session, max_batch=2)
        collector = Collector()
        engine.add(session.prepare_text("Count: one two three"), collector)
        run_batch(engine)
        assert collector.summary is not None
    else:
        session.ask("Count: one two three")
    later = pair_ladder(*models)
    assert load_draft_costs(later) and later.draft_memory.check.seconds == ladder.draft_memory.check.seconds
