"""Request bodies of the OpenAI-compatible endpoints, parsed and checked once into a `Request`.

Every problem is a RequestError naming the field (`param`), so the client gets OpenAI's error
object. Unknown fields are ignored, as OpenAI's own server does for most of them.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

from ..decoding.prompt_caches import DEFAULT_MAX_BYTES, DEFAULT_SIZE, PromptCaches, check_bounds
from ..decoding.requests import MAX_TOP_LOGPROBS, GenerationSettings
from ..errors import RequestError, UsageError
from .guard import Timeouts

ROLES = ("system", "user", "assistant", "developer", "tool")
MAX_DEPTH = 64  # deeper JSON is refused (OpenAI's own bodies nest a handful of levels)


@dataclass(frozen=True)
class ServerLimits:
    """How large a request may be and how many may wait (max_tokens: the server's settings)."""

    max_body_bytes: int = 1_000_000  # larger bodies are refused before they are parsed
    queue_size: int = 8  # requests waiting behind those generating; more get 429
    max_batch: int = 8  # answers decoded together, where the profile batches (1: one at a time)
    # Connections (guard.py): seconds a socket may sit idle, send its headers, send its body;
    # how many may be open (more: the idle and slow ones are closed); the grace at shutdown.
    idle_timeout_s: float = 5.0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 100
    shutdown_timeout_s: float = 5.0
    # Conversations whose KV caches are kept besides the one answering, and the bytes their K/V
    # arrays may hold together; past either, the least recently used is dropped (0: none kept).
    prompt_cache_size: int = DEFAULT_SIZE
    prompt_cache_bytes: int = DEFAULT_MAX_BYTES

    def __post_init__(self) -> None:
        check_bounds(self.prompt_cache_size, self.prompt_cache_bytes)
        if self.max_body_bytes < 1024:
            raise UsageError(f"--max-body-bytes must be at least 1024 (got {self.max_body_bytes})")
        if self.queue_size < 0:
            raise UsageError(f"--queue-size must be ≥ 0 (got {self.queue_size})")
        if self.max_batch < 1:
            raise UsageError(f"--max-batch must be at least 1 (got {self.max_batch})")
        if self.max_connections < self.queue_size + 2:
            raise UsageError(f"max_connections must be ≥ queue size + 2 (got {self.max_connections})")
        for name in ("idle_timeout_s", "header_timeout_s", "body_timeout_s", "shutdown_timeout_s"):
            if not getattr(self, name) > 0:
                raise UsageError(f"{name} must be > 0 (got {getattr(self, name)})")

    def timeouts(self) -> Timeouts:
        """The connection guard's settings."""
        return Timeouts(
            idle_s=self.idle_timeout_s,
            header_s=self.header_timeout_s,
            body_s=self.body_timeout_s,
            max_connections=self.max_connections,
        )

    def prompt_caches(self) -> PromptCaches:
        """An empty store of kept conversations with these bounds (for the session to open with)."""
        return PromptCaches(self.prompt_cache_size, self.prompt_cache_bytes)


@dataclass(frozen=True)
class Request:
    """One generation request: what to continue, how to sample, how to answer."""

    kind: str  # "chat" (messages, chat template) or "text" (a raw prompt)
    model: str | None
    messages: tuple[dict, ...]
    prompt: str
    settings: GenerationSettings
    stream: bool
    include_usage: bool


def parse_body(raw: bytes, kind: str, defaults: GenerationSettings) -> Request:
    """The JSON body of /v1/chat/completions (kind "chat") or /v1/completions ("text"), checked.

    `defaults` are the server's settings (its --temp, --max-tokens, …); the body's fields override
    them, and max_tokens is clamped to the server's.
    """
    body = _load(raw)
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    model = _optional(body, "model", str)
    if kind == "chat":
        messages, prompt = _messages(body), ""
    else:
        messages, prompt = (), _prompt(body)
    n = _optional(body, "n", int)
    if n is not None and n != 1:
        raise RequestError(f"n must be 1: one answer per request is generated (got {n})", param="n")
    top_logprobs = _logprobs(body, kind)
    max_tokens = _optional(body, "max_completion_tokens", int)
    max_tokens = _optional(body, "max_tokens", int) if max_tokens is None else max_tokens
    if max_tokens is not None and max_tokens < 1:
        raise RequestError(f"max_tokens must be at least 1 (got {max_tokens})", param="max_tokens")
    temperature = _number(body, "temperature", defaults.temperature)
    top_p = _number(body, "top_p", defaults.top_p)
    if not 0 <= temperature <= 2:
        raise RequestError(f"temperature must be in [0, 2] (got {temperature:g})", param="temperature")
    if not 0 < top_p <= 1:
        raise RequestError(f"top_p must be in (0, 1] (got {top_p:g})", param="top_p")
    seed = _optional(body, "seed", int)
    if seed is not None and not 0 <= seed < 2**63:
        raise RequestError(f"seed must be between 0 and 2**63 - 1 (got {seed})", param="seed")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError("stream_options must be an object", param="stream_options")
    stop = _stop(body)
    settings = dataclasses.replace(
        defaults,
        max_tokens=min(max_tokens or defaults.max_tokens, defaults.max_tokens),
        temperature=temperature,
        top_p=top_p,
        seed=defaults.seed if seed is None else seed,
        stop=defaults.stop if stop is None else stop,
        top_logprobs=top_logprobs,
    )
    return Request(
        kind=kind,
        model=model,
        messages=messages,
        prompt=prompt,
        settings=settings,
        stream=bool(_optional(body, "stream", bool)),
        include_usage=bool(_optional(options or {}, "include_usage", bool)),
    )


def _load(raw: bytes):
    """The body's JSON: UTF-8 (a BOM allowed), nested at most MAX_DEPTH deep, valid Unicode."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise RequestError(f"the body is not UTF-8 (byte {exc.start} is not)", code="invalid_json") from None
    try:
        body = json.loads(text)
    except RecursionError:  # json's C parser recurses per level; the stack ran out first
        raise RequestError(_too_deep(), code="invalid_json") from None
    except ValueError as exc:  # JSONDecodeError, or an integer too long to convert
        raise RequestError(f"the body is not valid JSON: {exc}", code="invalid_json") from None
    # Checked without recursion: nothing later recurses over what a client nested.
    stack: list[tuple[object, int, str | None]] = [(body, 0, None)]
    while stack:
        value, depth, top = stack.pop()
        if depth > MAX_DEPTH:
            raise RequestError(_too_deep(), param=top, code="invalid_json")
        if isinstance(value, str):
            _unicode(value, top)
        elif isinstance(value, dict):
            for key, item in value.items():
                _unicode(key, top)
                stack.append((item, depth + 1, key if top is None else top))
        elif isinstance(value, list):
            stack.extend((item, depth + 1, top) for item in value)
    return body


def _too_deep() -> str:
    return f"the body's JSON nests deeper than this server accepts ({MAX_DEPTH} levels)"


def _unicode(text: str, param: str | None) -> None:
    # json turns a "\\ud800" escape with no pair into a lone surrogate, which no UTF-8 text holds.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(
            f"a string holds a lone UTF-16 surrogate (\\u{ord(text[exc.start]):04x}): not valid Unicode",
            param=param,
            code="invalid_unicode",
        ) from None


def _show(value) -> str:
    """A short picture of a client's value for an error message (containers only by their kind)."""
    if isinstance(value, dict | list):
        return "an object" if isinstance(value, dict) else "a list"
    return json.dumps(value)[:40]


def _optional(body: dict, key: str, kind: type):
    value = body.get(key)
    if value is None:
        return None
    # JSON true is a Python int too: a bool passes only where a bool is asked for.
    if isinstance(value, bool) if kind is bool else isinstance(value, kind) and not isinstance(value, bool):
        return value
    names = {str: "a string", int: "an integer", bool: "a boolean"}
    raise RequestError(f"{key} must be {names[kind]} (got {_show(value)})", param=key)


def _logprobs(body: dict, kind: str) -> int | None:
    """None (none asked for) or how many alternatives to list with each token's log-probability."""
    if kind == "text":  # completions: logprobs is the number of alternatives
        count = _optional(body, "logprobs", int)
        param = "logprobs"
    else:  # chat: logprobs is a switch, top_logprobs the number
        wanted, count = _optional(body, "logprobs", bool), _optional(body, "top_logprobs", int)
        if count is not None and not wanted:
            raise RequestError("top_logprobs needs logprobs: true", param="top_logprobs")
        count, param = (count or 0) if wanted else None, "top_logprobs"
    if count is not None and not 0 <= count <= MAX_TOP_LOGPROBS:
        raise RequestError(f"{param} must be between 0 and {MAX_TOP_LOGPROBS} (got {count})", param=param)
    return count


def _number(body: dict, key: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(f"{key} must be a number (got {_show(value)})", param=key)
    return float(value)


def _messages(body: dict) -> tuple[dict, ...]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {role, content} objects", param="messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise RequestError(
                f"messages[{i}] must be an object whose role is one of {', '.join(ROLES)}",
                param=f"messages[{i}]",
            )
        role = "system" if message["role"] == "developer" else message["role"]
        out.append({"role": role, "content": _content(message.get("content"), i)})
    return tuple(out)


def _content(content, i: int) -> str:
    # OpenAI's content is a string or a list of parts; text parts are the only kind served here.
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
    ):
        return "".join(p["text"] for p in content)
    raise RequestError(
        f"messages[{i}].content must be a string or a list of text parts", param=f"messages[{i}].content"
    )


def _prompt(body: dict) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]  # one prompt in a list: what several clients send
    if not isinstance(prompt, str):
        raise RequestError("prompt must be a string (one prompt per request)", param="prompt")
    return prompt


def _stop(body: dict) -> tuple[str, ...] | None:
    stop = body.get("stop")
    if stop is None:
        return None
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) for s in stop):
        return tuple(stop)
    raise RequestError("stop must be a string or a list of up to 4 strings", param="stop")
