"""Where the bottom tier's greedy token differs from the top tier's, along the top tier's answer."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from ...decoding.tiers import Ladder


def disagreements(ladder: Ladder, prompt_ids: list[int], answer_ids: list[int], ended: bool) -> list[int]:
    """Positions t where the bottom tier, given the prompt and answer[:t], would not say answer[t].

    `ended`: the top tier ended its answer there (an end-of-sequence token, not kept in
    answer_ids); the bottom tier agrees at that last position if it would end the answer too.
    """
    if not answer_ids and not ended:
        return []
    tier = ladder.tiers[0]
    group = tier.group
    model = group.model.model
    cache = make_prompt_cache(model)
    # As the engine does: the prompt is prefilled at the group's prefill gear (a gear ladder's top).
    if len(prompt_ids) > 1:
        if group.prefill_gear is not None:
            model.gear_state.set(group.prefill_gear)
        model(mx.array(prompt_ids[:-1])[None], cache=cache)
    tier.activate()
    fed = answer_ids if ended else answer_ids[:-1]
    logits = model(mx.array([prompt_ids[-1], *fed])[None], cache=cache)[0]
    greedy: list[int] = mx.argmax(logits, axis=-1).tolist()  # type: ignore[assignment]  # mlx: any nesting
    out = [t for t, (mine, theirs) in enumerate(zip(greedy, answer_ids, strict=False)) if mine != theirs]
    if ended and greedy[-1] not in ladder.tokenizer.eos_token_ids:
        out.append(len(answer_ids))
    return out
