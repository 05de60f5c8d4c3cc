"""The cloud tier: the real anthropic SDK against a loopback Messages API server (no network)."""

from __future__ import annotations

import _thread
import json
import logging
import socket
import threading
import time

import anthropic
import pytest
from cloud_server import CloudServer, drop, error, garbage, isolate_network, reply, slow, stream_error

from mlxswitch.cloud import (
    PRICES_TAKEN,
    CloudBudget,
    CloudBudgetExhausted,
    CloudClient,
    CloudFailure,
    CloudInterrupted,
    CloudSettings,
    Price,
    cloud_settings,
    cost_usd,
    join_continuation,
    price_for,
    require_key,
    strip_repeated_prefix,
    usage_counts,
)
from mlxswitch.cloud.span import SpanSplicer
from mlxswitch.errors import CloudError, UsageError

MARKER = "sk-ant-MARKER-123"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch):
    """No proxy, no base URL or headers from the environment: requests go to our server only."""
    isolate_network(monkeypatch)


@pytest.fixture
def server():
    with CloudServer() as s:
        yield s


def make_client(server, **values) -> CloudClient:
    values = {"timeout_s": 1.0, "max_retries": 0, **values}
    return CloudClient(cloud_settings(**values), api_key=MARKER, base_url=server.url)


# --- settings, prices, budget ---


def test_settings_defaults_are_valid_and_priced():
    s = cloud_settings()
    assert s == CloudSettings()
    assert (s.model, s.span_tokens, s.timeout_s) == ("claude-haiku-4-5", 48, 15.0)
    assert (s.budget_usd, s.budget_calls, s.max_retries, s.prices) == (0.05, 20, 1, None)
    assert s.price == Price(1.0, 5.0, 1.25, 0.10)
    assert PRICES_TAKEN.startswith("20")


@pytest.mark.parametrize(
    "values, message",
    [
        ({"modle": "x"}, "unknown cloud setting 'modle'"),
        ({"model": ""}, "cloud model must be a model id"),
        ({"model": "claude haiku"}, "cloud model must be a model id"),
        ({"span_tokens": 0}, "cloud span tokens must be a whole number from 1 to 1024, got 0"),
        ({"span_tokens": 4.5}, "cloud span tokens must be a whole number"),
        ({"span_tokens": True}, "cloud span tokens must be a whole number"),
        ({"answer_tokens": 10**6}, "cloud answer tokens must be a whole number from 1 to 64000"),
        ({"timeout_s": 0}, "cloud timeout must be a number of seconds above 0 and at most 600, got 0"),
        ({"timeout_s": float("nan")}, "cloud timeout must be"),
        ({"timeout_s": "15"}, "cloud timeout must be"),
        ({"budget_usd": -0.01}, "cloud budget must be a dollar amount of 0 or more, got -0.01"),
        ({"budget_usd": float("inf")}, "cloud budget must be a dollar amount"),
        ({"budget_calls": -1}, "cloud call budget must be a whole number of 0 or more, got -1"),
        ({"max_retries": 9}, "cloud retries must be a whole number from 0 to 5, got 9"),
        ({"prices": [1]}, "cloud prices must be 2 or 4 numbers of 0 or more"),
        ({"prices": "1,x"}, "cloud prices must be 2 or 4 numbers"),
        ({"prices": {"input": 1, "outptu": 5}}, "cloud prices must be 2 or 4 numbers"),
        ({"prices": [1, -5]}, "cloud prices must be 2 or 4 numbers"),
    ],
)
def test_settings_reject_bad_values_with_one_line(values, message):
    with pytest.raises(UsageError) as info:
        cloud_settings(**values)
    assert message in str(info.value)
    assert "\n" not in str(info.value) and info.value.exit_code == 2
    assert info.value.key == next(iter(values))  # SettingError: a profile file can point at the line


def test_settings_prices_forms_and_unpriced_models():
    assert cloud_settings(prices="1,5").prices == Price.of(1, 5) == Price(1, 5, 1.25, 0.1)
    assert cloud_settings(prices=[1, 5, 2, 0.2]).prices == Price(1, 5, 2, 0.2)
    assert cloud_settings(prices={"input": 3, "output": 15}).prices == Price.of(3, 15)
    with pytest.raises(CloudError, match="no price known for cloud model 'claude-someday-9'") as info:
        cloud_settings(model="claude-someday-9")
    assert info.value.exit_code == 8
    assert cloud_settings(model="claude-someday-9", prices=(2, 10)).price == Price.of(2, 10)
    # Dated ids resolve to their alias's row.
    assert cloud_settings(model="claude-haiku-4-5-20251001").price == price_for("claude-haiku-4-5")
    assert price_for("claude-opus-4-20250514") == price_for("claude-opus-4-0") == Price(15, 75, 18.75, 1.5)
    assert price_for("claude-sonnet-4-5-20250929") == Price(3, 15, 3.75, 0.3)
    assert price_for("gpt-4") is None


def test_cost_uses_every_usage_field_and_tolerates_missing_ones():
    usage = {
        "input_tokens": 1000,
        "output_tokens": 200,
        "cache_creation_input_tokens": 400,
        "cache_read_input_tokens": 3000,
    }
    # Haiku 4.5: $1 in, $5 out, $1.25 cache write, $0.10 cache read per million.
    assert cost_usd("claude-haiku-4-5", usage) == pytest.approx(
        (1000 * 1 + 200 * 5 + 400 * 1.25 + 3000 * 0.1) / 1e6
    )
    assert usage_counts({"input_tokens": 5, "output_tokens": None}) == {
        "input_tokens": 5,
        "output_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    assert cost_usd("claude-haiku-4-5", {}) == 0.0
    sdk_usage = anthropic.types.Usage(input_tokens=10, output_tokens=2, cache_read_input_tokens=None)
    assert cost_usd("claude-opus-4-1", sdk_usage) == pytest.approx((10 * 15 + 2 * 75) / 1e6)
    with pytest.raises(CloudError):
        cost_usd("no-such-model", usage)


def test_budget_totals_per_answer_and_session():
    budget = CloudBudget(cloud_settings(budget_calls=3, budget_usd=1.0))
    first = budget.charge({"input_tokens": 100, "output_tokens": 10})
    budget.start_answer()
    second = budget.charge({"input_tokens": 50, "output_tokens": 5, "cache_read_input_tokens": 1000})
    budget.charge(None, failed=True)
    data = json.loads(json.dumps(budget.as_dict()))
    assert data["session"]["calls"] == 3 and data["session"]["failed_calls"] == 1
    assert data["session"]["input_tokens"] == 150 and data["session"]["cache_read_input_tokens"] == 1000
    assert data["session"]["usd"] == pytest.approx(round(first + second, 6))
    assert data["answer"]["calls"] == 2 and data["answer"]["output_tokens"] == 5
    assert data["limits"] == {"usd": 1.0, "calls": 3} and data["prices_taken"] == PRICES_TAKEN
    assert "3 of 3 calls" in budget.refusal()


def test_budget_refuses_a_call_that_could_overshoot():
    budget = CloudBudget(cloud_settings(budget_usd=0.001))
    assert budget.refusal(0.0009) is None
    assert "the next call could cost up to $0.0011" in budget.refusal(0.0011)


# --- the key ---


def test_require_key_before_any_model_loads(monkeypatch, server):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(CloudError, match="^no ANTHROPIC_API_KEY set: ") as info:
        require_key()
    assert info.value.exit_code == 8
    with pytest.raises(CloudError, match="no ANTHROPIC_API_KEY set"):
        CloudClient(cloud_settings(), base_url=server.url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "  ")
    with pytest.raises(CloudError):
        require_key()
    monkeypatch.setenv("ANTHROPIC_API_KEY", MARKER)
    assert require_key() == MARKER
    server.script(reply("Paris."))
    with CloudClient(
        cloud_settings(timeout_s=1.0), base_url=server.url
    ) as client:  # key from the environment
        assert client.answer(None, QUESTION).text == "Paris."
    headers = server.requests[0].headers
    assert (headers.get("x-api-key") or headers.get("authorization", "")).endswith(MARKER)


# --- splicing (pure) ---


@pytest.mark.parametrize(
    "partial, reply_text, expected",
    [
        ("The capital of", "The capital of France is Paris.", " France is Paris."),  # repeats it all
        ("The capital of ", "of France is Paris.", "France is Paris."),  # repeats the last word
        ("The capital of Fra", "France is Paris.", "nce is Paris."),  # completes a cut word
        ("It was a", "an apple.", "n apple."),  # the anchor word, completed
        ("The capital of", "France is Paris.", "France is Paris."),  # no repeat: unchanged
        ("The capital of", "  The capital of France", " France"),  # leading whitespace ignored
        ("I went to", "o the store", "o the store"),  # a repeat must start a word in the partial
        ("", "Paris.", "Paris."),
    ],
)
def test_strip_repeated_prefix(partial, reply_text, expected):
    assert strip_repeated_prefix(partial, reply_text) == expected


@pytest.mark.parametrize(
    "partial, reply_text, cut, expected",
    [
        ("The capital of", "of France is Paris.", False, " France is Paris."),
        ("The capital of", "France is Paris.", False, " France is Paris."),  # anchor ignored: a new word
        ("The capital of ", " France is Paris.", False, "France is Paris."),  # no double space
        ("The capital of Fra", "France is Paris.", False, "nce is Paris."),
        ("The capital of", " France", False, " France"),
        ("It is Paris.", "It has 2 million people.", False, " It has 2 million people."),
        ("A list:\n", "\n1. Paris", False, "\n1. Paris"),
        ("(", "see below)", False, "see below)"),
        ("", "  Paris is the capital.", False, "Paris is the capital."),
        ("The capital of", "of France is Paris. It has two million peo", True, " France is Paris."),
        (
            "The capital of",
            "of France is Paris. It has two million peo",
            False,
            " France is Paris. It has two million peo",
        ),
        ("The capital of", "of France is a city called", True, " France is a city called"),  # no end: keep
        ("Say", 'Say "hi." Then wave', True, ' "hi."'),
    ],
)
def test_join_continuation(partial, reply_text, cut, expected):
    assert join_continuation(partial, reply_text, cut) == expected


def test_splicer_streams_whole_sentences_and_holds_repeats():
    splicer = SpanSplicer("The capital of Fra")
    shown = [splicer.feed(p) for p in ["Fr", "ance is P", "aris. It h", "as two mil"]]
    assert shown == ["", "", "nce is Paris.", ""]  # a repeat is held until settled
    assert splicer.finish(cut=True) == ""
    assert splicer.text == "nce is Paris."
    pieces = "The capital of France is Paris. Its river is the Seine.\nMore"
    for size in (1, 3, 7, 100):
        s = SpanSplicer("The capital of")
        out = "".join(s.feed(pieces[i : i + size]) for i in range(0, len(pieces), size)) + s.finish(cut=False)
        assert out == join_continuation("The capital of", pieces) == pieces[len("The capital of") :]


# --- span calls against the server ---


def test_span_streams_a_continuation_and_sends_no_prefill(server):
    server.script(reply("of France is Paris. It lies on the Seine.", input_tokens=40, output_tokens=11))
    client = make_client(server, span_tokens=32)
    pieces = []
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, *QUESTION]
    got = client.continue_span("Be brief.", history, "The capital of", on_text=pieces.append)
    assert got.text == " France is Paris. It lies on the Seine."
    assert "".join(pieces) == got.text and len(pieces) >= 2  # streamed in sentences
    assert got.stop_reason == "end_turn" and got.model == "claude-haiku-4-5-20251001"
    assert got.usage == {
        "input_tokens": 40,
        "output_tokens": 11,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    assert got.cost_usd == pytest.approx((40 * 1 + 11 * 5) / 1e6) and got.elapsed_s < 1.0
    assert got.raw_text == "of France is Paris. It lies on the Seine."

    (sent,) = server.requests
    body = sent.body
    assert sent.path == "/v1/messages" and body["stream"] is True
    assert body["model"] == "claude-haiku-4-5" and body["max_tokens"] == 32 and body["system"] == "Be brief."
    assert "stop_sequences" not in body
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]  # ends on the user turn
    assert body["messages"][:2] == history[:2]
    last = body["messages"][-1]["content"]
    assert last.startswith(
        "What is the capital of France?\n\n<reply_so_far>\nThe capital of</reply_so_far>\n\n"
    )
    assert 'It stops at "of"' in last and "at most 24 words" in last and "No preamble" in last


def test_span_cut_at_max_tokens_ends_at_a_sentence(server):
    server.script(reply("France is Paris. It has two million peo", stop_reason="max_tokens"))
    pieces = []
    got = make_client(server).continue_span(None, QUESTION, "The capital of ", on_text=pieces.append)
    assert got.text == "".join(pieces) == "France is Paris."
    assert got.stop_reason == "max_tokens"
    assert "system" not in server.requests[0].body


def test_span_deadline_bounds_a_slow_trickle(server):
    server.script(reply("France is Paris, a city on a river called the Seine.", chunk=2, chunk_delay_s=0.05))
    client = make_client(server, timeout_s=0.3)
    start = time.monotonic()
    with pytest.raises(CloudFailure, match="too slow: no full reply within 0.3 s"):
        client.continue_span(None, QUESTION, "The capital of ")
    assert time.monotonic() - start < 1.0


def test_answer_hands_off_the_whole_conversation(server):
    server.script(
        reply("  Paris is the capital of France.", input_tokens=20, output_tokens=8, cache_read=100)
    )
    client = make_client(server, answer_tokens=256)
    pieces = []
    got = client.answer("sys", [{"role": "system", "content": "Be exact."}, *QUESTION], on_text=pieces.append)
    assert got.text == "".join(pieces) == "Paris is the capital of France."
    assert got.cost_usd == pytest.approx((20 * 1 + 8 * 5 + 100 * 0.1) / 1e6)
    body = server.requests[0].body
    assert body["max_tokens"] == 256 and body["messages"] == QUESTION and body["system"] == "sys\n\nBe exact."


def test_costs_add_up_over_calls(server):
    server.script(
        reply("Paris.", input_tokens=30, output_tokens=3, cache_creation=50),
        reply("of France is Paris.", input_tokens=45, output_tokens=6, cache_read=500),
    )
    client = make_client(server)
    a = client.answer(None, QUESTION)
    client.budget.start_answer()
    b = client.continue_span(None, QUESTION, "The capital of")
    expected = [(30 * 1 + 3 * 5 + 50 * 1.25) / 1e6, (45 * 1 + 6 * 5 + 500 * 0.1) / 1e6]
    assert [a.cost_usd, b.cost_usd] == pytest.approx(expected)
    totals = client.budget.as_dict()
    assert totals["session"]["usd"] == pytest.approx(sum(expected), abs=1e-6)
    assert totals["session"]["calls"] == 2 and totals["session"]["input_tokens"] == 75
    assert (
        totals["session"]["cache_creation_input_tokens"] == 50
        and totals["answer"]["cache_read_input_tokens"] == 500
    )
    assert totals["answer"]["calls"] == 1


def test_budget_exhausted_before_any_request(server):
    server.script(reply("Paris."))
    client = make_client(server, budget_calls=1)
    client.answer(None, QUESTION)
    with pytest.raises(CloudBudgetExhausted, match="cloud call budget spent \\(1 of 1 calls\\)") as info:
        client.continue_span(None, QUESTION, "The capital of")
    assert info.value.partial == "" and isinstance(info.value, CloudFailure) and info.value.exit_code == 8
    assert len(server.requests) == 1
    poor = make_client(server, budget_usd=0.0001, answer_tokens=1024)  # 1024 tokens could cost $0.005
    with pytest.raises(CloudBudgetExhausted, match="cloud budget spent"):
        poor.answer(None, QUESTION)
    assert len(server.requests) == 1


# --- failures ---


@pytest.mark.parametrize(
    "status, retries, message",
    [
        (401, 1, "cloud tier unavailable: HTTP 401 authentication failed (check ANTHROPIC_API_KEY)"),
        (403, 0, "cloud tier unavailable: HTTP 403 permission denied"),
        (429, 1, "cloud tier unavailable: HTTP 429 rate limited"),
        (500, 1, "cloud tier unavailable: HTTP 500 server error"),
        (529, 1, "cloud tier unavailable: HTTP 529 overloaded"),
    ],
)
def test_http_errors_become_one_line_failures(server, status, retries, message):
    server.script(error(status), error(status))
    client = make_client(server, max_retries=retries)
    with pytest.raises(CloudFailure) as info:
        client.continue_span(None, QUESTION, "The capital of")
    assert str(info.value) == message and info.value.partial == ""
    retried = status >= 429  # the SDK retries 429 and 5xx, with its own backoff (retry-after-ms here)
    assert len(server.requests) == (1 + retries if retried else 1)
    assert client.budget.session.failed_calls == 1


def test_retry_then_success(server):
    server.script(error(529), reply("Paris."))
    got = make_client(server, max_retries=1).answer(None, QUESTION)
    assert got.text == "Paris." and len(server.requests) == 2
    assert server.requests[1].headers["x-stainless-retry-count"] == "1"


def test_bad_request_says_what_the_api_said(server):
    server.script(error(400, message="messages: final assistant content cannot end with trailing whitespace"))
    with pytest.raises(CloudFailure, match="HTTP 400 request rejected: messages: final assistant content"):
        make_client(server).answer(None, QUESTION)


def test_timeout(server):
    server.script(slow(3.0))
    start = time.monotonic()
    with pytest.raises(CloudFailure, match="^cloud tier unavailable: no reply within 0.4 s$"):
        make_client(server, timeout_s=0.4).continue_span(None, QUESTION, "The capital of")
    assert time.monotonic() - start < 2.0


def test_refused_connection():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    client = CloudClient(
        cloud_settings(timeout_s=1.0, max_retries=0), api_key=MARKER, base_url=f"http://127.0.0.1:{port}"
    )
    with pytest.raises(CloudFailure, match=f"^cloud tier unavailable: cannot connect to 127.0.0.1:{port}$"):
        client.answer(None, QUESTION)
    assert client.budget.session.calls == 1 and client.budget.session.usd == 0


@pytest.mark.parametrize(
    "behaviour",
    [
        garbage(),  # a proxy's HTML page on a 200
        garbage(b"event: message_start\ndata: {not json\n\n", "text/event-stream"),
        garbage(
            b'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0}\n\n',
            "text/event-stream",
        ),
    ],
)
def test_malformed_reply(server, behaviour):
    server.script(behaviour)
    with pytest.raises(CloudFailure, match="^cloud tier failed: malformed reply"):
        make_client(server).continue_span(None, QUESTION, "The capital of")


def test_dropped_connection_keeps_the_text_shown(server):
    server.script(drop("Paris is the capital. It lies on"))
    pieces = []
    with pytest.raises(CloudFailure, match="^cloud tier unavailable: connection lost mid-reply$") as info:
        make_client(server, max_retries=1).answer(None, QUESTION, on_text=pieces.append)
    assert info.value.partial == "".join(pieces) == "Paris is the capital. It lies on"
    assert len(server.requests) == 1  # a broken stream is never retried (text was shown)


def test_error_event_mid_stream_on_a_200(server):
    server.script(stream_error("France is Paris. It is", "overloaded_error", "Overloaded"))
    pieces = []
    client = make_client(server, max_retries=1)
    with pytest.raises(CloudFailure) as info:
        client.continue_span(None, QUESTION, "The capital of ", on_text=pieces.append)
    assert str(info.value) == "cloud tier failed mid-reply: overloaded_error: Overloaded"
    assert info.value.partial == "".join(pieces) == "France is Paris."  # whole sentences only were shown
    assert len(server.requests) == 1  # the SDK never retries an error event
    assert client.budget.session.failed_calls == 1 and client.budget.session.input_tokens == 12


def test_refusal_is_a_failure(server):
    server.script(reply("I can't help with that.", stop_reason="refusal"))
    with pytest.raises(CloudFailure, match="declined to answer"):
        make_client(server).answer(None, QUESTION)


def test_ctrl_c_closes_the_stream_and_keeps_partial_text(server):
    server.script(reply("One. Two. Three. Four. Five.", chunk=5, chunk_delay_s=0.02))
    client = make_client(server)
    pieces = []

    def on_text(piece):
        pieces.append(piece)
        if len(pieces) == 2:
            raise KeyboardInterrupt  # what Ctrl-C does while the caller shows text

    with pytest.raises(KeyboardInterrupt) as info:
        client.answer(None, QUESTION, on_text=on_text)
    assert isinstance(info.value, CloudInterrupted)
    assert info.value.partial == "".join(pieces) == "One. Two. "
    assert client.budget.session.calls == 1 and client.budget.session.failed_calls == 1
    assert client.budget.session.input_tokens == 12  # message_start's usage is charged
    server.script(reply("Paris."))
    assert client.answer(None, QUESTION).text == "Paris."  # the client still works afterwards


def test_ctrl_c_while_the_sdk_reads(server, ctrl_c):
    held = threading.Event()
    server.script(reply("One. Two. Three. Four. Five. Six. Seven.", chunk=5, hold=held, hold_after=1))
    client = make_client(server)

    def interrupt_then_release() -> None:
        # A SIGINT while the SDK waits for the next chunk, which the server holds until then: the
        # stream cannot end first, however loaded the machine.
        time.sleep(0.05)
        _thread.interrupt_main()
        held.set()

    interrupter = threading.Thread(target=interrupt_then_release, daemon=True)

    def first_text(piece: str) -> None:
        if interrupter.ident is None:  # not started yet
            interrupter.start()

    try:
        with pytest.raises(CloudInterrupted) as info:
            client.answer(None, QUESTION, first_text)
    finally:
        held.set()
        if interrupter.ident is not None:
            interrupter.join()
    assert info.value.partial.startswith("One.") and "Seven" not in info.value.partial
    assert client.budget.session.failed_calls == 1


def test_a_conversation_the_api_would_refuse_is_a_cloud_failure_before_sending(server):
    # A cloud failure, not a ValueError: the caller's cloud handling keeps the local answer.
    client = make_client(server)
    with pytest.raises(CloudFailure, match="must end with a user message"):
        client.answer(None, [*QUESTION, {"role": "assistant", "content": "Par"}])
    with pytest.raises(CloudFailure, match="non-empty text"):
        client.answer(None, [{"role": "user", "content": " "}])
    with pytest.raises(CloudFailure, match="non-empty text"):
        client.continue_span(None, [*QUESTION, {"role": "assistant", "content": ""}, *QUESTION], "Pa")
    assert server.requests == [] and client.budget.session.calls == 0


def test_server_speaks_plain_json_too(server):
    server.script(reply("Paris.", input_tokens=7, output_tokens=2))
    sdk = anthropic.Anthropic(api_key=MARKER, base_url=server.url, max_retries=0, timeout=1.0)
    message = sdk.messages.create(model="claude-haiku-4-5", max_tokens=16, messages=QUESTION)
    assert message.content[0].text == "Paris." and message.usage.input_tokens == 7
    assert message.stop_reason == "end_turn" and "stream" not in server.requests[0].body
    sdk.close()


# --- the key never leaks ---


def _texts(obj) -> list[str]:
    """str and repr of an object and, for an exception, of its args, attributes and chain."""
    out, seen = [], set()
    while obj is not None and id(obj) not in seen:
        seen.add(id(obj))
        out += [str(obj), repr(obj)]
        if isinstance(obj, BaseException):
            out += [repr(a) for a in obj.args] + [repr(v) for v in vars(obj).values()]
            obj = obj.__cause__ or obj.__context__
        else:
            obj = None
    return out


def test_the_key_never_leaks(server, caplog):
    caplog.set_level(logging.DEBUG)
    server.script(
        reply("of France is Paris."),
        error(401),
        stream_error("France is Paris. It", "api_error", f"echoed {MARKER}"),  # a hostile echo is scrubbed
        slow(2.0),
        error(400, message=f"bad key {MARKER}"),
    )
    client = make_client(server, timeout_s=0.3)
    seen: list[object] = [client, client.settings, json.dumps(client.budget.as_dict())]
    seen.append(client.continue_span(None, QUESTION, "The capital of"))
    for _ in range(4):
        with pytest.raises(CloudFailure) as info:
            client.continue_span(None, QUESTION, "The capital of ")
        seen.append(info.value)
    seen.append(json.dumps(client.budget.as_dict()))
    assert "[key]" in str(seen[-2]) and "[key]" in str(seen[-4])
    for obj in seen:
        for text in _texts(obj):
            assert MARKER not in text, text
    assert "Request options" in caplog.text and MARKER not in caplog.text  # the SDK's debug log too
    # The only place the key went: the request headers, one per request.
    assert len(server.requests) == 5
    for request in server.requests:
        header = request.headers.get("x-api-key") or request.headers.get("authorization", "")
        assert header.endswith(MARKER)
        assert MARKER not in json.dumps(request.body)
