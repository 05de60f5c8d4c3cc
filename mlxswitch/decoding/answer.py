"""Answers built from the loop's steps: streamed text, per-token events and the summary.

An event is final when it is handed out. One whose text may still grow is held back until the
next step arrives or the answer ends: a stop string's possible beginning is held back, and a
detokenizer may hold bytes (an unfinished UTF-8 character, a lone space, a SentencePiece word)
that only a later token or the end releases. The rest go out at once: the first token is not
kept waiting for the second.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from itertools import pairwise

from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer

from ..json_numbers import json_float, rounded
from .steps import Step

FINISH_REASONS = ("stop", "length", "interrupted")


@dataclass(frozen=True)
class TokenEvent:
    """One generated token: what it is, which tier made it, and the router's view of it."""

    index: int
    id: int
    text: str
    tier: str
    rung: int
    entropy: float | None  # None: a cloud token (no distribution was seen)
    mean: float | None
    guard: bool
    elapsed_s: float
    tried: tuple[str, ...] = ()  # tiers that computed this position, when more than the one that made it
    tried_signals: tuple[float | None, ...] = ()  # the routed signal each of them measured
    signal: float | None = None  # the routed signal, when routing reads one other than entropy
    logprob: float | None = None  # natural log, of the distribution before temperature; when asked for
    top_logprobs: tuple[tuple[int, float], ...] = ()  # (id, logprob) of the likeliest, when asked for
    source: str | None = None  # "lookup": drafted from the sequence itself and kept by the tier's check

    @property
    def proposer(self) -> str:
        """Who proposed this token: "lookup" (copied from the sequence itself, then checked) or the
        tier that made it (under verified drafting the small tier's name is a kept model draft)."""
        return "lookup" if self.source == "lookup" else self.tier

    def record(self) -> dict:
        """The JSON record of this token (the same in --json and --telemetry)."""
        out = {
            "id": self.id,
            "text": self.text,
            "tier": self.tier,
            "proposer": self.proposer,
            "entropy": json_float(self.entropy),
            "mean": json_float(self.mean),
        }
        if self.signal is not None:
            out["signal"] = json_float(self.signal)
        if self.guard:
            out["guard"] = True
        if self.source is not None:
            out["source"] = self.source
        if len(self.tried) > 1:
            out["tried"] = [
                [name, json_float(h)] for name, h in zip(self.tried, self.tried_signals, strict=True)
            ]
        return out


@dataclass
class AnswerSummary:
    """What one answer cost and where its tokens came from."""

    prompt: str
    text: str
    finish_reason: str  # one of FINISH_REASONS
    tokens: list[TokenEvent]
    prompt_tokens: int
    prefilled_tokens: int
    initial_entropy: float | None  # None: the top tier opened the answer (verified drafting)
    tier_names: list[str]
    elapsed_s: float
    first_token_s: float | None  # None: no token was made
    peak_memory_gb: float
    catch_up_tokens: dict[str, int] = field(default_factory=dict)
    tier_bytes: dict[str, int] = field(default_factory=dict)
    ended_by_eos: bool = False
    initial_signal: float | None = None  # the routed signal at the prompt's end, when not entropy
    cloud: dict | None = None  # costs (this answer, the session) and spans, with a cloud tier
    handoff: dict | None = None  # the hand-off's score, decision and both answers
    refed_tokens: int = 0  # earlier tokens prefilled again: a rotating cache that could not rewind
    passes: dict | None = None  # where the seconds went (ledger.py's record), when the loop times them
    checked_by: str | None = None  # the tier that checked every token (verified drafting), else None

    @property
    def mean_bytes_per_token(self) -> float:
        """Weights read per token of this answer: every tier that computed its position counts."""
        if not self.tokens:
            return 0.0
        return sum(
            self.tier_bytes.get(name, 0) for e in self.tokens for name in (e.tried or (e.tier,))
        ) / len(self.tokens)

    @property
    def generated(self) -> int:
        """Number of tokens in the answer."""
        return len(self.tokens)

    @property
    def tier_counts(self) -> dict[str, int]:
        """Tokens per tier, every tier listed."""
        counts = {name: 0 for name in self.tier_names}
        for event in self.tokens:
            counts[event.tier] += 1
        return counts

    @property
    def proposer_counts(self) -> dict[str, int]:
        """Tokens per proposer (TokenEvent.proposer): every tier listed, then "lookup" if any."""
        counts = {name: 0 for name in self.tier_names}
        for event in self.tokens:
            counts[event.proposer] = counts.get(event.proposer, 0) + 1
        return counts

    @property
    def source_counts(self) -> dict[str, int]:
        """Tokens proposed by something other than a tier (e.g. "lookup"), by source."""
        counts: dict[str, int] = {}
        for event in self.tokens:
            if event.source is not None:
                counts[event.source] = counts.get(event.source, 0) + 1
        return counts

    @property
    def switches(self) -> int:
        """How often consecutive tokens came from different tiers."""
        return sum(a.tier != b.tier for a, b in pairwise(self.tokens))

    @property
    def tok_per_s(self) -> float | None:
        """Decode speed after the first token (the first token's time is prompt processing)."""
        if self.generated < 2:
            return None
        decode_s = self.tokens[-1].elapsed_s - self.tokens[0].elapsed_s
        return (self.generated - 1) / decode_s if decode_s > 0 else None

    @property
    def prompt_tok_per_s(self) -> float | None:
        """Prompt processing speed: new prompt tokens over the time to the first token."""
        if not self.first_token_s or not self.prefilled_tokens:
            return None
        return self.prefilled_tokens / self.first_token_s

    def stats(self) -> dict:
        """The `stats` object of the JSON output."""
        out = {
            "generated": self.generated,
            "prompt_tokens": self.prompt_tokens,
            "prefilled_tokens": self.prefilled_tokens,
            "tiers": self.tier_counts,
            "proposers": self.proposer_counts,
            **({"checked_by": self.checked_by} if self.checked_by is not None else {}),
            "switches": self.switches,
            "catch_up_tokens": self.catch_up_tokens,
            "tok_per_s": rounded(self.tok_per_s, 3),
            "prompt_tok_per_s": rounded(self.prompt_tok_per_s, 3),
            "first_token_s": rounded(self.first_token_s, 4),
            "elapsed_s": round(self.elapsed_s, 4),
            "peak_memory_gb": round(self.peak_memory_gb, 4),
            "bytes_per_token": self.tier_bytes,
            "mean_bytes_per_token": round(self.mean_bytes_per_token),
        }
        if self.source_counts:
            out["sources"] = self.source_counts
        if self.passes is not None:
            out["passes"] = self.passes
        if self.refed_tokens:
            out["refed_tokens"] = self.refed_tokens
        if self.cloud is not None:
            out["cloud"] = self.cloud
        return out


class TextAssembler:
    """Streams detokenized text, holding back what could still become a stop string."""

    def __init__(self, tokenizer, stop: tuple[str, ...]):
        self.detokenizer = tokenizer.detokenizer
        self.detokenizer.reset()
        # The byte-level BPE detokenizer writes out all it holds whenever a token adds text; the
        # others (SentencePiece, naive) may hold text back after any token.
        self.flushes_with_text = isinstance(self.detokenizer, BPEStreamingDetokenizer)
        self.stop = tuple(s for s in stop if s)
        self.emitted = 0
        self.text = ""
        self.stopped = False
        self.settled = False  # after the latest token: nothing held back that the end would release

    def add(self, token: int) -> str:
        """Add a token; return the newly safe text (may be empty)."""
        self.detokenizer.add_token(token)
        segment = self.detokenizer.last_segment
        self.text += segment
        for s in self.stop:
            at = self.text.find(s)
            if at >= 0:
                self.text, self.stopped = self.text[:at], True
        piece = self._release(final=self.stopped)
        self.settled = self.stopped or (
            self.flushes_with_text and bool(segment) and self.emitted == len(self.text)
        )
        return piece

    def finish(self) -> str:
        """Flush the detokenizer; return the remaining text."""
        if not self.stopped:
            self.detokenizer.finalize()
            self.text += self.detokenizer.last_segment
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        safe = len(self.text)
        if not final:
            for s in self.stop:  # keep back a tail that is a prefix of a stop string
                for k in range(min(len(s) - 1, len(self.text)), 0, -1):
                    if self.text.endswith(s[:k]):
                        safe = min(safe, len(self.text) - k)
                        break
        piece, self.emitted = self.text[self.emitted : safe], max(self.emitted, safe)
        return piece


class AnswerBuilder:
    """Turns steps into final TokenEvents and, at the end, the AnswerSummary."""

    def __init__(
        self,
        prompt: str,
        tokenizer,
        stop: tuple[str, ...],
        tier_names: list[str],
        prompt_tokens: int,
        prefilled: int,
        group_names: list[str],
        tier_bytes: dict[str, int],
        signal: str = "entropy",
        checked_by: str | None = None,
    ):
        self.prompt = prompt
        self.checked_by = checked_by  # the tier that checks every token (verified drafting)
        self.signal = signal  # the routed signal's name: recorded per token unless it is entropy
        self.tier_names = tier_names
        self.prompt_tokens = prompt_tokens
        self.prefilled = prefilled  # prompt tokens beyond what the conversation already held
        self.text = TextAssembler(tokenizer, stop)
        self.events: list[TokenEvent] = []
        self.catch_up = {name: 0 for name in group_names}
        self.tier_bytes = tier_bytes
        self.start = time.perf_counter()
        self._held: TokenEvent | None = None

    @property
    def stopped(self) -> bool:
        """Whether a stop string ended the text."""
        return self.text.stopped

    def add(self, step: Step) -> tuple[TokenEvent, ...]:
        """Take a step; return the events now final: the held one, and this step's unless its
        text may still grow (then it is held until the next step or the end)."""
        elapsed = time.perf_counter() - self.start
        for name, count in step.catch_up.items():
            self.catch_up[name] += count
        several = len(step.tried) > 1
        tried = tuple(self.tier_names[r] for r in step.tried) if several else ()
        event = TokenEvent(
            len(self.events),
            step.token,
            self.text.add(step.token),
            self.tier_names[step.rung],
            step.rung,
            step.entropy,
            step.mean,
            step.guard,
            elapsed,
            tried,
            step.tried_signals if several else (),
            step.signal if self.signal != "entropy" else None,
            step.logprob,
            step.top_logprobs,
            step.source,
        )
        self.events.append(event)
        released = () if self._held is None else (self._held,)
        if self.text.settled:
            self._held = None
            return (*released, event)
        self._held = event
        return released

    def finish(
        self,
        finish_reason: str,
        initial_entropy: float | None,
        peak_memory_gb: float,
        ended_by_eos: bool = False,
        initial_signal: float | None = None,
    ) -> tuple[TokenEvent | None, AnswerSummary]:
        """The last event (its text completed) and the summary of the answer."""
        last, self._held = self._held, None
        if finish_reason == "interrupted":
            # Nobody received the held token: the answer is what was handed out.
            if last is not None:
                self.events.pop()
            last = None
        else:
            tail = self.text.finish()
            if last is not None and tail:
                last = TokenEvent(**{**last.__dict__, "text": last.text + tail})
                self.events[-1] = last
        summary = AnswerSummary(
            prompt=self.prompt,
            text="".join(e.text for e in self.events),
            finish_reason=finish_reason,
            tokens=list(self.events),
            prompt_tokens=self.prompt_tokens,
            prefilled_tokens=self.prefilled,
            initial_entropy=initial_entropy,
            tier_names=self.tier_names,
            elapsed_s=time.perf_counter() - self.start,
            first_token_s=self.events[0].elapsed_s if self.events else None,
            peak_memory_gb=peak_memory_gb,
            catch_up_tokens=dict(self.catch_up),
            tier_bytes=self.tier_bytes,
            ended_by_eos=ended_by_eos,
            initial_signal=initial_signal if self.signal != "entropy" else None,
            checked_by=self.checked_by,
        )
        return last, summary
