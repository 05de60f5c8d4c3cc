"""Cloud calls through the anthropic SDK: a short span continuation, or a whole answer.

Both stream (on_text(piece) as text becomes final) and charge the session budget.
Failures raise CloudFailure with a one-line reason and `.partial`, the text already passed to
on_text. Cancelling: Ctrl-C (KeyboardInterrupt) while a call streams — raised in the SDK's
read or in on_text — closes the HTTP stream, charges what the call used so far, and raises
CloudInterrupted (a KeyboardInterrupt) whose `.partial` is the text already shown; the
caller keeps that text (it is on screen) and lets the interrupt go on.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import anthropic

from mlxswitch.cloud.budget import CloudBudget, CloudSettings
from mlxswitch.cloud.pricing import estimate_usd, usage_counts
from mlxswitch.cloud.span import Passthrough, SpanSplicer, span_prompt
from mlxswitch.errors import CloudError, one_line

OnText = Callable[[str], None]


class CloudFailure(CloudError):
    """A cloud call failed; `.partial` is the text already passed to on_text (may be "")."""

    def __init__(self, reason: str, partial: str = "") -> None:
        super().__init__(reason)
        self.partial = partial


class CloudBudgetExhausted(CloudFailure):
    """The session's caps refuse another call; raised before any request is sent."""


class CloudInterrupted(KeyboardInterrupt):
    """Ctrl-C during a cloud call: the stream is closed; `.partial` is the text already shown."""

    def __init__(self, partial: str = "") -> None:
        super().__init__("cloud call interrupted")
        self.partial = partial


@dataclass(frozen=True)
class CloudReply:
    """One finished cloud call: for a span, `text` is exactly what follows the partial answer."""

    text: str
    usage: dict[str, int]
    cost_usd: float
    model: str
    stop_reason: str | None
    elapsed_s: float
    raw_text: str = ""  # the model's own output, before splicing and trimming


def require_key(api_key: str | None = None) -> str:
    """The API key to use (the argument, else ANTHROPIC_API_KEY); CloudError when there is none."""
    key = (api_key if api_key is not None else os.environ.get("ANTHROPIC_API_KEY", "")).strip()
    if not key:
        raise CloudError(
            "no ANTHROPIC_API_KEY set: export your Anthropic API key to use the cloud tier, or leave it off"
        )
    return key


_STATUS = {
    401: "authentication failed (check ANTHROPIC_API_KEY)",
    403: "permission denied",
    404: "not found (check the cloud model id)",
    413: "request too large",
    429: "rate limited",
    529: "overloaded",
}


# Characters of a cloud failure a notice shows.
SHOWN = 120


def _conversation(system: str | None, messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[dict]]:
    """System text and user/assistant turns; a "system" turn joins the system text.

    A conversation the API would refuse is a CloudFailure raised before sending, so callers
    handle it as any failed call (the local answer stands) rather than as a crash.
    """
    systems, turns = [system] if system else [], []
    for m in messages:
        role, content = m.get("role"), m.get("content")
        if not isinstance(content, str) or not content.strip():
            raise _unsendable(f"a {role!r} message needs non-empty text content")
        if role == "system":
            systems.append(content)
        elif role in ("user", "assistant"):
            turns.append({"role": role, "content": content})
        else:
            raise _unsendable(f"unknown message role {role!r}")
    if not turns or turns[-1]["role"] != "user":
        raise _unsendable("the conversation must end with a user message")
    return "\n\n".join(systems), turns


def _unsendable(why: str) -> CloudFailure:
    return CloudFailure(f"cloud tier not asked: the API would refuse this request ({why})")


class CloudClient:
    """The cloud tier: span continuations and answer hand-offs, within the session budget."""

    def __init__(
        self,
        settings: CloudSettings | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        budget: CloudBudget | None = None,
    ) -> None:
        self.settings = settings or CloudSettings()
        self.price = self.settings.price  # an unpriced model fails here, before any call
        self.budget = budget or CloudBudget(self.settings)
        # The SDK reads ANTHROPIC_BASE_URL itself when base_url is None; the key we pass
        # explicitly so it never falls back to credential files or other variables.
        self._sdk = anthropic.Anthropic(
            api_key=require_key(api_key),
            base_url=base_url,
            timeout=self.settings.timeout_s,
            max_retries=self.settings.max_retries,
        )

    def __repr__(self) -> str:
        return f"CloudClient(model={self.settings.model!r}, base_url={str(self._sdk.base_url)!r})"

    def close(self) -> None:
        """Close the HTTP connections."""
        self._sdk.close()

    def __enter__(self) -> CloudClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def continue_span(
        self,
        system: str | None,
        messages: Sequence[Mapping[str, Any]],
        partial_answer: str,
        on_text: OnText | None = None,
    ) -> CloudReply:
        """A short continuation of partial_answer (the local reply to the last user message)."""
        system, turns = _conversation(system, messages)
        prompt = span_prompt(turns[-1]["content"], partial_answer, self.settings.span_tokens)
        turns[-1] = {"role": "user", "content": prompt}  # no assistant prefill: see span_prompt
        return self._call(
            system, turns, self.settings.span_tokens, SpanSplicer(partial_answer), on_text, True
        )

    def answer(
        self, system: str | None, messages: Sequence[Mapping[str, Any]], on_text: OnText | None = None
    ) -> CloudReply:
        """The whole answer to the conversation's last user message."""
        system, turns = _conversation(system, messages)
        return self._call(system, turns, self.settings.answer_tokens, Passthrough(), on_text, False)

    def _call(self, system, turns, max_tokens, splicer, on_text, deadline) -> CloudReply:
        """Check the caps, stream one request, charge it; return the reply or raise."""
        chars = len(system) + sum(len(t["content"]) for t in turns)
        refusal = self.budget.refusal(estimate_usd(self.price, chars, max_tokens))
        if refusal is not None:
            raise CloudBudgetExhausted(refusal)
        request = {"model": self.settings.model, "max_tokens": max_tokens, "messages": turns}
        if system:
            request["system"] = system
        shown: list[str] = []
        start, stream, reason, finished = time.monotonic(), None, None, False
        try:
            with ExitStack() as stack:  # closes the HTTP stream on every way out, Ctrl-C included
                stream, reason = self._open(stack, request)
                if stream is not None:
                    reason = self._read(stream, splicer, shown, on_text, start if deadline else None)
                message = _snapshot(stream)
                reason = reason or _incomplete(message)
                if reason is None:
                    self._show(splicer.finish(message.stop_reason == "max_tokens"), shown, on_text)
                finished = True
        except KeyboardInterrupt:
            raise CloudInterrupted("".join(shown)) from None
        finally:
            # Charge every call, failed or interrupted too: its input tokens may be billed already.
            message = _snapshot(stream)
            usage = usage_counts(message.usage) if message is not None else None
            cost = self.budget.charge(usage, failed=reason is not None or not finished)
        if reason is not None:
            raise CloudFailure(self._scrub(reason), "".join(shown))
        assert usage is not None  # a complete reply has a message, and so its usage
        return CloudReply(
            text="".join(shown),
            usage=usage,
            cost_usd=cost,
            model=message.model or self.settings.model,
            stop_reason=message.stop_reason,
            elapsed_s=time.monotonic() - start,
            raw_text=splicer.raw,
        )

    def _open(self, stack: ExitStack, request: dict) -> tuple[Any, str | None]:
        """Send the request (the SDK retries here); the stream, or None and why not."""
        try:
            return stack.enter_context(self._sdk.messages.stream(**request)), None
        except Exception as err:
            return None, self._reason(err)

    def _read(
        self, stream: Any, splicer: Any, shown: list[str], on_text: OnText | None, deadline_from: float | None
    ) -> str | None:
        """Show the text as it streams; why the stream broke, or None."""
        events = iter(stream)
        while True:
            try:
                event = next(events)
            except StopIteration:
                return None
            except Exception as err:
                return self._reason(err)
            piece = _text_of(event)
            if piece:
                self._show(splicer.feed(piece), shown, on_text)
            if deadline_from is not None and time.monotonic() - deadline_from > self.settings.timeout_s:
                return f"cloud tier too slow: no full reply within {self.settings.timeout_s:g} s"

    @staticmethod
    def _show(piece: str, shown: list[str], on_text: OnText | None) -> None:
        if piece:
            shown.append(piece)  # before on_text: a Ctrl-C inside it must not lose the piece
            if on_text is not None:
                on_text(piece)

    def _reason(self, err: BaseException) -> str:
        """One line saying why a call failed (never the key: _scrub runs on it too)."""
        if isinstance(err, anthropic.APITimeoutError) or "Timeout" in type(err).__name__:
            return f"cloud tier unavailable: no reply within {self.settings.timeout_s:g} s"
        if isinstance(err, anthropic.APIStatusError):
            status, detail = err.status_code, err.api_message or ""
            if status == 200:  # an `error` event inside a 200 stream: the SDK never retries these
                kind = err.type or "error"
                return one_line(
                    f"cloud tier failed mid-reply: {kind}" + (f": {detail}" if detail else ""), SHOWN
                )
            label = _STATUS.get(status) or ("server error" if status >= 500 else "request rejected")
            if status not in _STATUS and status < 500 and detail:
                label += f": {detail}"
            return one_line(f"cloud tier unavailable: HTTP {status} {label}", SHOWN)
        if isinstance(err, anthropic.APIConnectionError):
            url = urlsplit(str(self._sdk.base_url))
            return f"cloud tier unavailable: cannot connect to {url.hostname}" + (
                f":{url.port}" if url.port else ""
            )
        if type(err).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore"):
            return "cloud tier unavailable: connection lost mid-reply"
        return f"cloud tier failed: malformed reply ({type(err).__name__})"

    def _scrub(self, text: str) -> str:
        key = self._sdk.api_key
        return text.replace(key, "[key]") if key else text


def _text_of(event: Any) -> str:
    """The text of a text_delta event, else "" (a malformed event is caught at the end)."""
    delta = getattr(event, "delta", None)
    if (
        delta is not None
        and getattr(event, "type", None) == "content_block_delta"
        and getattr(delta, "type", None) == "text_delta"
    ):
        return delta.text if isinstance(delta.text, str) else ""
    return ""


def _snapshot(stream: Any) -> Any:
    """The message accumulated so far, or None before message_start."""
    if stream is None:
        return None
    try:
        return stream.current_message_snapshot
    except AssertionError:
        return None


def _incomplete(message: Any) -> str | None:
    """Why a stream that ended without an error is still not a usable reply, or None."""
    if message is None:
        return "cloud tier failed: malformed reply (no message)"
    if message.stop_reason is None:
        return "cloud tier unavailable: reply cut off before its end"
    if message.stop_reason == "refusal":
        return "cloud tier declined to answer (refusal)"
    return None
