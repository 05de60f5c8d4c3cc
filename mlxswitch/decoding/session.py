"""A conversation on a ladder: the token ids so far, reused across turns, and one answer at a time.

The session renders the prompt, rewinds the caches to what the new prompt shares with the
conversation, runs the token loop and builds the answer from its steps. It never prints.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Generator

import mlx.core as mx
from mlx_lm.utils import common_prefix_len

from ..errors import PromptTooLongError, UsageError
from ..routing.policies import make_policy
from ..routing.router import BOTTOM_ONLY_SIGNALS, RouterConfig
from ..tier_names import CLOUD_TIER
from .answer import AnswerBuilder, AnswerSummary, TokenEvent
from .cloud_span import CloudTier
from .drafting import MAX_DRAFT, DraftPlanner
from .engine import Engine
from .loop import CloudSpan, TokenLoop
from .mode import DecodingMode
from .prompt_caches import PromptCaches
from .requests import Arm, Conversation, GenerationSettings, PolicyFactory, PreparedAnswer
from .samplers import sampler_for
from .tiers import Ladder
from .verify import VerifyLoop


def check_cache_bound(settings: GenerationSettings, tier_names: list[str] | tuple[str, ...]) -> None:
    """Refuse a bounded (rotating) KV cache on a ladder that switches tiers; a UsageError."""
    # Switching trims a cache by the token it computed ahead (and peek re-computes positions);
    # a rotating cache past its limit cannot be trimmed, so every switch would re-prefill it all.
    if settings.max_kv_size is not None and len(tier_names) > 1:
        raise UsageError(
            f"--max-kv-size works with one tier only: switching between "
            f"{', '.join(tier_names[:-1])} and {tier_names[-1]} trims the KV cache, "
            "which a rotating cache past its limit cannot do; use one model (--model M)"
        )


def shown_by_cloud(summary: AnswerSummary) -> bool:
    """Whether the hand-off chose the cloud's answer (ChatSession.hand_off; the summary's tokens stay
    the local answer's)."""
    return summary.handoff is not None and summary.handoff["shown"] == "cloud"


def shown_text(summary: AnswerSummary) -> str:
    """The answer's text as shown: the cloud's where the hand-off chose it."""
    handoff = summary.handoff
    return handoff["cloud_text"] if handoff is not None and shown_by_cloud(summary) else summary.text


class ChatSession:
    """A conversation on a ladder: the token ids so far, reused across turns."""

    def __init__(
        self,
        ladder: Ladder,
        router_config: RouterConfig,
        settings: GenerationSettings | None = None,
        system: str | None = None,
        cloud: CloudTier | None = None,
        decoding: DecodingMode | None = None,
        prompt_caches: PromptCaches | None = None,
        measure_signals: bool = False,
        keep_learned: Callable[[Ladder], None] | None = None,
    ):
        self.ladder = ladder
        # Keeps what drafting learned on the ladder (its pass costs) for the next run, after each
        # answer (api.open_chat gives draft_store's; a bench's sessions keep nothing).
        self._keep_learned = keep_learned
        self.cloud = cloud
        # Where a hand-off's cloud answer is shown as it arrives (the CLI's terminal); the summary
        # carries it either way (AnswerSummary.handoff).
        self.on_cloud_text: Callable[[str], None] | None = None
        self.prompt_caches = prompt_caches  # other conversations' caches (a server's clients)
        mode = decoding or DecodingMode()
        self._arm = Arm(self._checked(router_config, mode), mode)
        self.settings = settings or GenerationSettings()
        self.conversation = Conversation(system)
        self.last_summary: AnswerSummary | None = None
        check_cache_bound(self.settings, self.tier_names)
        # Measure every token's entropy even where no router reads it (one tier, or the top tier
        # pinned): for a reader of the entropies (the bench's records, serve's provenance, --shade).
        self.measure_signals = measure_signals
        self._stream = mx.new_stream(mx.default_device())
        for group in ladder.groups:
            group.limit_cache(self.settings.max_kv_size)
        self._sampler = sampler_for(self.settings)
        if self.settings.seed is not None:
            mx.random.seed(self.settings.seed)

    @property
    def tier_names(self) -> list[str]:
        """The ladder's tiers, bottom first, with "cloud" on top when the cloud takes spans."""
        return self.ladder.tier_names + ([CLOUD_TIER] if self.cloud and self.cloud.spans_on else [])

    @property
    def router_config(self) -> RouterConfig:
        """The routing settings of the next answer (the ladder's vocabulary filled in)."""
        return self._arm.config

    @router_config.setter
    def router_config(self, config: RouterConfig) -> None:
        self._arm = Arm(self._checked(config, self.decoding), self.decoding)

    def _checked(self, config: RouterConfig, mode: DecodingMode) -> RouterConfig:
        """`config` checked with `mode` against this ladder (a UsageError), its vocabulary filled in."""
        config.validate(len(self.tier_names))
        mode.validate(config, len(self.tier_names))
        if config.signal in BOTTOM_ONLY_SIGNALS and self.ladder.probe is None:
            raise UsageError(
                "routing on the probe needs the probe that `mlxswitch calibrate` trains for "
                "this profile; none is attached to this ladder"
            )
        if config.vocab_size != self.ladder.vocab_size:
            config = config.with_vocab(self.ladder.vocab_size)
        if len(self.tier_names) > len(self.ladder.tiers) and config.top_local is None:
            # The guard never calls the cloud: its top is the strongest local tier.
            config = dataclasses.replace(config, top_local=len(self.ladder.tiers) - 1)
        return config

    @property
    def decoding(self) -> DecodingMode:
        """How the next answer is decoded: routed or verified, its draft rule, prompt lookup."""
        return self._arm.mode

    def decode_with(self, config: RouterConfig, decoding: DecodingMode) -> None:
        """The routing settings and decoding mode of the next answer, checked together (an arm)."""
        self._arm = Arm(self._checked(config, decoding), decoding)

    def reset(self) -> None:
        """Forget the conversation (the caches are rewound, not rebuilt)."""
        self.conversation.messages, self.conversation.ids = [], []
        for group in self.ladder.groups:
            group.rewind(0)

    def render(self, messages: list[dict]) -> list[int]:
        """Token ids of the conversation `messages` (system prompt first), ready for an answer."""
        tokenizer = self.ladder.tokenizer
        system = self.conversation.system
        full = ([{"role": "system", "content": system}] if system else []) + messages
        if tokenizer.has_chat_template:
            return list(tokenizer.apply_chat_template(full, add_generation_prompt=True))
        return list(tokenizer.encode("".join(f"{m['content']}\n" for m in full)))

    def ask(
        self, prompt: str, max_tokens: int | None = None, control: PolicyFactory | None = None
    ) -> AnswerSummary:
        """Answer `prompt` and return the summary (no streaming); control: PreparedAnswer.control."""
        for _ in self.stream(prompt, max_tokens, control):
            pass
        assert self.last_summary is not None
        return self.last_summary

    def stream(
        self, prompt: str, max_tokens: int | None = None, control: PolicyFactory | None = None
    ) -> Generator[TokenEvent | AnswerSummary, None, None]:
        """Yield a TokenEvent per token, then the AnswerSummary; history is kept even if interrupted.

        max_tokens: this answer's limit, when it differs from the settings' (the bench uses it).
        """
        return self.stream_prepared(self.prepare(prompt, max_tokens, control))

    def prepare(
        self, prompt: str, max_tokens: int | None = None, control: PolicyFactory | None = None
    ) -> PreparedAnswer:
        """The conversation's next user turn rendered and checked (PromptTooLongError), not yet
        answered (`stream`'s first half)."""
        messages = self.conversation.messages + [{"role": "user", "content": prompt}]
        settings = (
            self.settings if max_tokens is None else dataclasses.replace(self.settings, max_tokens=max_tokens)
        )
        return self._prepare(prompt, self.render(messages), messages, settings, control)

    def stream_conversation(
        self, messages: list[dict], settings: GenerationSettings | None = None
    ) -> Generator[TokenEvent | AnswerSummary, None, None]:
        """Answer a whole conversation given at once (a server request), as `stream` does.

        The caches keep what the new conversation shares with the sequence so far, so a client
        that sends its history again each turn pays only for the new part.
        """
        return self.stream_prepared(self.prepare_conversation(messages, settings))

    def stream_text(
        self, text: str, settings: GenerationSettings | None = None
    ) -> Generator[TokenEvent | AnswerSummary, None, None]:
        """Continue raw text (no chat template, no system prompt): a plain completion."""
        return self.stream_prepared(self.prepare_text(text, settings))

    def prepare_conversation(
        self, messages: list[dict], settings: GenerationSettings | None = None
    ) -> PreparedAnswer:
        """A whole conversation rendered and checked (PromptTooLongError), not yet answered."""
        prompt = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
        return self._prepare(prompt, self.render(messages), list(messages), settings or self.settings)

    def prepare_text(self, text: str, settings: GenerationSettings | None = None) -> PreparedAnswer:
        """Raw text to continue, tokenized and checked (PromptTooLongError), not yet answered."""
        return self._prepare(text, list(self.ladder.tokenizer.encode(text)), None, settings or self.settings)

    def sampler_for(self, settings: GenerationSettings) -> Callable[[mx.array], mx.array]:
        """The sampler for these settings (samplers.sampler_for; the session's own when they are its
        settings)."""
        return self._sampler if settings is self.settings else sampler_for(settings)

    def _prepare(
        self,
        prompt: str,
        prompt_ids: list[int],
        messages: list[dict] | None,
        settings: GenerationSettings,
        control: PolicyFactory | None = None,
    ) -> PreparedAnswer:
        """The request checked against the context (PromptTooLongError): a refusal raises here,
        before the first event."""
        if not prompt_ids:
            raise UsageError("the prompt is empty: there is nothing to continue")
        budget = self._token_budget(prompt_ids, settings.max_tokens)
        return PreparedAnswer(prompt, prompt_ids, messages, settings, budget, control)

    def stream_prepared(self, prepared: PreparedAnswer) -> Generator[TokenEvent | AnswerSummary, None, None]:
        """Answer a prepared request on this session's sequence and caches: a batch of one on
        the engine every answer is decoded by (engine.py)."""
        self.last_summary = None
        prompt, prompt_ids, messages = prepared.prompt, prepared.prompt_ids, prepared.messages
        settings, conversation = prepared.settings, self.conversation
        if self.prompt_caches is not None:
            reused = self.prompt_caches.switch(self.ladder.groups, conversation.ids, prompt_ids)
            if reused is not None:  # a kept conversation that this prompt continues
                conversation.ids = list(prompt_ids[:reused])
        common = common_prefix_len(conversation.ids, prompt_ids)
        # A rotating cache past its limit cannot be rewound: it starts over and is fed it all again.
        refed = max(group.rewind(common) for group in self.ladder.groups)
        conversation.ids = list(prompt_ids)
        conversation.messages = messages if messages is not None else []
        sampler = self.sampler_for(settings)
        if settings is not self.settings and settings.seed is not None:
            mx.random.seed(settings.seed)
        ladder, cloud = self.ladder, self.cloud
        builder = self.answer_builder(prompt, prompt_ids, settings, len(prompt_ids) - common + refed)
        span = None
        if cloud is not None:
            cloud.start_answer()
            if cloud.spans_on:
                chat = conversation.messages

                def span(answer_ids: list[int], room: int) -> list[int]:
                    return cloud.span(ladder.tokenizer, conversation.system, chat, answer_ids, room)

        loop = self.answer_loop(ladder, conversation.ids, settings, sampler, span, prepared.control)
        mx.reset_peak_memory()
        engine = Engine(self, 1, stream=self._stream)
        events: deque[TokenEvent | AnswerSummary] = deque()
        uid = engine.add_own(prepared, events.append, loop, builder)
        summary: AnswerSummary | None = None
        try:
            with engine.running():
                while engine.active:
                    engine.step()
                    while events:
                        event = events.popleft()
                        if isinstance(event, AnswerSummary):
                            summary = event
                        else:
                            yield event
        finally:
            # Ctrl-C (or a closed generator) lands here too: keep what was produced.
            engine.cancel(uid)
            while events:  # the interrupted answer's last event and summary
                event = events.popleft()
                summary = event if isinstance(event, AnswerSummary) else summary
            # None only where the engine failed before handing the summary over: its error goes on.
            if summary is not None:
                self._finished(summary, refed, messages)
        assert summary is not None, "the engine hands over every answer's summary"
        if messages is not None:  # a chat answer (a raw-text completion has no conversation to re-ask)
            self.hand_off(summary, self.on_cloud_text)
        yield summary

    def _finished(self, summary: AnswerSummary, refed: int, messages: list[dict] | None) -> None:
        """The answer's summary kept, with what only the session knows; the conversation gains
        the answer (or loses the question, where there is no text, so the turns still alternate)."""
        self.last_summary = summary
        summary.refed_tokens = refed
        if self.cloud is not None:
            summary.cloud = self.cloud.answer_record()
        if messages is not None:
            if summary.text.strip():
                self.conversation.messages.append({"role": "assistant", "content": summary.text})
            else:
                self.conversation.messages = messages[:-1]

    def keep_learned(self) -> None:
        """Keep what drafting has learned so far on this ladder, where the session was opened so."""
        if self._keep_learned is not None:
            self._keep_learned(self.ladder)

    def answer_builder(
        self,
        prompt: str,
        prompt_ids: list[int],
        settings: GenerationSettings,
        prefilled: int,
        signal: str | None = None,
    ) -> AnswerBuilder:
        """The builder of an answer to `prompt_ids` on this session's ladder (`prefilled`: the prompt
        tokens its caches did not hold; `signal`: the routed signal's name, the router's if None)."""
        ladder = self.ladder
        return AnswerBuilder(
            prompt,
            ladder.tokenizer,
            settings.stop,
            self.tier_names,
            len(prompt_ids),
            prefilled,
            [g.name for g in ladder.groups],
            {t.name: t.bytes_per_token for t in ladder.tiers},
            self.router_config.signal if signal is None else signal,
            checked_by=self.tier_names[-1] if self.decoding.verify else None,
        )

    def answer_loop(
        self,
        ladder: Ladder,
        ids: list[int],
        settings: GenerationSettings,
        sampler: Callable[[mx.array], mx.array],
        cloud_span: CloudSpan | None = None,
        control: PolicyFactory | None = None,
    ) -> TokenLoop | VerifyLoop:
        """The loop that decodes an answer onto `ids` on `ladder` (this session's, or a fork of it
        that a server's batch decodes beside others), by the decoding mode: verified drafting, or
        the token loop with the policy (and the cloud's spans, if given), or a control policy's."""
        ladder.begin_answer(len(ids))
        config, mode = self.router_config, self.decoding
        if mode.verify and control is None:
            return VerifyLoop(
                ladder,
                ids,
                config.up[0],
                sampler,
                settings.prefill_step,
                signal=config.signal,
                normalize_for_sampler=0 < settings.top_p < 1,
                top_logprobs=settings.top_logprobs,
                planner=DraftPlanner(MAX_DRAFT, mode.draft == "adaptive", ladder.draft_memory, mode.lookup),
                lookup=mode.lookup,
                measure_signals=self.measure_signals,
            )
        return TokenLoop(
            ladder,
            ids,
            (control or make_policy)(config, len(self.tier_names)),
            sampler,
            settings.prefill_step,
            cloud_span=cloud_span,
            signal=config.signal,
            normalize_for_sampler=0 < settings.top_p < 1,
            top_logprobs=settings.top_logprobs,
            pins_top=config.pins_top() and control is None,
            measure_signals=self.measure_signals,
            lookup=mode.lookup,
        )

    def hand_off(self, summary: AnswerSummary, on_text=None) -> dict | None:
        """With the cloud in answer mode: score the answer, re-ask it when unsure; the record.

        Every chat answer that ends whole goes through it (`stream_prepared`): chat, serve and the library
        alike. The conversation keeps the answer shown; the summary carries the record and the costs.
        """
        cloud = self.cloud
        if cloud is None or cloud.spans_on or not summary.text.strip():
            return None
        conversation = self.conversation
        messages = conversation.messages[:-1]  # up to the user turn this answer replied to
        record = cloud.handoff(conversation.system, messages, [e.entropy for e in summary.tokens], on_text)
        record["local_text"] = summary.text
        if record["shown"] == "cloud":
            conversation.messages[-1] = {"role": "assistant", "content": record["cloud_text"]}
        summary.handoff = record
        summary.cloud = cloud.answer_record()
        return record

    def _token_budget(self, prompt_ids: list[int], max_tokens: int) -> int:
        context = self.ladder.context_length
        if len(prompt_ids) >= context:
            raise PromptTooLongError(
                f"the prompt is {len(prompt_ids)} tokens with the conversation so far, but the "
                f"context holds {context}; shorten it or start over (/reset)",
                len(prompt_ids),
                context,
            )
        return min(max_tokens, context - len(prompt_ids))
