"""Many answers decoded together on one model: continuous batching for single-model profiles.

mlx-lm's BatchGenerator does the batching (a left-padded batch KV cache, prompts prefilled in
chunks between decode steps, per-request samplers and stop tokens); we add what our answers
carry: each token's entropy, log-probabilities when asked, stop strings, finish reasons and
the AnswerSummary, through the same AnswerBuilder as one answer at a time. Requests join and
leave at step boundaries. The engine never prints and never waits: `step()` runs one step and
hands each answer's events to the callback it was added with.

Only one tier is batched: a routed pair, verified drafting or gears decide per request which
model computes the next position (and how many rows), which mlx-lm's batch cannot express.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.generate import BatchGenerator

from ..models.heads import SplitModel
from ..models.machine import peak_memory_gb
from ..routing.signals import read_time_signals
from .answer import AnswerBuilder, AnswerSummary, TokenEvent
from .engine import MLX_LM_BATCH, Engine, batching, shares_passes
from .prompt_caches import PromptCaches
from .samplers import seeded
from .session import ChatSession, PreparedAnswer
from .steps import Step, token_and_top

Deliver = Callable[[TokenEvent | AnswerSummary], None]


def batchable(session: ChatSession) -> bool:
    """Whether mlx-lm's batch takes the session's answers (engine.batching)."""
    ladder = session.ladder
    kind = batching(len(ladder.tiers), session.cloud is not None, session.router_config.signal)
    return kind == MLX_LM_BATCH and ladder.tiers[0].gear is None


class LastRowLogits:
    """The model as mlx-lm's batch calls it, its output head applied to the last position only.

    The batch reads no other position (a prompt chunk's logits are dropped, a step reads
    `[:, -1]`), and on the CPU's NumPy route a head that is built is computed: every prompt row
    went through SmolLM2's 49k-id head, a fifth of a row's FLOPs, and prefill steps took ~12%
    longer (bench/results/batch-steps-embedded.txt). Anything else is the model's own."""

    def __init__(self, model, split: SplitModel):
        self._model, self._split = model, split

    def __call__(self, inputs: mx.array, cache=None) -> mx.array:
        hidden = self._split.body(inputs, cache=cache)
        return self._split.head(hidden[:, -1:, :])

    def __getattr__(self, name: str):
        return getattr(self._model, name)


@dataclass
class _Answer:
    prepared: PreparedAnswer
    builder: AnswerBuilder
    deliver: Deliver
    first_entropy: float | None = None


class BatchedAnswers:
    """Answers decoded together on a single-model session's model (see the module's docstring).

    Build and step it on one thread (MLX streams belong to their thread). `max_batch` answers
    decode together; more wait in mlx-lm's queue and join as others finish.
    """

    def __init__(self, session: ChatSession, max_batch: int, prompt_caches: PromptCaches | None = None):
        if not batchable(session):
            raise ValueError("only a single-model session's answers can be batched")
        self.session = session
        self.prompt_caches = prompt_caches
        ladder = session.ladder
        self.tokenizer = ladder.tokenizer
        self.tier = ladder.tiers[0]
        self.eos = set(self.tokenizer.eos_token_ids)
        settings = session.settings
        split = self.tier.group.checked_split()  # None: a layout whose head we cannot apply alone
        model = self.tier.model.model if split is None else LastRowLogits(self.tier.model.model, split)
        self.generator = BatchGenerator(
            cast(nn.Module, model),  # the batch only calls it and reads its layers
            max_tokens=settings.max_tokens,
            stop_tokens=[[t] for t in sorted(self.eos)],
            completion_batch_size=max_batch,
            prefill_batch_size=max_batch,
            prefill_step_size=settings.prefill_step,
            max_kv_size=settings.max_kv_size,
            stream=mx.new_stream(mx.default_device()),
        )
        self._answers: dict[int, _Answer] = {}

    @property
    def active(self) -> int:
        """Answers begun and not finished (decoding, prefilling or queued in the batch)."""
        return len(self._answers)

    def add(self, prepared: PreparedAnswer, deliver: Deliver) -> int:
        """Queue an answer; its events go to `deliver` as steps make them. Returns its handle."""
        prompt_ids, reused, caches = prepared.prompt_ids, 0, None
        if self.prompt_caches is not None:
            taken = self.prompt_caches.take(prompt_ids)
            if taken is not None:
                caches, reused = taken
        settings = prepared.settings
        sampler = seeded(self.session.sampler_for(settings), settings.seed)
        # The batch's steps carry each token's entropy, whatever signal the profile names.
        builder = self.session.answer_builder(
            prepared.prompt, prompt_ids, settings, len(prompt_ids) - reused, signal="entropy"
        )
        (uid,) = self.generator.insert(
            [prompt_ids[reused:]],
            max_tokens=[prepared.budget],
            caches=None if caches is None else [caches],
            samplers=[sampler],
        )
        self._answers[uid] = _Answer(prepared, builder, deliver)
        return uid

    def cancel(self, uid: int) -> None:
        """End an answer now (its client left, or the server is closing): finish "interrupted"."""
        answer = self._answers.pop(uid, None)
        if answer is None:
            return
        self.generator.remove([uid])
        self._finish(answer, "interrupted", ended_by_eos=False)

    def cancel_all(self) -> None:
        """End every answer now, as `cancel` does."""
        for uid in list(self._answers):
            self.cancel(uid)

    def close(self) -> None:
        """Wait for the work queued on the batch's stream (the worker thread drops its streams
        next: models.machine.release_thread_state) and give back the memory limit mlx-lm's batch set."""
        self.generator.close()
        mx.synchronize(self.generator.stream)

    def running(self) -> contextlib.AbstractContextManager[None]:
        """Around steps, as Engine.running: mlx-lm's batch runs on its own stream already."""
        return contextlib.nullcontext()

    def step(self) -> None:
        """One step of the batch: prompt chunks for joining answers, a token for decoding ones."""
        _, responses = self.generator.next()
        responses = [r for r in responses if r.uid in self._answers]
        if not responses:
            return
        # Each row's entropy in bits through the one reduction the token loop uses (the route's:
        # NumPy on a CPU, the fused kernel on a Mac); log-probabilities are shifted logits.
        entropies = [read_time_signals(r.logprobs).values()[0] for r in responses]
        for response, entropy in zip(responses, entropies, strict=True):
            answer = self._answers[response.uid]
            if answer.first_entropy is None:
                answer.first_entropy = entropy
            ended_by_eos = response.finish_reason == "stop" and response.token in self.eos
            if not ended_by_eos:
                self._add_step(answer, response, entropy)
            if response.finish_reason is None and not answer.builder.stopped:
                continue
            del self._answers[response.uid]
            if response.finish_reason is None:  # a stop string ended it: the batch must drop it
                self.generator.remove([response.uid])
            elif self.prompt_caches is not None and response.prompt_cache is not None:
                held = answer.prepared.prompt_ids + [e.id for e in answer.builder.events]
                if ended_by_eos:
                    held.append(response.token)
                self.prompt_caches.keep(held, response.prompt_cache)
            stopped = answer.builder.stopped or ended_by_eos
            self._finish(answer, "stop" if stopped else "length", ended_by_eos)

    def _add_step(self, answer: _Answer, response, entropy: float) -> None:
        top = answer.prepared.settings.top_logprobs
        logprob, top_logprobs = (
            token_and_top(np.asarray(response.logprobs.astype(mx.float32)).reshape(-1), response.token, top)
            if top is not None
            else (None, ())
        )
        # No router runs in a batch: no rolling mean (None), one tier tried.
        step = Step(
            token=response.token,
            rung=0,
            entropy=entropy,
            mean=None,  # no router: no rolling mean
            guard=False,
            tried=(0,),
            tried_signals=(entropy,),
            logprob=logprob,
            top_logprobs=top_logprobs,
        )
        for event in answer.builder.add(step):
            answer.deliver(event)

    def _finish(self, answer: _Answer, reason: str, ended_by_eos: bool) -> None:
        last, summary = answer.builder.finish(
            reason,
            answer.first_entropy,
            peak_memory_gb(),
            ended_by_eos,
        )
        if last is not None:
            answer.deliver(last)
        answer.deliver(summary)


def batch_engine(
    session: ChatSession, max_batch: int, prompt_caches: PromptCaches | None = None
) -> BatchedAnswers | Engine:
    """What batches a server's answers: mlx-lm's batch for one model, the engine (packed passes)
    for a ladder whose answers share passes; a ValueError for others."""
    if batchable(session):
        return BatchedAnswers(session, max_batch, prompt_caches)
    if not shares_passes(session):
        raise ValueError("only a ladder of two tiers or more, with no cloud or probe, is batched")
    return Engine(session, max_batch, prompt_caches)
