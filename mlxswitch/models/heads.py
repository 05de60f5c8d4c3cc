"""A model's body and output head as two calls, for signals that read the last hidden state.

mlx-lm's decoder-only models compute `head(model.model(inputs, cache))`, where the head is
`lm_head` or the tied embedding's `as_linear`; the full call returns only the logits. The probe
needs the hidden state in between, so we run the two halves ourselves — once we have checked,
on this very model, that they give the same logits as the full call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from ..errors import UsageError


@dataclass(frozen=True)
class SplitModel:
    """`body(inputs, cache=…)` → hidden states after the final norm; `head(hidden)` → logits."""

    body: Callable
    head: Callable
    hidden_size: int


def _candidate_heads(model: nn.Module, body) -> list[Callable]:
    heads = []
    if callable(getattr(model, "lm_head", None)):
        heads.append(model.lm_head)
    embed = getattr(body, "embed_tokens", None)
    as_linear = getattr(embed, "as_linear", None)
    if callable(as_linear):
        heads.append(as_linear)
    return heads


def split_model(model: nn.Module, name: str) -> SplitModel:
    """The checked split of `model`; a UsageError when its layout gives no hidden state to read."""
    body = getattr(model, "model", None)
    if body is not None and callable(body):
        probe_ids = mx.array([[0]])  # one position: the split is the same at every one, and a load pays it
        try:
            whole = model(probe_ids).astype(mx.float32)
            hidden = body(probe_ids)
        except (TypeError, ValueError):
            hidden = None
        if hidden is not None:
            for head in _candidate_heads(model, body):
                logits = head(hidden)
                if (
                    logits.shape == whole.shape
                    and mx.allclose(logits.astype(mx.float32), whole, rtol=1e-4, atol=1e-4).item()
                ):
                    return SplitModel(body, head, int(hidden.shape[-1]))
    raise UsageError(
        f"{name}: this model's layout gives no hidden state the probe can read "
        "(its output is not lm_head or the tied embedding over model.model); "
        "route on entropy, varentropy or margin instead"
    )
