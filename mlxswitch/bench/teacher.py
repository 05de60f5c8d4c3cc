"""Teacher forcing: every tier's entropy and NLL at every position of a fixed answer (one forward each)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import (
    can_trim_prompt_cache,
    make_prompt_cache,
    trim_prompt_cache,
)

from ..decoding.tiers import Ladder
from ..errors import UsageError
from ..kernels.signals_numpy import numpy_token_signals
from ..routing.registry import MEASURED
from .simulate import Positions


def _signals_and_nll(logits: np.ndarray, targets: np.ndarray) -> dict[str, np.ndarray]:
    # float64 over the whole vocabulary: the numbers the router reads (the engine's reduction),
    # and the nats we score: NLL = log Σ e^(x − max) − (x_target − max).
    x = logits.astype(np.float64)
    measured = numpy_token_signals(x, np.float64)
    x -= x.max(axis=-1, keepdims=True)
    nll = np.log(np.exp(x).sum(axis=-1)) - x[np.arange(len(targets)), targets]
    return {"nll": nll, **{s.name: measured[:, s.index] for s in MEASURED}}


def _split(ladder: Ladder):
    """The bottom model's checked body/head split (the probe's view), or None for other layouts."""
    try:
        return ladder.bottom_split()
    except UsageError:
        return None


def _prefilled(group, ids: list[int]) -> list:
    """A fresh cache of the group's model holding `ids`, written at the group's prefill gear."""
    model = group.model.model
    cache = make_prompt_cache(model)
    if ids:
        if group.prefill_gear is not None:
            model.gear_state.set(group.prefill_gear)
        model(mx.array(ids)[None], cache=cache)
        mx.eval([c.state for c in cache])
    return cache


def teacher_forced(
    ladder: Ladder, prompt_id: str, prompt_ids: list[int], answer_ids: list[int], hidden: bool = False
) -> Positions:
    """Entropy (bits) and NLL (nats) of `answer_ids` under every tier, given the prompt and the answer so far.

    As in the token loop, each model's prompt is prefilled once, at its cache group's prefill gear
    (a gear ladder's top gear): a cheap gear reads the prompt K/V the top gear wrote, which is what
    it reads when it decodes. Each tier then runs the answer over that prompt cache, which is
    trimmed back after it. `hidden`: the bottom tier's last hidden states too (the probe's input).
    """
    targets = np.asarray(answer_ids, dtype=np.int64)
    tiers = ladder.tiers
    arrays = {k: np.zeros((len(tiers), len(answer_ids))) for k in ("nll", *(s.name for s in MEASURED))}
    states = None
    if not answer_ids:
        return Positions(prompt_id, **arrays)
    split = _split(ladder) if hidden else None
    # Position p's logits predict ids[p + 1]: the answer starts after the prompt's last id.
    inputs = mx.array([prompt_ids[-1], *answer_ids[:-1]])[None]
    for group in ladder.groups:
        model = group.model.model
        cache = None
        for r, tier in enumerate(tiers):
            if tier.group is not group:
                continue
            if cache is None or not can_trim_prompt_cache(cache):  # a recurrent cache: prefill again
                cache = _prefilled(group, prompt_ids[:-1])
            tier.activate()
            if r == 0 and split is not None:
                states_mx = split.body(inputs, cache=cache)
                logits = split.head(states_mx)[0]
                states = np.asarray(states_mx[0].astype(mx.float32))
            else:
                logits = model(inputs, cache=cache)[0]
            for key, values in _signals_and_nll(np.asarray(logits.astype(mx.float32)), targets).items():
                arrays[key][r] = values
            trim_prompt_cache(cache, inputs.shape[1])
    return Positions(prompt_id, **arrays, hidden=states)
