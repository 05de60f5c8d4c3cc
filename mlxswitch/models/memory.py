"""Will a profile fit? Weights read from file headers (or guessed from names) plus a KV cache each."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import InsufficientMemoryError
from ..tier_names import local_tier_names
from .footprint import Footprint, float_width
from .gears import DEFAULT_GROUP_SIZE
from .machine import available_memory_bytes
from .nesting import plane_bits_for
from .row_routes import keeps_dense_weights
from .sources import model_source

KV_CONTEXT_TOKENS = 4096
_GB = 1e9


def estimate_model_bytes(source: str) -> int | None:
    """Bytes the model's weights take once loaded here (floats in fp32 on a CPU); None if not local."""
    weights = model_source(source).footprint()
    return _loaded_bytes(weights) if weights is not None else None


def _loaded_bytes(weights: Footprint) -> int:
    # A CPU keeps an fp32 copy of plain quantized linears when it fits (rows.py).
    dense = 4 * weights.linear_params
    return weights.bytes + (dense if dense and keeps_dense_weights(weights.linear_params) else 0)


_PARAMS_IN_NAME = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)([BM])(?![A-Za-z])")
_BITS_IN_NAME = re.compile(r"(\d+)[-_]?bit", re.IGNORECASE)


def _guess_weights(source: str) -> Footprint | None:
    name = source.rsplit("/", 1)[-1]
    found = _PARAMS_IN_NAME.search(name)
    if found is None:
        return None
    params = int(float(found.group(1)) * (1e9 if found.group(2) == "B" else 1e6))
    bits = _BITS_IN_NAME.search(name)
    if bits:  # b-bit weights plus a scale and a bias per group of 64
        per_param = int(bits.group(1)) / 8 + 2 * float_width(2) / 64
    else:  # no quantization in the name: a half-precision checkpoint
        per_param = float_width(2)
    return Footprint(int(params * per_param), params, {})


def guess_model_bytes(source: str) -> int | None:
    """Weights of a model not downloaded yet, from its name ('…-7B-…-4bit'); None if it says nothing."""
    weights = _guess_weights(source)
    return weights.bytes if weights is not None else None


def kv_cache_bytes(config: dict, tokens: int = KV_CONTEXT_TOKENS) -> int:
    """Keys and values for `tokens` of context (capped by the model's own), from an mlx-lm config."""
    width = float_width(2)
    if not config.get("num_hidden_layers"):
        return 64 * 1024 * tokens * width // 2  # ~a 3B GQA model's fp16 KV per token, when unknown
    tokens = min(tokens, int(config.get("max_position_embeddings") or tokens))
    heads = int(config.get("num_attention_heads") or 32)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or (config.get("hidden_size") or 4096) // heads)
    return 2 * int(config["num_hidden_layers"]) * kv_heads * head_dim * width * tokens


def _gear_plane_bytes(weights: Footprint, gears: tuple[int, ...]) -> int:
    """Nesting in memory: the planes (top gear's bits + scales per plane) sit beside the source."""
    if weights.config.get("mlxswitch_gears"):
        return 0  # saved already nested: the files are the planes
    planes = plane_bits_for(tuple(gears))
    per_param = sum(planes) / 8 + len(planes) * 2 * float_width(2) / DEFAULT_GROUP_SIZE
    return int(weights.params * per_param)


@dataclass(frozen=True)
class ModelMemory:
    """One model's share of a profile: weights (with gear planes while nesting) and its KV cache."""

    role: str
    source: str
    weights: int | None  # None: neither on disk nor guessable from the name
    kv: int
    guessed: bool = False


@dataclass(frozen=True)
class MemoryEstimate:
    """What a profile needs against what the machine has; unknown models count as zero."""

    name: str
    models: tuple[ModelMemory, ...]
    available: int

    @property
    def needed(self) -> int:
        """Bytes of every known model's weights and KV cache."""
        return sum((m.weights or 0) + m.kv for m in self.models if m.weights is not None)

    @property
    def unknown(self) -> tuple[str, ...]:
        """Sources whose size could not be found or guessed."""
        return tuple(m.source for m in self.models if m.weights is None)

    @property
    def fits(self) -> bool:
        """Whether the known needs fit."""
        return self.needed <= self.available

    def summary(self) -> str:
        """'small 0.3 GB + large 4.6 GB + KV 0.9 GB', for messages."""
        known = [m for m in self.models if m.weights is not None]
        parts = [f"{m.role} {m.weights / _GB:.1f} GB" for m in known if m.weights is not None]
        text = " + ".join(parts + [f"KV {sum(m.kv for m in known) / _GB:.1f} GB"])
        if any(m.guessed for m in known):
            text += "; sizes of models not downloaded yet are guessed from their names"
        if self.unknown:
            text += f"; size of {', '.join(self.unknown)} unknown"
        return text


def estimate_memory(profile_or_sources, tokens: int = KV_CONTEXT_TOKENS) -> MemoryEstimate:
    """Weights of every model (from files on disk, else guessed from names) plus a KV cache each."""
    if isinstance(profile_or_sources, str):
        profile_or_sources = [profile_or_sources]
    if isinstance(profile_or_sources, Sequence):
        name, sources, gears = "these models", tuple(profile_or_sources), ()
    else:
        profile = profile_or_sources
        name, sources, gears = f"profile '{profile.name}'", tuple(profile.models), tuple(profile.gears)
    roles = local_tier_names(len(sources)) if len(sources) <= 2 else ("model",) * len(sources)
    models = []
    for role, source in zip(roles, sources, strict=True):
        weights, guessed = model_source(source).footprint(), False
        if weights is None:
            weights, guessed = _guess_weights(source), True
        if weights is None:
            models.append(ModelMemory(role, source, None, 0))
            continue
        if gears:
            size = weights.bytes + _gear_plane_bytes(weights, gears)
        else:
            size = _loaded_bytes(weights)
        models.append(ModelMemory(role, source, size, kv_cache_bytes(weights.config, tokens), guessed))
    return MemoryEstimate(name, tuple(models), available_memory_bytes())


def check_memory(profile_or_sources, force: bool = False) -> MemoryEstimate:
    """Refuse a profile (or list of model sources) whose models will not fit, unless forced."""
    estimate = estimate_memory(profile_or_sources)
    if not estimate.fits and not force:
        raise InsufficientMemoryError(
            f"{estimate.name} needs about {estimate.needed / _GB:.1f} GB ({estimate.summary()}) but "
            f"this machine has {estimate.available / _GB:.1f} GB available; "
            "use --force-memory to try anyway"
        )
    return estimate
