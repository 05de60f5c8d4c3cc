"""OpenAI-shaped response objects built from the engine's events, with the `mlxswitch` extension.

A client that ignores the extension object sees a plain OpenAI response; one that reads it gets
each token's tier and entropy and, at the end, where the answer's tokens came from.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable

from ..decoding.answer import AnswerSummary, TokenEvent, json_float
from ..decoding.session import shown_by_cloud, shown_text
from ..errors import RequestError

Decode = Callable[[int], str]
OBJECTS = {
    "chat": ("chat.completion", "chat.completion.chunk", "chatcmpl"),
    "text": ("text_completion", "text_completion", "cmpl"),
}


def new_id(kind: str) -> str:
    """A response id in OpenAI's style (chatcmpl-…, cmpl-…)."""
    return f"{OBJECTS[kind][2]}-{uuid.uuid4().hex[:24]}"


def logprobs(kind: str, events: list[TokenEvent], decode: Decode | None, offset: int = 0) -> dict | None:
    """OpenAI's logprobs object for `events` (None when none were asked for).

    Natural logs of the tier's distribution before temperature; `offset`: the text before them.
    """
    if decode is None or not events or events[0].logprob is None:
        return None
    if kind == "chat":

        def entry(token: str, logprob: float | None) -> dict:
            return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

        return {
            "content": [
                {
                    **entry(decode(e.id), e.logprob),
                    "top_logprobs": [entry(decode(i), lp) for i, lp in e.top_logprobs],
                }
                for e in events
            ]
        }
    offsets, at = [], offset
    for e in events:
        offsets.append(at)
        at += len(e.text)
    return {
        "tokens": [decode(e.id) for e in events],
        "token_logprobs": [e.logprob for e in events],
        "top_logprobs": [{decode(i): lp for i, lp in e.top_logprobs} for e in events],
        "text_offset": offsets,
    }


def _choice(
    kind: str,
    text: str | None,
    finish: str | None,
    delta: bool,
    first: bool = False,
    probs: dict | None = None,
) -> dict:
    if kind == "text":
        return {"index": 0, "text": text or "", "logprobs": probs, "finish_reason": finish}
    if delta:
        body = (
            {"role": "assistant", "content": text or ""}
            if first
            else ({"content": text} if text is not None else {})
        )
        return {"index": 0, "delta": body, "logprobs": probs, "finish_reason": finish}
    return {
        "index": 0,
        "message": {"role": "assistant", "content": text or ""},
        "logprobs": probs,
        "finish_reason": finish,
    }


def cached_tokens(summary: AnswerSummary) -> int:
    """Prompt tokens served from the KV caches, not prefilled (OpenAI's `cached_tokens`).

    A prompt the caches hold whole still has its last position computed again (its logits make
    the first token), so at most all but one are counted.
    """
    reused = summary.prompt_tokens - summary.prefilled_tokens
    return max(0, min(reused, summary.prompt_tokens - 1))


def usage(summary: AnswerSummary) -> dict:
    """OpenAI's usage object, with the prompt tokens the caches served."""
    return {
        "prompt_tokens": summary.prompt_tokens,
        "completion_tokens": summary.generated,
        "total_tokens": summary.prompt_tokens + summary.generated,
        "prompt_tokens_details": {"cached_tokens": cached_tokens(summary)},
    }


def provenance(summary: AnswerSummary) -> dict:
    """Where an answer's tokens came from, what it cost, and how much prompt the caches reused."""
    cloud = summary.cloud or {}
    return {
        "tier_tokens": summary.tier_counts,
        "proposer_tokens": summary.proposer_counts,
        **({"checked_by": summary.checked_by} if summary.checked_by is not None else {}),
        "switches": summary.switches,
        "catch_up_tokens": summary.catch_up_tokens,
        "cloud_cost_usd": round(float((cloud.get("answer") or {}).get("usd", 0.0)), 6),
        "prompt_tokens_reused": summary.prompt_tokens - summary.prefilled_tokens,
        "finish_reason": summary.finish_reason,
        # A cloud hand-off's score, decision and both answers (the local one's tokens are the tiers').
        **({"handoff": summary.handoff} if summary.handoff is not None else {}),
    }


def held_chunk(
    kind: str, ident: str, model: str, created: int, summary: AnswerSummary, decode: Decode | None
) -> dict:
    """A held answer (one that may be handed off) streamed in one chunk once it is chosen: the
    local tokens, or the cloud's text as one piece of tier "cloud"."""
    if not shown_by_cloud(summary):
        return chunk(kind, ident, model, created, summary.tokens, True, decode)
    return {
        "id": ident,
        "object": OBJECTS[kind][1],
        "created": created,
        "model": model,
        "choices": [_choice(kind, shown_text(summary), None, True, True)],
        "mlxswitch": {"tiers": ["cloud"], "proposers": ["cloud"], "entropies": [None]},
    }


def _finish(summary: AnswerSummary) -> str:
    return "length" if summary.finish_reason == "length" else "stop"


def chunk(
    kind: str,
    ident: str,
    model: str,
    created: int,
    events: list[TokenEvent],
    first: bool = False,
    decode: Decode | None = None,
    offset: int = 0,
) -> dict:
    """A streamed chunk holding `events`' text, with their tiers and entropies."""
    probs = logprobs(kind, events, decode, offset)
    return {
        "id": ident,
        "object": OBJECTS[kind][1],
        "created": created,
        "model": model,
        "choices": [_choice(kind, "".join(e.text for e in events), None, True, first, probs)],
        "mlxswitch": {
            "tiers": [e.tier for e in events],
            "proposers": [e.proposer for e in events],
            "entropies": [json_float(e.entropy) for e in events],
        },
    }


def final_chunk(kind: str, ident: str, model: str, created: int, summary: AnswerSummary) -> dict:
    """The chunk that carries the finish reason and the answer's provenance."""
    return {
        "id": ident,
        "object": OBJECTS[kind][1],
        "created": created,
        "model": model,
        "choices": [_choice(kind, None, _finish(summary), True)],
        "mlxswitch": {"tiers": [], "proposers": [], "entropies": [], "usage": provenance(summary)},
    }


def usage_chunk(kind: str, ident: str, model: str, created: int, summary: AnswerSummary) -> dict:
    """The extra last chunk `stream_options.include_usage` asks for: no choices, the usage."""
    return {
        "id": ident,
        "object": OBJECTS[kind][1],
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage(summary),
    }


def completion(
    kind: str, ident: str, model: str, summary: AnswerSummary, decode: Decode | None = None
) -> dict:
    """The whole (non-streamed) response."""
    probs = logprobs(kind, summary.tokens, decode)
    return {
        "id": ident,
        "object": OBJECTS[kind][0],
        "created": int(time.time()),
        "model": model,
        "choices": [_choice(kind, shown_text(summary), _finish(summary), False, probs=probs)],
        "usage": usage(summary),
        "mlxswitch": {
            "tiers": [e.tier for e in summary.tokens],
            "proposers": [e.proposer for e in summary.tokens],
            "entropies": [json_float(e.entropy) for e in summary.tokens],
            "texts": [e.text for e in summary.tokens],
            "usage": provenance(summary),
        },
    }


def error_body(error: RequestError) -> dict:
    """OpenAI's error object."""
    return {"error": {"message": str(error), "type": error.type, "param": error.param, "code": error.code}}


def sse(payload: dict | str) -> bytes:
    """One server-sent event: `data: …` and a blank line."""
    text = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False, allow_nan=False)
    return f"data: {text}\n\n".encode()
