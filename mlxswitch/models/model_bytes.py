"""Bytes a model holds and reads per token: the memory side of every tier's cost."""

from __future__ import annotations

import mlx.nn as nn

from .arrays import flat_parameters


def resident_bytes(model: nn.Module) -> int:
    """Bytes of every parameter the model holds in memory (all gears)."""
    return sum(v.nbytes for _, v in flat_parameters(model))


def bytes_per_token(model: nn.Module, gear: int | None = None) -> int:
    """Bytes of weights read to decode one token at `gear` (None: all planes), in-memory dtypes.

    Convention: only the active planes of nested layers count; norms, biases and every other
    parameter count whole; an input embedding counts one row, unless the head is tied to it,
    in which case the head reads the whole matrix (and the row with it).
    """
    state = getattr(model, "gear_state", None)  # a nested model's GearState (models.gears)
    active = state.gears.index(gear) + 1 if state is not None and gear is not None else None
    tied = getattr(getattr(model, "args", None), "tie_word_embeddings", None)
    if tied is None:
        tied = not any(name == "lm_head" for name, _ in model.named_modules())
    embeddings = {
        name for name, m in model.named_modules() if isinstance(m, (nn.Embedding, nn.QuantizedEmbedding))
    }
    total = 0
    for name, value in flat_parameters(model):
        parts = name.split(".")
        owner = ".".join(parts[:-1])
        if "planes" in parts and active is not None:
            total += value.nbytes if int(parts[parts.index("planes") + 1]) < active else 0
        elif owner in embeddings and not tied:
            total += value.nbytes // value.shape[0]
        else:
            total += value.nbytes
    return total
