"""The cloud tier end to end: the real anthropic SDK against the loopback server, tiny local models."""

from __future__ import annotations

import json
import socket

import mlx.core as mx
import pytest
from cloud_server import CloudServer, error, garbage, isolate_network, reply, stream_error
from mlx_lm import load
from typer.testing import CliRunner

from mlxswitch.api import open_chat, resolve_profile
from mlxswitch.cli import app
from mlxswitch.decoding.session import GenerationSettings

MARKER = "sk-ant-MARKER-9d1f"
PROMPTS = "What is the capital of France?\nName a colour.\n"
SPAN = "Paris is the capital of France."
runner = CliRunner()


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch):
    """The marker key, no proxy, and nothing from the environment that could reach the network."""
    isolate_network(monkeypatch)
    monkeypatch.setenv("ANTHROPIC_API_KEY", MARKER)


@pytest.fixture
def server(monkeypatch):
    with CloudServer() as s:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", s.url)
        yield s


@pytest.fixture(scope="module")
def pair(tiny_pair):
    small, large = tiny_pair
    return ["--small", str(small), "--large", str(large)]


# peek on the pair: the large model redoes every position (up 0), and after 3 tokens at the top
# local rung whose mean is above 0 bits the policy climbs to the cloud.
SPANNING = [
    "--cloud",
    "span",
    "--policy",
    "peek",
    "--tau",
    "0,0",
    "--min-run",
    "3",
    "--window",
    "1",
    "--cloud-timeout",
    "2",
]


def chat(args, stdin=PROMPTS):
    result = runner.invoke(app, ["chat", *args], input=stdin)
    assert not result.exception or isinstance(result.exception, SystemExit), result.exception
    return result


def records(result):
    return [json.loads(line) for line in result.stdout.splitlines()]


def notes(result):
    return [line for line in result.stderr.splitlines() if line.startswith(("note:", "error:"))]


def no_marker(*texts):
    for text in texts:
        assert MARKER not in text


def test_spans_are_cloud_tokens_fed_back_to_the_local_caches(server, pair, tmp_path):
    server.script(
        reply(SPAN, output_tokens=8, input_tokens=30, cache_read=10),
        reply("It is big.", output_tokens=4, input_tokens=40),
        *[reply("Blue is one.", output_tokens=5, input_tokens=20)] * 4,
    )
    telemetry = tmp_path / "t.jsonl"
    result = chat([*pair, *SPANNING, "--json", "--max-tokens", "24", "--telemetry", str(telemetry)])
    assert result.exit_code == 0, result.stderr
    first, second = records(result)
    tiers = [t["tier"] for t in first["tokens"]]
    assert first["router"]["tiers"] == ["small", "large", "cloud"]
    assert "cloud" in tiers and "large" in tiers[tiers.index("cloud") :]  # local text after a span
    assert all(t["entropy"] is None for t in first["tokens"] if t["tier"] == "cloud")
    assert all(t["entropy"] is not None for t in first["tokens"] if t["tier"] != "cloud")
    assert SPAN in first["text"] and first["text"] == "".join(t["text"] for t in first["tokens"])
    cloud = first["stats"]["cloud"]
    spans = cloud["spans"]
    assert spans[0]["text"] == SPAN and sum(s["tokens"] for s in spans) == tiers.count("cloud")
    # Costs from the usage fields: Haiku 4.5 at $1 in, $5 out, $0.10 cache read per million.
    assert spans[0]["usd"] == pytest.approx((30 * 1 + 8 * 5 + 10 * 0.1) / 1e6)
    assert cloud["answer"]["usd"] == pytest.approx(sum(s["usd"] for s in spans), abs=1e-6)
    assert cloud["answer"]["calls"] == len(spans) >= 1 and first["stats"]["tiers"]["cloud"] == tiers.count(
        "cloud"
    )
    assert second["stats"]["cloud"]["session"]["usd"] == pytest.approx(
        cloud["answer"]["usd"] + second["stats"]["cloud"]["answer"]["usd"], abs=1e-6
    )
    # The large model caught up on the cloud tokens: the catch-up counts them.
    assert first["stats"]["catch_up_tokens"]["large"] >= spans[0]["tokens"]
    # What went up: the question and the answer so far in the user turn, never an assistant prefill.
    sent = server.requests[0].body
    assert (
        sent["messages"][-1]["role"] == "user"
        and "What is the capital of France?" in sent["messages"][-1]["content"]
    )
    assert sent["max_tokens"] == 48
    assert notes(result) == []
    no_marker(result.stdout, result.stderr, telemetry.read_text())
    assert any(rec.get("tier") == "cloud" for rec in map(json.loads, telemetry.read_text().splitlines()))


def test_the_next_local_token_is_conditioned_on_the_cloud_tokens(server, tiny_pair):
    server.script(reply(SPAN, output_tokens=8))
    small, large = tiny_pair
    profile = resolve_profile(
        small=str(small),
        large=str(large),
        cloud="span",
        policy="peek",
        tau="0,0",
        min_run=3,
        window=1,
        cloud_options={"budget_calls": 1},
    )
    session = open_chat(profile, settings=GenerationSettings(max_tokens=24))
    summary = session.ask("What is the capital of France?")
    tiers = [e.tier for e in summary.tokens]
    after = tiers.index("cloud") + tiers[tiers.index("cloud") :].index(
        "large"
    )  # first local token after the span
    prompt_len = summary.prompt_tokens
    model, _ = load(str(large))

    def greedy_next(ids):
        return int(mx.argmax(model(mx.array(ids)[None])[0, -1]).item())

    with_span = session.conversation.ids[: prompt_len + after]
    assert summary.tokens[after].id == greedy_next(with_span)
    # Not vacuous: without the cloud tokens the large model would have said something else.
    without = [i for k, i in enumerate(with_span) if k < prompt_len or tiers[k - prompt_len] != "cloud"]
    assert greedy_next(without) != summary.tokens[after].id
    assert session.cloud.take_notices()[0].startswith("cloud call budget spent")


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(None, id="server-down"),
        pytest.param([error(401)], id="401"),
        pytest.param([error(429), error(429)], id="429"),
        pytest.param([error(529), error(529)], id="529"),
        pytest.param([garbage()], id="garbage"),
        pytest.param([stream_error("Paris is")], id="error-event-mid-stream"),
    ],
)
def test_cloud_failures_leave_a_local_answer_and_one_note(failure, pair, monkeypatch, tmp_path):
    telemetry = tmp_path / "t.jsonl"
    args = [*pair, *SPANNING, "--json", "--max-tokens", "16", "--telemetry", str(telemetry)]
    if failure is None:
        with socket.socket() as probe:  # a port nobody listens on: the connection is refused
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://127.0.0.1:{port}")
        result = chat(args)
    else:
        with CloudServer(*failure) as s:
            monkeypatch.setenv("ANTHROPIC_BASE_URL", s.url)
            result = chat(args)
    assert result.exit_code == 0, result.stderr
    answers = records(result)
    assert len(answers) == 2
    for answer in answers:
        assert answer["stats"]["generated"] == 16  # every token there: the local tiers went on
        assert all(t["tier"] != "cloud" for t in answer["tokens"])
    [note] = notes(result)  # once per session, though both answers climbed to the cloud
    assert note.startswith("note: cloud tier") and "going on locally" in note
    no_marker(result.stdout, result.stderr, telemetry.read_text())


def test_budget_exhaustion_is_said_once(server, pair):
    server.script(reply(SPAN, output_tokens=8))
    result = chat([*pair, *SPANNING, "--json", "--max-tokens", "16", "--cloud-calls", "1"])
    assert result.exit_code == 0, result.stderr
    first, second = records(result)
    assert first["stats"]["cloud"]["answer"]["calls"] == 1
    assert second["stats"]["cloud"]["answer"]["calls"] == 0 and second["stats"]["generated"] == 16
    [note] = notes(result)
    assert "cloud call budget spent (1 of 1 calls)" in note and len(server.requests) == 1


def test_answer_hand_off_carries_both_answers_score_and_decision(server, pair):
    server.script(reply("Paris.", output_tokens=2))
    result = chat(
        [*pair, "--cloud", "answer", "--cloud-threshold", "0", "--json", "--max-tokens", "8"],
        "What is the capital of France?\n",
    )
    assert result.exit_code == 0, result.stderr
    [record] = records(result)
    handoff = record["handoff"]
    assert handoff["decision"] == "cloud" and handoff["shown"] == "cloud" and handoff["score"] > 0
    assert record["text"] == handoff["cloud_text"] == "Paris."
    assert handoff["local_text"] == "".join(t["text"] for t in record["tokens"])
    assert record["router"]["tiers"] == ["small", "large"]  # no cloud rung in answer mode
    assert record["stats"]["cloud"]["answer"]["calls"] == 1
    assert server.requests[0].body["messages"] == [
        {"role": "user", "content": "What is the capital of France?"}
    ]
    # Piped without --json: stdout holds only the answer shown; the status line says which.
    server.script(reply("Paris.", output_tokens=2))
    plain = chat(
        [*pair, "--cloud", "answer", "--cloud-threshold", "0", "--max-tokens", "8"],
        "What is the capital of France?\n",
    )
    assert plain.stdout == "Paris.\n" and "answer: cloud (score" in plain.stderr
    sure = chat(
        [*pair, "--cloud", "answer", "--cloud-threshold", "100", "--json", "--max-tokens", "8"],
        "What is the capital of France?\n",
    )
    [kept] = records(sure)
    assert kept["handoff"]["decision"] == "local" and kept["text"] == kept["handoff"]["local_text"]


def test_no_key_is_one_error_line_before_anything_loads(pair, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    # The models do not exist: a key check after loading would fail on them (exit 4) instead.
    result = chat(
        ["--small", "/nonexistent/a", "--large", "/nonexistent/b", "--cloud", "span", "--tau", "1,2"]
    )
    assert result.exit_code == 8
    assert result.stderr.strip().splitlines() == [
        "error: no ANTHROPIC_API_KEY set: export your Anthropic API key to use the cloud tier, "
        "or leave it off"
    ]


def test_cloud_off_runs_a_cascade_locally_and_options_need_a_cloud(pair, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY")  # no key needed when the cloud is off
    result = chat([*pair, "--cloud", "off", "--json", "--max-tokens", "4"], "Hi\n")
    assert result.exit_code == 0 and "cloud" not in records(result)[0]["stats"]
    bad = chat([*pair, "--cloud-budget", "1"], "Hi\n")
    assert bad.exit_code == 2 and "need a cloud tier" in bad.stderr
    worse = chat([*pair, "--cloud", "sky"], "Hi\n")
    assert worse.exit_code == 2 and "--cloud must be off, span or answer" in worse.stderr


def test_ctrl_c_during_a_span_cancels_it_and_keeps_the_local_text(server, tiny_pair, ctrl_c):
    import _thread
    import threading

    held = threading.Event()
    server.script(reply(SPAN, hold=held))  # the response waits until the interrupt is raised
    small, large = tiny_pair
    profile = resolve_profile(
        small=str(small),
        large=str(large),
        cloud="span",
        policy="peek",
        tau="0,0",
        min_run=3,
        window=1,
        cloud_options={"timeout_s": 60},
    )
    session = open_chat(profile, settings=GenerationSettings(max_tokens=24))
    stop = threading.Event()

    def interrupt_once_the_span_is_asked() -> None:
        # Timed from the cloud request's arrival, not a clock (on a loaded machine a fixed delay
        # can land while the local model still decodes); the server holds its reply until then.
        while not server.requests:
            if stop.wait(0.01):
                return
        if not stop.wait(0.2):
            _thread.interrupt_main()
        held.set()

    watcher = threading.Thread(target=interrupt_once_the_span_is_asked, daemon=True)
    watcher.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            session.ask("What is the capital of France?")
    finally:
        stop.set()
        watcher.join()
    summary = session.last_summary
    assert summary.finish_reason == "interrupted" and summary.generated >= 1
    assert all(e.tier != "cloud" for e in summary.tokens)
    assert session.cloud.client.budget.session.calls == 1  # the cancelled call is counted


def test_an_empty_answer_leaves_no_turn_and_the_next_span_still_goes_up(server, tiny_pair):
    server.script(reply(SPAN, output_tokens=8))
    small, large = tiny_pair
    profile = resolve_profile(
        small=str(small),
        large=str(large),
        cloud="span",
        policy="peek",
        tau="0,0",
        min_run=3,
        window=1,
        cloud_options={"budget_calls": 1},
    )
    session = open_chat(profile, settings=GenerationSettings(max_tokens=16))
    tokenizer = session.ladder.tokenizer
    eos = set(tokenizer.eos_token_ids)
    tokenizer.eos_token_ids = range(session.ladder.vocab_size)  # every token ends the answer at once
    try:
        empty = session.ask("Name a colour.")
    finally:
        tokenizer.eos_token_ids = eos
    assert empty.text == "" and empty.finish_reason == "stop"
    assert all(m["content"].strip() for m in session.conversation.messages)  # no empty assistant turn
    summary = session.ask("What is the capital of France?")
    assert summary.cloud["spans"][0]["text"] == SPAN and summary.cloud["answer"]["calls"] == 1
    sent = server.requests[0].body["messages"]
    assert all(m["content"].strip() for m in sent) and sent[-1]["role"] == "user"
    assert [m["role"] for m in session.conversation.messages][-2:] == ["user", "assistant"]


def test_the_library_hands_off_as_the_chat_does(server, tiny_pair):
    """The hand-off is the session's, not the CLI's: a library caller's unsure answer is re-asked,
    and the conversation keeps the cloud's answer."""
    small, large = tiny_pair
    profile = resolve_profile(
        small=str(small), large=str(large), cloud="answer", cloud_options={"handoff_threshold": 0.0}
    )
    server.script(reply("Paris.", output_tokens=2))
    session = open_chat(profile, GenerationSettings(max_tokens=8))
    summary = session.ask("What is the capital of France?")
    assert summary.handoff is not None and summary.handoff["shown"] == "cloud"
    assert summary.handoff["local_text"] == summary.text and summary.cloud["answer"]["calls"] == 1
    assert session.conversation.messages[-1] == {"role": "assistant", "content": "Paris."}
