"""A request as the engine answers it: how to sample and when to stop (GenerationSettings, checked
when built), the prompt made ready (PreparedAnswer), and what a session's requests are answered
under: the conversation they continue (Conversation) and how they decode (Arm)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import UsageError
from ..routing.policies import Policy
from ..routing.router import RouterConfig
from .mode import DecodingMode

MAX_TOP_LOGPROBS = 20  # OpenAI's limit
# Builds an answer's policy from (router settings, tier count), as make_policy does.
PolicyFactory = Callable[[RouterConfig, int], Policy]


@dataclass(frozen=True)
class GenerationSettings:
    """How to sample and when to stop; checked when built."""

    max_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    prefill_step: int = 512
    max_kv_size: int | None = None  # a rotating KV cache of this many tokens (mlx-lm's option)
    top_logprobs: int | None = None  # None: no log-probabilities; k ≥ 0: each token's and the top k

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise UsageError(f"--max-tokens must be at least 1 (got {self.max_tokens})")
        if self.temperature < 0:
            raise UsageError(f"--temp must be ≥ 0 (got {self.temperature})")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"--top-p must be in (0, 1] (got {self.top_p})")
        if self.top_k < 0:
            raise UsageError(f"--top-k must be ≥ 0 (got {self.top_k}; 0 keeps every token)")
        if not 0 <= self.min_p <= 1:
            raise UsageError(f"--min-p must be in [0, 1] (got {self.min_p})")
        if self.max_kv_size is not None and self.max_kv_size < 1:
            raise UsageError(f"--max-kv-size must be at least 1 token (got {self.max_kv_size})")
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise UsageError(
                f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS} (got {self.top_logprobs})"
            )
        if self.prefill_step < 1:
            raise UsageError(f"the prefill step must be at least 1 token (got {self.prefill_step})")


@dataclass(frozen=True)
class PreparedAnswer:
    """A request made ready to answer: the rendered prompt ids, checked against the context."""

    prompt: str  # the text the answer is to (the last user message, or the raw text)
    prompt_ids: list[int]
    messages: list[dict] | None  # the conversation (None: a raw-text completion)
    settings: GenerationSettings
    budget: int  # tokens this answer may make: max_tokens, or what the context has left
    # A control policy built from (router settings, tiers) in place of the router's: the bench's
    # random and oracle arms. Such an answer takes the token loop, and is never batched.
    control: PolicyFactory | None = None


@dataclass
class Conversation:
    """A session's conversation: its system prompt, its turns so far, and the token ids so far
    (what the caches hold, reused by the next turn)."""

    system: str | None = None
    messages: list[dict] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Arm:
    """How a session's next answer decodes: the routing settings and the decoding mode, checked
    together (ChatSession.decode_with)."""

    config: RouterConfig
    mode: DecodingMode
