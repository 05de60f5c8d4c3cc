"""Teacher forcing: every tier's entropy and NLL at every position of a fixed answer (one forward each)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..decoding.tiers import Ladder
from .simulate import Positions


def _entropy_and_nll(logits: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # float64 log-softmax over the whole vocabulary: the bits the router reads, the nats we score.
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    log_z = np.log(np.exp(x).sum(axis=-1, keepdims=True))
    logp = x - log_z
    p = np.exp(logp)
    entropy = -(p * logp).sum(axis=-1) / np.log(2.0)
    nll = -logp[np.arange(len(targets)), targets]
    return entropy, nll


def teacher_forced(ladder: Ladder, prompt_id: str, prompt_ids: list[int], answer_ids: list[int]) -> Positions:
    """Entropy (bits) and NLL (nats) of `answer_ids` under every tier, given the prompt and the answer so far."""
    ids = list(prompt_ids) + list(answer_ids)
    targets = np.asarray(answer_ids, dtype=np.int64)
    tiers = ladder.tiers
    entropy = np.zeros((len(tiers), len(answer_ids)))
    nll = np.zeros((len(tiers), len(answer_ids)))
    if not answer_ids:
        return Positions(prompt_id, entropy, nll)
    for r, tier in enumerate(tiers):
        tier.activate()
        # Position p's logits predict ids[p + 1]: the answer starts after the prompt's last id.
        logits = tier.model.model(mx.array(ids[:-1])[None])[0, len(prompt_ids) - 1:]
        entropy[r], nll[r] = _entropy_and_nll(np.asarray(logits.astype(mx.float32)), targets)
    return Positions(prompt_id, entropy, nll)
