"""A model's body and output head as two calls, for signals that read the last hidden state.

mlx-lm's decoder-only models compute `head(model.model(inputs, cache))`, where the head is
`lm_head` or the tied embedding's `as_linear`; the full call returns only the logits. The probe
needs the hidden state in between, so we run the two halves ourselves — once we have checked,
on this very model, that they give the same logits as the full call.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from ..errors import UsageError
from ..kernels.quant_tiles import leading_rows
from ..kernels.quant_weights import QuantViews

# A drafter's head computes the logits of the first DRAFT_IDS ids only. A byte-level BPE
# vocabulary numbers its tokens in merge order, roughly by frequency: on the Qwen pair's traced
# answers 94.5% of the 1.5B's tokens lie below 32,768, and the 0.5B's head then costs 0.58 ms
# a step instead of 4.29 (a quarter of its step). A draft then never proposes a rarer id;
# the check still takes it, so answers do not change.
DRAFT_IDS = 32768


@dataclass(frozen=True)
class SplitModel:
    """`body(inputs, cache=…)` → hidden states after the final norm; `head(hidden)` → logits;
    `draft_head(hidden)` → the logits of ids 0..DRAFT_IDS-1 (None: the model has no such head)."""

    body: Callable
    head: Callable
    hidden_size: int
    draft_head: Callable | None = None

    def head_for(self, draft: bool) -> Callable:
        """The head a pass reads: the draft head for a drafter's pass where there is one."""
        return self.draft_head if draft and self.draft_head is not None else self.head


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
                    draft = _draft_head(model, head, hidden, logits)
                    return SplitModel(body, head, int(hidden.shape[-1]), draft)
    raise UsageError(
        f"{name}: this model's layout gives no hidden state the probe can read "
        "(its output is not lm_head or the tied embedding over model.model); "
        "route on entropy, varentropy or margin instead"
    )


def _draft_head(model: nn.Module, head: Callable, hidden: mx.array, logits: mx.array) -> Callable | None:
    """`head` over its first DRAFT_IDS outputs, where the vocabulary is at least twice that (a
    smaller one saves little) and it gives the whole head's leading logits bit for bit here.
    A nested-gear model keeps its whole head: which planes it reads changes with the gear."""
    if logits.shape[-1] < 2 * DRAFT_IDS or getattr(model, "gear_state", None) is not None:
        return None
    draft = leading_outputs(head, DRAFT_IDS)
    if draft is None or not mx.array_equal(draft(hidden), logits[..., :DRAFT_IDS]).item():
        return None
    return draft


def leading_outputs(head: Callable, rows: int) -> Callable | None:
    """`head` computing only its first `rows` outputs (logits of ids 0..rows-1), on the same arrays
    (a prefix of each: no copy); None for a head held otherwise (a resident fp32 copy, a kind of
    module this does not know). `head` is a linear module or a tied embedding's `as_linear`."""
    bound = getattr(head, "__self__", None)
    module = head if bound is None else bound
    if not isinstance(module, nn.Module) or getattr(module, "dense", None) is not None:
        return None
    part = copy.copy(module)
    for name in ("weight", "scales", "biases", "bias"):
        if module.get(name) is not None:
            part[name] = module[name][:rows]
    quant = getattr(module, "quant", None)
    if quant is not None:
        views = [leading_rows(w, rows) for w in quant.weights]
        if any(v is None for v in views):
            return None
        part.quant = QuantViews(tuple(v for v in views if v is not None))
    return part if bound is None else getattr(part, head.__name__)
