"""The tier ladder: which model (or gear of one model) makes a token, and the KV caches they keep."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from .loading import LoadedModel, load_model

ProgressCallback = Callable[[str], None]


@dataclass
class CacheGroup:
    """One model's KV cache and how many of the conversation's token ids it already holds."""

    model: LoadedModel
    cache: list = field(default_factory=list)
    seen: int = 0

    def __post_init__(self) -> None:
        if not self.cache:
            self.cache = make_prompt_cache(self.model.model)

    @property
    def trimmable(self) -> bool:
        """Whether the cache can drop its newest tokens (attention caches can; recurrent ones not)."""
        return can_trim_prompt_cache(self.cache)

    def rewind(self, keep: int) -> None:
        """Keep only the first `keep` tokens, trimming when possible and starting over otherwise."""
        if keep >= self.seen:
            return
        if self.trimmable:
            trim_prompt_cache(self.cache, self.seen - keep)
            self.seen = keep
        else:
            self.reset()

    def reset(self) -> None:
        """Forget everything the cache holds."""
        self.cache = make_prompt_cache(self.model.model)
        self.seen = 0


@dataclass
class Tier:
    """A rung of the ladder: a name, the cache group it decodes with and, for gears, its gear."""

    name: str
    group: CacheGroup
    gear: int | None = None
    bytes_per_token: int = 0  # weights read per decoded token

    def __post_init__(self) -> None:
        from .gears import bytes_per_token

        self.bytes_per_token = bytes_per_token(self.group.model.model, self.gear)

    @property
    def model(self) -> LoadedModel:
        """The loaded model this tier runs."""
        return self.group.model

    def activate(self) -> None:
        """Make this tier's precision the one the shared model computes with (gears only)."""
        if self.gear is not None:
            self.group.model.model.gear_state.set(self.gear)


@dataclass
class Ladder:
    """Tiers from cheapest to strongest, with the tokenizer they all share."""

    tiers: list[Tier]
    description: str = ""

    @property
    def groups(self) -> list[CacheGroup]:
        """Distinct cache groups, bottom first."""
        out: list[CacheGroup] = []
        for tier in self.tiers:
            if all(tier.group is not g for g in out):
                out.append(tier.group)
        return out

    @property
    def tokenizer(self):
        """The tokenizer every tier shares (the bottom tier's)."""
        return self.tiers[0].model.tokenizer

    @property
    def tier_names(self) -> list[str]:
        """Names of the tiers, bottom first."""
        return [t.name for t in self.tiers]

    @property
    def vocab_size(self) -> int:
        """Length of the bottom tier's output distribution (the router's log2 V)."""
        return self.tiers[0].model.vocab_size

    @property
    def context_length(self) -> int:
        """The shortest context among the tiers' models."""
        return min(g.model.context_length for g in self.groups)

    def reset(self) -> None:
        """Empty every cache."""
        for group in self.groups:
            group.reset()


def single_model_ladder(model: LoadedModel, name: str = "model") -> Ladder:
    """A one-tier ladder: plain decoding on one model."""
    return Ladder([Tier(name, CacheGroup(model))], description=model.name)


def pair_ladder(small: LoadedModel, large: LoadedModel) -> Ladder:
    """A small → large ladder; the models must share a tokenizer (checked by the caller)."""
    return Ladder([Tier("small", CacheGroup(small)), Tier("large", CacheGroup(large))],
                  description=f"{small.name} → {large.name}")


def gear_ladder(model: LoadedModel, gears: list[int]) -> Ladder:
    """Gear tiers of one nested-gear model sharing a single cache."""
    group = CacheGroup(model)
    return Ladder([Tier(f"g{bits}", group, gear=bits) for bits in gears],
                  description=f"{model.name} gears {'/'.join(map(str, gears))}")


def load_pair(small_source: str, large_source: str,
              progress: ProgressCallback | None = None) -> Ladder:
    """Load two models, check that they share a tokenizer, and build their ladder."""
    from .validation import check_shared_tokenizer

    small = _load(small_source, progress)
    large = _load(large_source, progress)
    check_shared_tokenizer(small.source, small.tokenizer, large.source, large.tokenizer)
    return pair_ladder(small, large)


def _load(source: str, progress: ProgressCallback | None) -> LoadedModel:
    if progress:
        progress(f"loading {source}")
    return load_model(source)
