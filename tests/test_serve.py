"""`mlxswitch serve` on loopback: the openai client, raw HTTP for bad input, disconnects, queueing.

One server process (the real CLI, a tiny pair) serves the whole module; each test leaves it idle.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
import typer
from typer.testing import CliRunner

from mlxswitch.cli import app
from mlxswitch.server import is_loopback

KEY = "test-key-123"
ROUTING = ["--tau", "1.5", "--tau-down", "1.0", "--window", "2", "--min-run", "2"]
QUEUE = 2
BATCH = 2  # answers decoded together (the routed pair batches: decoding/engine.py)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(tiny_pair, home, *extra: str) -> tuple[str, subprocess.Popen, object]:
    """`mlxswitch serve` on the tiny pair in a subprocess, once /health answers: (base, process, log)."""
    small, large = tiny_pair
    port = _free_port()
    env = {**os.environ, "MLXSWITCH_HOME": str(home), "HF_HUB_OFFLINE": "1", "MLXSWITCH_API_KEY": KEY}
    env["ANTHROPIC_API_KEY"] = "sk-ant-never-shown"  # set, and never in a response or the log
    env.pop("MLXSWITCH_MODELS", None)
    log = home / "server.log"
    args = ["serve", "--small", str(small), "--large", str(large), *ROUTING, "--port", str(port), *extra]
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlxswitch", *args], env=env, stdout=sink, stderr=subprocess.STDOUT
        )
    base = f"http://127.0.0.1:{port}"
    for _ in range(240):  # up to 60 s to import MLX and load the pair
        if proc.poll() is not None:
            pytest.fail(f"server exited: {log.read_text()}")
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.25)
    else:
        proc.terminate()
        proc.wait(timeout=20)
        pytest.fail(f"server did not start: {log.read_text()}")
    return base, proc, log


@pytest.fixture(scope="module")
def server(tiny_pair, tmp_path_factory):
    home = tmp_path_factory.mktemp("serve-home")
    extra = ["--queue-size", str(QUEUE), "--max-batch", str(BATCH), "--max-body-bytes", "20000"]
    extra += ["--log-level", "warning"]
    base, proc, log = _spawn(tiny_pair, home, *extra)
    try:
        yield base, proc, log
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert KEY not in log.read_text() and "sk-ant-never-shown" not in log.read_text()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key=KEY, max_retries=0, timeout=60)


def _headers() -> dict:
    return {"Authorization": f"Bearer {KEY}"}


def _wait_idle(base: str) -> dict:
    for _ in range(100):
        health = httpx.get(f"{base}/health").json()
        if not health["generating"] and health["waiting"] == 0:
            return health
        time.sleep(0.05)
    pytest.fail("the server stayed busy")


def _chat_json(tiny_pair, prompt: str, max_tokens: int) -> dict:
    small, large = tiny_pair
    args = [
        "chat",
        "--small",
        str(small),
        "--large",
        str(large),
        *ROUTING,
        "--json",
        "--temp",
        "0",
        "--max-tokens",
        str(max_tokens),
    ]
    result = CliRunner().invoke(app, args, input=prompt + "\n")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_streamed_chat_equals_chat_json_token_for_token(client, tiny_pair):
    prompt = "What is the capital of France?"
    chunks = list(
        client.chat.completions.create(
            model="ad-hoc pair",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    expected = _chat_json(tiny_pair, prompt, 16)
    tokens = [c for c in chunks if c.choices and c.choices[0].finish_reason is None]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in tokens) == expected["text"]
    extension = [c.model_extra["mlxswitch"] for c in tokens]
    assert [t for e in extension for t in e["tiers"]] == [t["tier"] for t in expected["tokens"]]
    # Routed, no lookup: each token was proposed by the tier that made it.
    assert [p for e in extension for p in e["proposers"]] == [t["tier"] for t in expected["tokens"]]
    assert [t["proposer"] for t in expected["tokens"]] == [t["tier"] for t in expected["tokens"]]
    assert [h for e in extension for h in e["entropies"]] == pytest.approx(
        [t["entropy"] for t in expected["tokens"]], abs=1e-3
    )
    assert {"small", "large"} <= {t["tier"] for t in expected["tokens"]}  # the comparison is not vacuous
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason][0]
    provenance = finish.model_extra["mlxswitch"]["usage"]
    assert provenance["tier_tokens"] == expected["stats"]["tiers"]
    assert provenance["switches"] == expected["stats"]["switches"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(expected["tokens"])


def test_chat_without_streaming_and_conversation_reuse(client):
    first = [{"role": "user", "content": "Hello there"}]
    answer = client.chat.completions.create(model="ad-hoc pair", messages=first, max_tokens=6, temperature=0)
    extension = answer.model_extra["mlxswitch"]
    assert answer.object == "chat.completion" and answer.choices[0].finish_reason in ("stop", "length")
    assert len(extension["tiers"]) == answer.usage.completion_tokens == len(extension["entropies"])
    assert "".join(extension["texts"]) == answer.choices[0].message.content
    # The next turn sends the whole conversation again: the caches keep what it shares.
    second = first + [
        {"role": "assistant", "content": answer.choices[0].message.content},
        {"role": "user", "content": "Count to three"},
    ]
    again = client.chat.completions.create(messages=second, model="ad-hoc pair", max_tokens=4, temperature=0)
    reused = again.model_extra["mlxswitch"]["usage"]["prompt_tokens_reused"]
    assert reused >= answer.usage.prompt_tokens
    assert reused < again.usage.prompt_tokens


def test_alternating_clients_each_reuse_their_own_history(client):
    def ask(messages, tokens=4):
        answer = client.chat.completions.create(
            model="ad-hoc pair", messages=messages, max_tokens=tokens, temperature=0
        )
        return answer, answer.model_extra["mlxswitch"]["usage"]["prompt_tokens_reused"]

    first = [{"role": "user", "content": "Tell me about the river and the old mill by the water. " * 4}]
    one, _ = ask(first)
    ask([{"role": "user", "content": "List the colours of the sky at dusk and of the sea. " * 4}])
    again = first + [
        {"role": "assistant", "content": one.choices[0].message.content},
        {"role": "user", "content": "And then?"},
    ]
    _, reused = ask(again)
    assert reused >= one.usage.prompt_tokens  # the other client's turn did not cost it its history


def test_cached_tokens_count_the_prompt_a_repeated_prefix_did_not_prefill(client):
    first = [{"role": "user", "content": "Name three rivers, three bridges and three mills, please. " * 3}]
    one = client.chat.completions.create(model="ad-hoc pair", messages=first, max_tokens=4, temperature=0)
    assert one.usage.prompt_tokens_details.cached_tokens < one.usage.prompt_tokens - 20  # new text
    second = first + [
        {"role": "assistant", "content": one.choices[0].message.content},
        {"role": "user", "content": "And the longest?"},
    ]
    chunks = list(
        client.chat.completions.create(
            model="ad-hoc pair",
            messages=second,
            max_tokens=4,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.prompt_tokens > one.usage.prompt_tokens
    cached = usage.prompt_tokens_details.cached_tokens
    assert one.usage.prompt_tokens <= cached < usage.prompt_tokens  # the first turn was not prefilled
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason][0]
    assert finish.model_extra["mlxswitch"]["usage"]["prompt_tokens_reused"] == cached

    text = "The river ran past the bridge and the old mill, and then it ran on to the sea"
    whole = client.completions.create(model="ad-hoc pair", prompt=text, max_tokens=3, temperature=0)
    again = client.completions.create(model="ad-hoc pair", prompt=text, max_tokens=3, temperature=0)
    assert again.usage.prompt_tokens == whole.usage.prompt_tokens
    # The same prompt again: all of it held, but its last position is computed again.
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    assert whole.usage.prompt_tokens_details.cached_tokens < whole.usage.prompt_tokens - 5


def test_completions_stream_and_not(client):
    whole = client.completions.create(
        model="ad-hoc pair", prompt="The quick brown", max_tokens=5, temperature=0
    )
    assert whole.object == "text_completion" and whole.usage.completion_tokens == 5
    chunks = list(
        client.completions.create(
            model="ad-hoc pair", prompt="The quick brown", max_tokens=5, temperature=0, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    tiers = [t for c in chunks for t in c.model_extra["mlxswitch"]["tiers"]]
    assert tiers == whole.model_extra["mlxswitch"]["tiers"]


def test_logprobs_chat_and_completions(client):
    answer = client.chat.completions.create(
        model="ad-hoc pair", messages=HI, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    content = answer.choices[0].logprobs.content
    assert len(content) == answer.usage.completion_tokens
    for entry in content:
        tops = [t.logprob for t in entry.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and tops[0] <= 0
        assert entry.logprob == pytest.approx(tops[0])  # greedy: the token taken is the likeliest
        assert entry.token == entry.top_logprobs[0].token
    chunks = list(
        client.completions.create(
            model="ad-hoc pair", prompt="The quick", max_tokens=4, temperature=0, logprobs=2, stream=True
        )
    )
    probs = [c.choices[0].logprobs for c in chunks if c.choices[0].finish_reason is None]
    assert len(probs) == 4 and all(len(p.tokens) == 1 and len(p.top_logprobs[0]) <= 2 for p in probs)
    assert probs[1].text_offset[0] == len(chunks[0].choices[0].text)


def test_models_and_health(server, client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["ad-hoc pair"]  # only what this server answers for
    assert models.data[0].model_extra["mlxswitch"]["served"] is True
    for listed in models.data:  # every listed model answers
        answer = client.chat.completions.create(model=listed.id, messages=HI, max_tokens=1)
        assert answer.model == listed.id
    health = httpx.get(f"{server[0]}/health").json()
    assert health["status"] == "ok" and health["model"] == "ad-hoc pair"


def test_retrieve_a_model_with_the_openai_client(client):
    model = client.models.retrieve("ad-hoc pair")
    assert (model.id, model.object, model.owned_by) == ("ad-hoc pair", "model", "mlxswitch")
    for unknown in ("embedded", "no-such-model", "a/b/../c"):
        with pytest.raises(openai.NotFoundError) as caught:
            client.models.retrieve(unknown)
        error = caught.value.body
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == "model_not_found"


CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]
LONG = [{"role": "user", "content": "Tell me a long story"}]  # the tiny pair runs to 400 tokens on it


@pytest.mark.parametrize(
    "path,body,status,param,code",
    [
        (CHAT, b"{not json", 400, None, "invalid_json"),
        (CHAT, b"[1, 2]", 400, None, None),
        (CHAT, b'{"messages": [{"role": "user", "content": "\\ud800"}]}', 400, "messages", "invalid_unicode"),
        (CHAT, b"[" * 19_000, 400, None, "invalid_json"),  # under the body limit, too deep for json
        ("/v1/completions", b'{"prompt": "\\udfff"}', 400, "prompt", "invalid_unicode"),
        (CHAT, {"messages": HI, "model": "embedded"}, 404, "model", "model_not_found"),
        (CHAT, {"messages": "hi"}, 400, "messages", None),
        (CHAT, {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0]", None),
        (CHAT, {"messages": HI, "max_tokens": "5"}, 400, "max_tokens", None),
        (CHAT, {"messages": HI, "temperature": "hot"}, 400, "temperature", None),
        (CHAT, {"messages": HI, "stream": "yes"}, 400, "stream", None),
        (CHAT, {"messages": HI, "stop": 5}, 400, "stop", None),
        (CHAT, {"messages": HI, "n": 2}, 400, "n", None),
        (CHAT, {"messages": HI, "seed": -1}, 400, "seed", None),
        (CHAT, {"messages": HI, "top_logprobs": 2}, 400, "top_logprobs", None),
        (CHAT, {"messages": HI, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs", None),
        (CHAT, {"messages": HI, "model": "no-such-model"}, 404, "model", "model_not_found"),
        (CHAT, {"messages": HI, "model": "../../etc/passwd"}, 404, "model", "model_not_found"),
        (
            CHAT,
            {"messages": [{"role": "user", "content": "one two three " * 300}]},
            400,
            "messages",
            "context_length_exceeded",
        ),
        ("/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt", None),
        ("/v1/completions", {"prompt": "x" * 30000}, 413, None, "request_too_large"),
    ],
)
def test_bad_requests_get_openai_errors_and_the_server_goes_on(server, path, body, status, param, code):
    base = server[0]
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(base + path, content=content, headers=_headers(), timeout=30)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["param"], error["code"]) == (param, code)
    assert "Traceback" not in response.text
    ok = httpx.post(base + CHAT, json={"messages": HI, "max_tokens": 2}, headers=_headers(), timeout=30)
    assert ok.status_code == 200


def test_idle_sockets_do_not_deny_service(server):
    base = server[0]
    port = int(base.rsplit(":", 1)[1])
    sockets = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(60)]
    try:
        health = httpx.get(base + "/health", timeout=5)
        assert health.status_code == 200 and health.json()["status"] == "ok"
        ok = httpx.post(base + CHAT, json={"messages": HI, "max_tokens": 2}, headers=_headers(), timeout=30)
        assert ok.status_code == 200
    finally:
        for sock in sockets:
            sock.close()


def test_max_tokens_is_clamped_and_unknown_fields_ignored(server):
    response = httpx.post(
        server[0] + CHAT,
        headers=_headers(),
        timeout=60,
        json={"messages": HI, "max_tokens": 10**9, "temperature": 0, "frobnicate": {"x": 1}, "user": "me"},
    )
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] <= 512


def test_api_key_is_required(server):
    base = server[0]
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        response = httpx.post(base + CHAT, json={"messages": HI}, headers=headers)
        assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(base + "/v1/models").status_code == 401


def test_a_client_that_hangs_up_stops_its_generation(server):
    base = server[0]
    body = {"messages": LONG, "max_tokens": 400, "stream": True, "temperature": 0}
    with httpx.stream("POST", base + CHAT, headers=_headers(), timeout=30, json=body) as response:
        lines = response.iter_lines()
        got = [line for line, _ in zip(lines, range(8), strict=False) if line.startswith("data:")]
        assert len(got) >= 3
    started = time.perf_counter()
    health = _wait_idle(base)
    assert time.perf_counter() - started < 5
    assert health["last_answer"]["finish_reason"] == "interrupted"
    assert health["last_answer"]["tokens"] < 100
    ok = httpx.post(base + CHAT, json={"messages": HI, "max_tokens": 2}, headers=_headers(), timeout=30)
    assert ok.status_code == 200


def test_a_client_that_gives_up_on_a_whole_answer_stops_it_too(server):
    base = server[0]
    with pytest.raises(httpx.ReadTimeout):  # the client closes the connection when it times out
        httpx.post(
            base + CHAT,
            headers=_headers(),
            timeout=httpx.Timeout(5, read=0.3),
            json={"messages": LONG, "max_tokens": 400, "temperature": 0},
        )
    health = _wait_idle(base)
    assert health["last_answer"]["finish_reason"] == "interrupted"
    assert health["last_answer"]["tokens"] < 400


def test_concurrent_clients_are_queued_and_overflow_gets_429(server):
    base = server[0]
    results: list[tuple[int, str | None, int]] = []

    def ask(max_tokens: int) -> None:
        with httpx.Client(timeout=60) as http:
            r = http.post(
                base + CHAT,
                headers=_headers(),
                json={"messages": HI, "max_tokens": max_tokens, "temperature": 0},
            )
            tokens = r.json()["usage"]["completion_tokens"] if r.status_code == 200 else 0
            results.append((r.status_code, r.headers.get("retry-after"), tokens))

    # BATCH decoding + QUEUE waiting are served; with more at once some must be refused.
    threads = [threading.Thread(target=ask, args=(60,)) for _ in range(2 * (QUEUE + BATCH))]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    assert time.perf_counter() - started < 90
    statuses = sorted(status for status, _, _ in results)
    assert len(results) == len(threads) and set(statuses) <= {200, 429}
    assert statuses.count(200) >= QUEUE + BATCH
    assert all(after == "2" for status, after, _ in results if status == 429) and 429 in statuses
    assert all(tokens > 0 for status, _, tokens in results if status == 200)
    _wait_idle(base)


def test_sigint_ends_streams_in_flight_and_stops_the_server(tiny_pair, tmp_path):
    base, proc, log = _spawn(tiny_pair, tmp_path, "--log-level", "warning", "--max-tokens", "2000")
    try:
        body = {"messages": LONG, "max_tokens": 2000, "stream": True, "temperature": 0}
        with httpx.stream("POST", base + CHAT, headers=_headers(), timeout=30, json=body) as response:
            lines = response.iter_lines()
            got = [line for line, _ in zip(lines, range(8), strict=False) if line.startswith("data:")]
            assert len(got) >= 3
            proc.send_signal(signal.SIGINT)
            started = time.perf_counter()
            rest = [line for line in lines if line.startswith("data:")]
            took = time.perf_counter() - started
        assert rest[-1] == "data: [DONE]" and took < 5, (took, rest[-3:])
        finish = json.loads(rest[-2][5:])
        assert finish["choices"][0]["finish_reason"] == "stop"
        assert finish["mlxswitch"]["usage"]["finish_reason"] == "interrupted"
        proc.wait(timeout=10)
        with pytest.raises(httpx.ConnectError):  # no longer accepting
            httpx.get(base + "/health", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=20)


def test_loopback_only_unless_asked(monkeypatch, tiny_pair):
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5") and not is_loopback("example.com")
    seen = {}
    monkeypatch.delenv("MLXSWITCH_API_KEY", raising=False)
    monkeypatch.setattr("mlxswitch.server.Worker.open", lambda self, make: None)
    monkeypatch.setattr("mlxswitch.server.BatchWorker.open", lambda self, make: None)  # the pair batches
    monkeypatch.setattr(
        "mlxswitch.server.run",
        lambda config, worker, host, port, log_level: seen.update(host=host, config=config),
    )
    small, large = tiny_pair
    pair = ["--small", str(small), "--large", str(large)]
    result = CliRunner().invoke(app, ["serve", *pair, "--host", "0.0.0.0"])
    assert result.exit_code == 0 and seen["host"] == "0.0.0.0"
    assert "other machines can reach this server" in result.stderr and "--api-key" in result.stderr
    result = CliRunner().invoke(app, ["serve", *pair])
    assert seen["host"] == "127.0.0.1" and "other machines" not in result.stderr
    assert seen["config"].api_key is None
    result = CliRunner().invoke(app, ["serve", *pair, "--port", "0"])
    assert result.exit_code == 2 and "--port" in result.stderr
    result = CliRunner().invoke(app, ["serve", *pair, "--prompt-cache-size", "-1"])
    assert result.exit_code == 2 and result.stderr == "error: --prompt-cache-size must be ≥ 0 (got -1)\n"
    result = CliRunner().invoke(app, ["serve", *pair, "--max-batch", "0"])
    assert result.exit_code == 2 and result.stderr == "error: --max-batch must be at least 1 (got 0)\n"


def test_shared_options_have_one_definition():
    command = typer.main.get_command(app)
    helps: dict[str, set[str]] = {}
    for name in ("chat", "bench", "calibrate", "serve"):
        for param in command.commands[name].params:
            if param.name in ("profile", "small", "large", "model", "gears", "tau", "policy", "force_memory"):
                helps.setdefault(param.name, set()).add(param.help)
    assert helps and all(len(texts) == 1 for texts in helps.values()), helps
