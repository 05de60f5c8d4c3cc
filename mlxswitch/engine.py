"""The decode loop: one sequence of ids, tiers that catch up on it, a router that picks the tier.

The engine yields events and never prints. Per token it runs the current tier, reads the
entropy of the distribution it sampled from, and lets the router choose the next tier.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Iterator

import mlx.core as mx
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import common_prefix_len

from .errors import PromptTooLongError, UsageError
from .ladder import CacheGroup, Ladder, Tier
from .router import Router, RouterConfig
from .signals import token_signals


@dataclass(frozen=True)
class GenerationSettings:
    """How to sample and when to stop."""

    max_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    prefill_step: int = 512

    def validate(self) -> None:
        """Refuse settings that cannot mean anything."""
        if self.max_tokens < 1:
            raise UsageError(f"--max-tokens must be at least 1 (got {self.max_tokens})")
        if self.temperature < 0:
            raise UsageError(f"--temp must be ≥ 0 (got {self.temperature})")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"--top-p must be in (0, 1] (got {self.top_p})")


@dataclass(frozen=True)
class TokenEvent:
    """One generated token: what it is, which tier made it, and the router's view of it."""

    index: int
    id: int
    text: str
    tier: str
    rung: int
    entropy: float
    mean: float
    guard: bool
    varentropy: float
    margin: float
    elapsed_s: float

    def record(self) -> dict:
        """The JSON telemetry record of this token."""
        out = {"id": self.id, "text": self.text, "tier": self.tier,
               "entropy": json_float(self.entropy), "mean": json_float(self.mean)}
        if self.guard:
            out["guard"] = True
        return out


@dataclass
class AnswerSummary:
    """What one answer cost and where its tokens came from."""

    prompt: str
    text: str
    finish_reason: str  # "stop", "length" or "interrupted"
    tokens: list[TokenEvent]
    prompt_tokens: int
    prefilled_tokens: int
    initial_entropy: float
    tier_names: list[str]
    elapsed_s: float
    first_token_s: float
    peak_memory_gb: float
    catch_up_tokens: dict[str, int] = field(default_factory=dict)
    tier_bytes: dict[str, int] = field(default_factory=dict)

    @property
    def mean_bytes_per_token(self) -> float:
        """Weights read per token of this answer, given which tier made each token."""
        if not self.tokens:
            return 0.0
        return sum(self.tier_bytes.get(e.tier, 0) for e in self.tokens) / len(self.tokens)

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
    def switches(self) -> int:
        """How often consecutive tokens came from different tiers."""
        return sum(a.tier != b.tier for a, b in zip(self.tokens, self.tokens[1:]))

    @property
    def tok_per_s(self) -> float:
        """Decode speed after the first token (the first token's time is prompt processing)."""
        if self.generated < 2:
            return 0.0
        decode_s = self.tokens[-1].elapsed_s - self.tokens[0].elapsed_s
        return (self.generated - 1) / decode_s if decode_s > 0 else 0.0

    def stats(self) -> dict:
        """The `stats` object of the JSON output."""
        return {
            "generated": self.generated,
            "prompt_tokens": self.prompt_tokens,
            "prefilled_tokens": self.prefilled_tokens,
            "tiers": self.tier_counts,
            "switches": self.switches,
            "catch_up_tokens": self.catch_up_tokens,
            "tok_per_s": round(self.tok_per_s, 3),
            "first_token_s": round(self.first_token_s, 4),
            "elapsed_s": round(self.elapsed_s, 4),
            "peak_memory_gb": round(self.peak_memory_gb, 4),
            "bytes_per_token": self.tier_bytes,
            "mean_bytes_per_token": round(self.mean_bytes_per_token),
        }


def json_float(value: float) -> float | str:
    """A float for JSON: rounded when finite, "nan"/"inf"/"-inf" strings otherwise."""
    # JSON has no NaN/inf; strings keep them distinct from null (no entropy) and float() reads them.
    if not math.isfinite(value):
        return str(float(value))
    return round(float(value), 6)


class _TextAssembler:
    """Streams detokenized text, holding back what could still become a stop string."""

    def __init__(self, tokenizer, stop: tuple[str, ...]):
        self.detokenizer = tokenizer.detokenizer
        self.detokenizer.reset()
        self.stop = tuple(s for s in stop if s)
        self.emitted = 0
        self.text = ""
        self.stopped = False

    def add(self, token: int) -> str:
        """Add a token; return the newly safe text (may be empty)."""
        self.detokenizer.add_token(token)
        self.text += self.detokenizer.last_segment
        for s in self.stop:
            at = self.text.find(s)
            if at >= 0:
                self.text, self.stopped = self.text[:at], True
        return self._release(final=self.stopped)

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
        piece, self.emitted = self.text[self.emitted:safe], max(self.emitted, safe)
        return piece


class ChatSession:
    """A conversation on a ladder: the token ids so far, reused across turns."""

    def __init__(self, ladder: Ladder, router_config: RouterConfig,
                 settings: GenerationSettings | None = None, system: str | None = None):
        self.ladder = ladder
        self.router_config = router_config
        self.settings = settings or GenerationSettings()
        self.settings.validate()
        router_config.validate(len(ladder.tiers))
        self.system = system
        self.messages: list[dict] = []
        self.ids: list[int] = []
        self.last_summary: AnswerSummary | None = None
        self._stream = mx.new_stream(mx.default_device())
        s = self.settings
        self._sampler = make_sampler(temp=s.temperature, top_p=s.top_p, min_p=s.min_p, top_k=s.top_k)
        if self.settings.seed is not None:
            mx.random.seed(self.settings.seed)

    def reset(self) -> None:
        """Forget the conversation (the caches are rewound, not rebuilt)."""
        self.messages, self.ids = [], []
        for group in self.ladder.groups:
            group.rewind(0)

    def ask(self, prompt: str) -> AnswerSummary:
        """Answer `prompt` and return the summary (no streaming)."""
        for _ in self.stream(prompt):
            pass
        assert self.last_summary is not None
        return self.last_summary

    def stream(self, prompt: str) -> Iterator[TokenEvent | AnswerSummary]:
        """Yield a TokenEvent per token, then the AnswerSummary; history is kept even if interrupted."""
        messages = self.messages + [{"role": "user", "content": prompt}]
        prompt_ids = self._render(messages)
        budget = self._token_budget(prompt_ids)
        common = common_prefix_len(self.ids, prompt_ids)
        for group in self.ladder.groups:
            group.rewind(common)
        self.ids = list(prompt_ids)
        self.messages = messages
        answer = _Answer(self, prompt, len(prompt_ids), prefilled=len(prompt_ids) - common)
        mx.reset_peak_memory()
        self._answer = answer
        try:
            yield from self._decode(answer, budget)
            yield answer.summary("stop" if answer.stopped else "length")
        finally:
            # Ctrl-C (or a closed generator) lands here too: keep what was produced.
            self._reconcile()
            if self.last_summary is None or self.last_summary is not answer.made:
                answer.summary("interrupted")
            self.messages.append({"role": "assistant", "content": answer.text.text})

    # -- decoding ---------------------------------------------------------------------------

    def _decode(self, answer: "_Answer", budget: int) -> Iterator[TokenEvent]:
        tiers = self.ladder.tiers
        router = Router(self.router_config, len(tiers))
        with mx.stream(self._stream):
            # The bottom tier's entropy at the end of the prompt seeds the router.
            first = self._produce(tiers[0])
            mx.eval(first)
            answer.initial_entropy = float(first[1][0].item())
            decision = router.start(answer.initial_entropy)
            rung, guard = decision.rung, decision.guard
            pending = first if rung == 0 else self._produce(tiers[rung])
            mx.async_eval(pending)
            for n in range(budget):
                tier = tiers[rung]
                token_array, signals = pending
                # Build the next step on this tier before reading this token (mlx-lm's pipelining);
                # a switch is rare (min_run), and then this speculative step is rolled back.
                speculative = None
                if n + 1 < budget:
                    speculative = self._produce(tier, token_array)
                    mx.async_eval(speculative)
                token = int(token_array.item())
                entropy, varentropy, margin = signals.tolist()
                self.ids.append(token)
                decision = router.observe(entropy)
                if token in self.ladder.tokenizer.eos_token_ids:
                    answer.stopped = True
                    return
                event = answer.add(token, tier, rung, entropy, decision.mean, guard,
                                   varentropy, margin)
                yield event
                if answer.text.stopped:
                    answer.stopped = True
                    return
                if decision.rung != rung:
                    if speculative is not None:
                        self._roll_back(tier.group)
                    rung, guard = decision.rung, decision.guard
                    pending = self._produce(tiers[rung])
                    mx.async_eval(pending)
                else:
                    guard = False
                    pending = speculative

    def _produce(self, tier: Tier, token: mx.array | None = None) -> tuple[mx.array, mx.array]:
        """Lazily run `tier` on the ids it has not seen (or on `token`); return (next id, signals)."""
        group = tier.group
        if token is None:
            if group.seen >= len(self.ids):
                # It already holds every id but we need the last position's logits again.
                self._roll_back(group, required=True)
            answer = self._answer
            # Generated ids this tier did not make itself: the price of switching.
            answer.catch_up[id(group)] += len(self.ids) - max(group.seen, answer.prompt_tokens)
            inputs = mx.array(self.ids[group.seen:])
        else:
            inputs = token
        logits = self._forward(tier, inputs)
        signals = token_signals(logits)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        return self._sampler(logprobs), signals

    def _forward(self, tier: Tier, inputs: mx.array) -> mx.array:
        """Feed inputs to the tier's model (long inputs in chunks); return last-position logits."""
        step = self.settings.prefill_step
        group = tier.group
        model = group.model.model
        # All but the last token only fill the cache: evaluating the cache state alone skips
        # the output head for those positions (as mlx-lm's prefill does). A shared (gears) cache
        # is filled at its most precise tier, so cheap gears never write lasting low-precision K/V.
        if inputs.size > 1:
            self._top_tier(group).activate()
        while inputs.size > 1:
            chunk = inputs[: min(step, inputs.size - 1)]
            model(chunk[None], cache=group.cache)
            mx.eval([c.state for c in group.cache])
            group.seen += chunk.size
            inputs = inputs[chunk.size:]
        group.seen += inputs.size
        tier.activate()
        return model(inputs[None], cache=group.cache)[:, -1, :]

    def _top_tier(self, group: CacheGroup) -> Tier:
        return [t for t in self.ladder.tiers if t.group is group][-1]

    def _roll_back(self, group: CacheGroup, required: bool = False) -> None:
        """Drop the group's newest token so that it is fed again, by whichever tier needs it."""
        if group.trimmable:
            group.rewind(group.seen - 1)
        elif required:
            # A recurrent cache cannot forget one token: rebuild it from the whole sequence.
            group.reset()
        # Otherwise keep it: the speculative step fed a real token, so the cache is still valid.

    def _reconcile(self) -> None:
        """After an interruption, make no cache claim tokens the sequence does not have."""
        for group in self.ladder.groups:
            if group.seen > len(self.ids):
                group.rewind(len(self.ids))

    # -- prompt -----------------------------------------------------------------------------

    def _render(self, messages: list[dict]) -> list[int]:
        tokenizer = self.ladder.tokenizer
        full = ([{"role": "system", "content": self.system}] if self.system else []) + messages
        if tokenizer.has_chat_template:
            return list(tokenizer.apply_chat_template(full, add_generation_prompt=True))
        text = "".join(f"{m['content']}\n" for m in full)
        return list(tokenizer.encode(text))

    def _token_budget(self, prompt_ids: list[int]) -> int:
        context = self.ladder.context_length
        if len(prompt_ids) >= context:
            raise PromptTooLongError(
                f"the prompt is {len(prompt_ids)} tokens with the conversation so far, but the "
                f"context holds {context}; shorten it or start over (/reset)")
        return min(self.settings.max_tokens, context - len(prompt_ids))


def _group_name(ladder: Ladder, group: CacheGroup) -> str:
    return "+".join(t.name for t in ladder.tiers if t.group is group)


class _Answer:
    """Accumulates one answer's tokens, text and timings."""

    def __init__(self, session: ChatSession, prompt: str, prompt_tokens: int, prefilled: int):
        self.session = session
        self.prompt = prompt
        self.prompt_tokens = prompt_tokens
        self.prefilled = prefilled  # prompt tokens beyond what the conversation already held
        self.text = _TextAssembler(session.ladder.tokenizer, session.settings.stop)
        self.events: list[TokenEvent] = []
        self.initial_entropy = float("nan")
        self.stopped = False
        self.made: AnswerSummary | None = None
        self.start = time.perf_counter()
        self.catch_up = {id(g): 0 for g in session.ladder.groups}

    def add(self, token, tier, rung, entropy, mean, guard, varentropy, margin) -> TokenEvent:
        piece = self.text.add(token)
        event = TokenEvent(len(self.events), token, piece, tier.name, rung, entropy, mean,
                           guard, varentropy, margin, time.perf_counter() - self.start)
        self.events.append(event)
        return event

    def summary(self, finish_reason: str) -> AnswerSummary:
        tail = self.text.finish()
        if tail and self.events:
            last = self.events[-1]
            self.events[-1] = TokenEvent(**{**last.__dict__, "text": last.text + tail})
        ladder = self.session.ladder
        summary = AnswerSummary(
            prompt=self.prompt, text=self.text.text, finish_reason=finish_reason,
            tokens=list(self.events), prompt_tokens=self.prompt_tokens,
            prefilled_tokens=self.prefilled, initial_entropy=self.initial_entropy,
            tier_names=ladder.tier_names, elapsed_s=time.perf_counter() - self.start,
            first_token_s=self.events[0].elapsed_s if self.events else 0.0,
            peak_memory_gb=mx.get_peak_memory() / 1e9,
            catch_up_tokens={_group_name(ladder, g): self.catch_up[id(g)] for g in ladder.groups},
            tier_bytes={t.name: t.bytes_per_token for t in ladder.tiers},
        )
        self.made = summary
        self.session.last_summary = summary
        return summary
