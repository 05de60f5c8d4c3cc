"""The cloud hand-off through the server: a chat answer the cloud takes over comes back as the
cloud's (streamed in one chunk once chosen), with the score, the decision and both answers; a sure
one comes back local; a raw-text completion is never re-asked.

The real app under uvicorn on 127.0.0.1, a tiny pair loaded in-process, the real anthropic SDK
against the loopback Messages API (tests/cloud_server.py).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import httpx
import pytest
from cloud_server import CloudServer, isolate_network, reply
from loopback import running_server

from mlxswitch.api import open_chat, resolve_profile
from mlxswitch.decoding.session import GenerationSettings
from mlxswitch.server import ServeConfig, ServerLimits, Worker

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def cloud(monkeypatch):
    isolate_network(monkeypatch)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-MARKER-serve")
    with CloudServer() as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
        yield server


@contextlib.contextmanager
def serving(tiny_pair, threshold: float) -> Iterator[str]:
    small, large = tiny_pair
    profile = resolve_profile(
        small=str(small), large=str(large), cloud="answer", cloud_options={"handoff_threshold": threshold}
    )
    settings = GenerationSettings(max_tokens=8)
    config = ServeConfig(model="pair", settings=settings, limits=ServerLimits())
    worker = Worker(4)
    worker.open(lambda: open_chat(profile, settings))
    with running_server(config, worker) as port:
        yield f"http://127.0.0.1:{port}"


def _events(response: httpx.Response) -> list[dict]:
    lines = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_an_unsure_answer_comes_back_as_the_clouds_with_both_answers(cloud, tiny_pair):
    cloud.script(reply("Paris.", output_tokens=2), reply("Paris.", output_tokens=2))
    with serving(tiny_pair, threshold=0.0) as base:
        body = {"model": "pair", "messages": QUESTION}
        answer = httpx.post(base + "/v1/chat/completions", json=body, timeout=60).json()
        streamed = httpx.post(base + "/v1/chat/completions", json={**body, "stream": True}, timeout=60)
    assert answer["choices"][0]["message"]["content"] == "Paris."
    handoff = answer["mlxswitch"]["usage"]["handoff"]
    assert handoff["decision"] == handoff["shown"] == "cloud" and handoff["score"] > 0
    assert handoff["local_text"] == "".join(answer["mlxswitch"]["texts"])  # the local tokens, kept
    assert answer["mlxswitch"]["usage"]["cloud_cost_usd"] > 0
    assert cloud.requests[0].body["messages"] == QUESTION
    chunks = _events(streamed)
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert [c["choices"][0]["delta"]["content"] for c in content] == ["Paris."]  # held, then chosen
    assert content[0]["mlxswitch"]["tiers"] == ["cloud"]
    assert chunks[-1]["mlxswitch"]["usage"]["handoff"]["shown"] == "cloud"


def test_a_sure_answer_stays_local_and_a_completion_is_never_re_asked(cloud, tiny_pair):
    with serving(tiny_pair, threshold=100.0) as base:
        body = {"model": "pair", "messages": QUESTION}
        answer = httpx.post(base + "/v1/chat/completions", json=body, timeout=60).json()
        streamed = _events(
            httpx.post(base + "/v1/chat/completions", json={**body, "stream": True}, timeout=60)
        )
        text = {"model": "pair", "prompt": "The capital of France is", "max_tokens": 4}
        completion = httpx.post(base + "/v1/completions", json=text, timeout=60).json()
    handoff = answer["mlxswitch"]["usage"]["handoff"]
    assert handoff["decision"] == handoff["shown"] == "local"
    assert (
        answer["choices"][0]["message"]["content"]
        == handoff["local_text"]
        == "".join(answer["mlxswitch"]["texts"])
    )
    shown = "".join(c["choices"][0]["delta"].get("content") or "" for c in streamed if c["choices"])
    assert shown == answer["choices"][0]["message"]["content"]  # the same greedy answer, held then sent
    assert "handoff" not in completion["mlxswitch"]["usage"]
    assert cloud.requests == []  # no answer was unsure enough, and a completion has no conversation
