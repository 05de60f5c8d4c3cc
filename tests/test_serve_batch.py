"""`mlxswitch serve` on a single model and on a verified pair: concurrent requests decode together
(continuous batching), each gets the answer it gets alone, overflow is refused, and shutdown ends
every stream.

The real app under uvicorn in a thread on 127.0.0.1, on a tiny model loaded in-process.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from loopback import running_server

from mlxswitch.decoding.mode import DecodingMode
from mlxswitch.decoding.session import ChatSession, GenerationSettings
from mlxswitch.decoding.tiers import pair_ladder, single_model_ladder
from mlxswitch.models.sources import load_model
from mlxswitch.routing.router import RouterConfig
from mlxswitch.server import BatchWorker, ServeConfig, ServerLimits

CHAT = "/v1/chat/completions"
PROMPTS = ["Tell me a long story", "Write about the sea", "Count to a hundred", "Name the stars"]


VERIFIED = RouterConfig(up=(2.0,))


@contextlib.contextmanager
def serving(tiny_pair, limits: ServerLimits, max_tokens: int = 400, pair: bool = False) -> Iterator[str]:
    loaded = load_model(str(tiny_pair[1]))
    settings = GenerationSettings(max_tokens=max_tokens)
    config = ServeConfig(model="tiny", settings=settings, limits=limits)
    worker = BatchWorker(limits.queue_size, limits.max_batch, limits.prompt_caches())
    if pair:  # verified drafting, the large model drafting for itself: long drafts, all kept
        worker.open(
            lambda: ChatSession(
                pair_ladder(loaded, loaded),
                VERIFIED,
                settings,
                decoding=DecodingMode(verify=True, lookup=True),
                measure_signals=True,
            )
        )
    else:
        worker.open(lambda: ChatSession(single_model_ladder(loaded), RouterConfig(up=()), settings))
    with running_server(config, worker) as port:
        yield f"http://127.0.0.1:{port}"


def _stream(base: str, prompt: str, max_tokens: int, out: dict) -> None:
    """One streamed chat: when its first and last token chunks came, its text, its finish."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "stream": True}
    body["temperature"] = 0
    text, times = [], []
    with httpx.stream("POST", base + CHAT, json=body, timeout=60) as response:
        out["status"] = response.status_code
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            choice = chunk["choices"][0] if chunk.get("choices") else {}
            if choice.get("delta", {}).get("content"):
                text.append(choice["delta"]["content"])
                times.append(time.perf_counter())
                out["chunks"] = len(text)
            if choice.get("finish_reason"):
                out["finish"] = chunk
    out.update(text="".join(text), first=times[0] if times else None, last=times[-1] if times else None)


def _ask(base: str, prompt: str, max_tokens: int) -> str:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0}
    response = httpx.post(base + CHAT, json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize("pair", [False, True], ids=["single", "verified-pair"])
def test_concurrent_streams_decode_together_and_each_gets_its_own_answer(tiny_pair, pair):
    with serving(tiny_pair, ServerLimits(max_batch=4, queue_size=2), pair=pair) as base:
        alone = [_ask(base, prompt, 120) for prompt in PROMPTS]
        results = [dict() for _ in PROMPTS]
        threads = [
            threading.Thread(target=_stream, args=(base, prompt, 120, out))
            for prompt, out in zip(PROMPTS, results, strict=True)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert [r["status"] for r in results] == [200] * len(PROMPTS)
        assert [r["text"] for r in results] == alone  # the batch changes no answer
        # Together, not one after another: every answer had begun before any had ended.
        assert max(r["first"] for r in results) < min(r["last"] for r in results)
        health = httpx.get(base + "/health").json()
        assert health["waiting"] == 0 and health["prompt_cache"]["conversations"] >= 1


def test_more_than_the_batch_and_its_queue_get_429(tiny_pair):
    limits = ServerLimits(max_batch=2, queue_size=1)
    with serving(tiny_pair, limits) as base:
        results = [dict() for _ in range(8)]
        threads = [
            threading.Thread(target=_stream, args=(base, PROMPTS[i % 4], 200, out))
            for i, out in enumerate(results)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        statuses = sorted(r["status"] for r in results)
        assert set(statuses) == {200, 429} and statuses.count(200) >= 3
        assert all(r["text"] for r in results if r["status"] == 200)


def test_a_client_that_leaves_frees_its_row_and_the_others_finish(tiny_pair):
    with serving(tiny_pair, ServerLimits(max_batch=2, queue_size=0)) as base:
        stays: dict = {}
        thread = threading.Thread(target=_stream, args=(base, PROMPTS[1], 150, stays))
        thread.start()
        body = {"messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 400, "stream": True}
        with httpx.stream("POST", base + CHAT, json=body, timeout=60) as response:
            lines = [line for line, _ in zip(response.iter_lines(), range(6), strict=False)]
            assert any(line.startswith("data: {") for line in lines)
        # Its row is free again: a third client is served while the second still decodes.
        assert _ask(base, PROMPTS[2], 5)
        thread.join(timeout=120)
        assert stays["status"] == 200 and stays["text"] == _ask(base, PROMPTS[1], 150)


def test_shutdown_ends_every_stream_in_flight(tiny_pair):
    results = [dict() for _ in range(2)]
    threads = []
    with serving(tiny_pair, ServerLimits(max_batch=4), max_tokens=5000) as base:
        for out in results:  # the prompt the tiny model answers at length (~400 tokens)
            threads.append(threading.Thread(target=_stream, args=(base, PROMPTS[0], 5000, out)))
            threads[-1].start()
        for _ in range(400):
            if all(r.get("chunks", 0) >= 3 for r in results):
                break
            time.sleep(0.005)
        started = time.perf_counter()
    for thread in threads:
        thread.join(timeout=20)
    assert time.perf_counter() - started < 10
    for out in results:
        assert out["status"] == 200 and out["text"]
        assert out["finish"]["mlxswitch"]["usage"]["finish_reason"] == "interrupted"


def test_max_batch_is_checked_when_built():
    with pytest.raises(Exception, match="--max-batch must be at least 1"):
        ServerLimits(max_batch=0)


def test_an_empty_completion_prompt_is_a_400_and_the_batch_goes_on(tiny_pair):
    with serving(tiny_pair, ServerLimits(max_batch=2)) as base:
        response = httpx.post(base + "/v1/completions", json={"prompt": "", "max_tokens": 4}, timeout=60)
        assert response.status_code == 400
        assert response.json()["error"]["message"] == "the prompt is empty: there is nothing to continue"
        assert _ask(base, PROMPTS[0], 4)


def test_served_tokens_say_who_proposed_them_and_who_checked(tiny_pair):
    """Verified drafting through serve: each token names its proposer (a kept draft of the small
    tier, a lookup copy, or the large tier's own), the usage counts them and names the checker."""
    with serving(tiny_pair, ServerLimits(max_batch=2), pair=True) as base:
        body = {"messages": [{"role": "user", "content": PROMPTS[2]}], "max_tokens": 60, "temperature": 0}
        extension = httpx.post(base + CHAT, json=body, timeout=60).json()["mlxswitch"]
    proposers, tiers, usage = extension["proposers"], extension["tiers"], extension["usage"]
    assert len(proposers) == len(tiers) == 60
    assert all(p == t or (p == "lookup" and t == "large") for p, t in zip(proposers, tiers, strict=True))
    assert "small" in proposers  # the large model drafting for itself: its drafts are kept
    assert usage["proposer_tokens"] == {name: proposers.count(name) for name in usage["proposer_tokens"]}
    assert sum(usage["proposer_tokens"].values()) == 60 and usage["checked_by"] == "large"
