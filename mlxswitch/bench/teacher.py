"""Teacher forcing: every tier's entropy and NLL at every position of a fixed answer (one forward each)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..decoding.tiers import Ladder
from .simulate import Positions


def _signals_and_nll(logits: np.ndarray, targets: np.ndarray) -> dict[str, np.ndarray]:
    # float64 log-softmax over the whole vocabulary: the numbers the router reads, the nats we score.
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    log_z = np.log(np.exp(x).sum(axis=-1, keepdims=True))
    logp = x - log_z
    p = np.exp(logp)
    bits = logp / np.log(2.0)
    entropy = -(p * bits).sum(axis=-1)
    varentropy = (p * bits * bits).sum(axis=-1) - entropy**2
    top2 = np.sort(p, axis=-1)[:, -2:]
    return {"entropy": entropy, "varentropy": np.maximum(varentropy, 0.0),
            "margin": top2[:, 1] - top2[:, 0], "nll": -logp[np.arange(len(targets)), targets]}


def bottom_hidden(ladder: Ladder, ids: list[int], start: int) -> np.ndarray | None:
    """The bottom tier's last hidden state (after the final norm) at positions start…, or None.

    mlx-lm's decoder-only models keep their transformer as `model.model`, whose output is the
    hidden state the output head reads; a model laid out otherwise gives None (no probe).
    """
    tier = ladder.tiers[0]
    inner = getattr(tier.model.model, "model", None)
    if inner is None or not callable(inner):
        return None
    tier.activate()
    try:
        hidden = inner(mx.array(ids)[None])[0, start:]
    except (TypeError, ValueError):
        return None
    return np.asarray(hidden.astype(mx.float32))


def teacher_forced(ladder: Ladder, prompt_id: str, prompt_ids: list[int], answer_ids: list[int],
                   hidden: bool = False) -> Positions:
    """Entropy (bits) and NLL (nats) of `answer_ids` under every tier, given the prompt and the answer so far."""
    ids = list(prompt_ids) + list(answer_ids)
    targets = np.asarray(answer_ids, dtype=np.int64)
    tiers = ladder.tiers
    arrays = {k: np.zeros((len(tiers), len(answer_ids))) for k in ("entropy", "varentropy", "margin", "nll")}
    if answer_ids:
        for r, tier in enumerate(tiers):
            tier.activate()
            # Position p's logits predict ids[p + 1]: the answer starts after the prompt's last id.
            logits = tier.model.model(mx.array(ids[:-1])[None])[0, len(prompt_ids) - 1:]
            for key, values in _signals_and_nll(np.asarray(logits.astype(mx.float32)), targets).items():
                arrays[key][r] = values
    states = bottom_hidden(ladder, ids[:-1], len(prompt_ids) - 1) if hidden and answer_ids else None
    return Positions(prompt_id, arrays["entropy"], arrays["nll"], arrays["varentropy"], arrays["margin"],
                     states)
