"""Kept conversations through the server: ServerLimits bound them, the least recently used goes
first, and `usage.prompt_tokens_details.cached_tokens` says what a request did not prefill.

The real app under uvicorn in a thread on 127.0.0.1, on a tiny pair loaded in-process; stopped
by the test.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
import openai
import pytest
from loopback import running_server

from mlxswitch.api import build_ladder, resolve_profile
from mlxswitch.decoding.session import ChatSession, GenerationSettings
from mlxswitch.errors import UsageError
from mlxswitch.server import ServeConfig, ServerLimits, Worker

ROUTED = dict(tau="1.5", tau_down="1.0", window=2, min_run=2)
CLIENTS = {
    "A": "Tell me about the river, the bridge and the old mill by the water. " * 4,
    "B": "List some colours of the sky at dusk, and of the sea at dawn, please. " * 4,
    "C": "Which birds sing in the morning near the forest and the quiet lake? " * 4,
}


@contextlib.contextmanager
def serving(tiny_pair, limits: ServerLimits) -> Iterator[str]:
    """An in-process server on the tiny pair with these limits; yields its base URL."""
    small, large = tiny_pair
    profile = resolve_profile(small=str(small), large=str(large), **ROUTED)
    settings = GenerationSettings(max_tokens=8)
    ladder = build_ladder(profile)
    config = ServeConfig(model="pair", settings=settings, limits=limits)
    worker = Worker(limits.queue_size)
    worker.open(lambda: ChatSession(ladder, profile.router, settings, prompt_caches=limits.prompt_caches()))
    with running_server(config, worker) as port:
        yield f"http://127.0.0.1:{port}"


def test_one_kept_conversation_the_least_recently_used_goes_and_cached_tokens_say_so(tiny_pair):
    with serving(tiny_pair, ServerLimits(prompt_cache_size=1)) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=60)
        history: dict[str, list[dict]] = {}
        first_prompt: dict[str, int] = {}

        def ask(name: str):
            messages = history.get(name, []) + [{"role": "user", "content": CLIENTS[name]}]
            if name in history:
                messages[-1] = {"role": "user", "content": "And then?"}
            answer = client.chat.completions.create(model="pair", messages=messages, temperature=0)
            history[name] = messages + [{"role": "assistant", "content": answer.choices[0].message.content}]
            first_prompt.setdefault(name, answer.usage.prompt_tokens)
            return answer.usage

        for name in "ABC":  # keeping B (when C came) was one too many: A went
            assert ask(name).prompt_tokens_details.cached_tokens < 20
        health = httpx.get(base + "/health", timeout=5).json()
        assert health["prompt_cache"]["conversations"] == 1 and health["prompt_cache"]["bytes"] > 0
        again = ask("A")
        assert again.prompt_tokens_details.cached_tokens < 20  # evicted: prefilled again
        again = ask("C")  # kept when A came back, while B went
        assert first_prompt["C"] <= again.prompt_tokens_details.cached_tokens < again.prompt_tokens
        assert ask("B").prompt_tokens_details.cached_tokens < 20


def test_kept_conversations_are_bounded_by_bytes_too(tiny_pair):
    with serving(tiny_pair, ServerLimits(prompt_cache_size=8, prompt_cache_bytes=1024)) as base:
        for text in CLIENTS.values():
            body = {"messages": [{"role": "user", "content": text}], "max_tokens": 2}
            assert httpx.post(base + "/v1/chat/completions", json=body, timeout=60).status_code == 200
        health = httpx.get(base + "/health", timeout=5).json()
        assert health["prompt_cache"] == {"conversations": 0, "bytes": 0}  # none fits in 1 KiB


def test_prompt_cache_limits_are_checked_when_built():
    with pytest.raises(UsageError, match="--prompt-cache-size must be ≥ 0"):
        ServerLimits(prompt_cache_size=-1)
    with pytest.raises(UsageError, match="--prompt-cache-bytes must be ≥ 0"):
        ServerLimits(prompt_cache_bytes=-5)
    caches = ServerLimits(prompt_cache_size=3, prompt_cache_bytes=1 << 20).prompt_caches()
    assert (caches.size, caches.max_bytes, len(caches)) == (3, 1 << 20, 0)
