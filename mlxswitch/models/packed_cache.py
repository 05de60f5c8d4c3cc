"""Several conversations' rows through one model call: a packed pass.

Continuous batching of routed and verified answers needs a pass in which each conversation feeds
its own number of rows (one for a plain step, a draft's length plus one for a check) against its
own KV cache. mlx-lm's batch cache cannot express that without padding every conversation to the
longest, which on a compute-bound CPU costs as much as the rows it pads. So the rows are packed:
the model runs on a batch of R sequences of length one, one per row, so every linear layer does
one R-row product; each layer's cache is a `PackedLayerCache` that, as the attention asks it,
gives each row its own position (RoPE's per-sequence offset), writes each conversation's new keys
and values into that conversation's own mlx-lm cache, and hands each row its conversation's keys
and values with a mask that ends at the row's own position. The model code is mlx-lm's, unchanged:
any layout whose attention reads `cache.offset`, calls `cache.update_and_fetch` and builds its
mask through `cache.make_mask` (llama, qwen2 and most of mlx-lm's decoder-only models) packs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from .numpy_cache import NumpyKVCache


class PackedLayerCache:
    """One layer's caches in a packed pass (the part of mlx-lm's cache interface attention uses).

    `caches`: each conversation's cache of this layer, in order; `sizes`: how many of the pass's
    rows each feeds (consecutive). Row r of the pass is sequence r of the batch."""

    def __init__(
        self, caches: Sequence, sizes: Sequence[int], positions: mx.array, mask: mx.array, owner: mx.array
    ):
        self.caches, self.sizes = list(caches), list(sizes)
        self.offset = positions  # (R,): each row's position in its own conversation
        self._mask = mask
        self._owner = owner  # (R,): each row's conversation

    def keeps_numpy_copies(self) -> bool:
        """Whether every conversation's cache of this layer keeps its rows in NumPy (the CPU's
        compiled and NumPy passes read those, not MLX's arrays)."""
        return all(isinstance(c, NumpyKVCache) for c in self.caches)

    def make_mask(self, *args, **kwargs) -> mx.array:
        """The (R, 1, 1, width) mask: a row sees its conversation's positions up to its own."""
        return self._mask

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Write each conversation's new keys and values (rows of length one, (R, H, 1, D)) into
        its own cache; return, per row, its conversation's keys and values, zero-padded on the
        right to the widest (the mask hides the padding)."""
        width = self._mask.shape[-1]
        all_keys, all_values = [], []
        for cache, _, (k, v) in self.by_conversation(keys, values):
            k, v = cache.update_and_fetch(k, v)
            pad = width - k.shape[2]
            if pad:
                k = mx.pad(k, [(0, 0), (0, 0), (0, pad), (0, 0)])
                v = mx.pad(v, [(0, 0), (0, 0), (0, pad), (0, 0)])
            all_keys.append(k)
            all_values.append(v)
        return mx.concatenate(all_keys)[self._owner], mx.concatenate(all_values)[self._owner]

    def by_conversation(self, *arrays: Any) -> Iterator[tuple[Any, slice, list]]:
        """Per conversation, in order: its cache, its rows of the pass, and each of `arrays` (R ×
        heads × 1 × D, MLX's or NumPy's) as its new positions: (1, heads, n, D), in order."""
        start = 0
        for cache, n in zip(self.caches, self.sizes, strict=True):
            rows = slice(start, start + n)
            start += n
            yield cache, rows, [a[rows, :, 0, :].transpose(1, 0, 2)[None] for a in arrays]


def packed_caches(layer_caches: Sequence[Sequence], sizes: Sequence[int]) -> list[PackedLayerCache]:
    """Per layer, the packed view of several conversations' caches (`layer_caches[i]`: the i-th
    conversation's mlx-lm cache list) for a pass where conversation i feeds `sizes[i]` rows."""
    held = [int(caches[0].offset) for caches in layer_caches]
    positions = [h + j for h, n in zip(held, sizes, strict=True) for j in range(n)]
    width = max(h + n for h, n in zip(held, sizes, strict=True))
    rows = mx.array(positions)
    mask = (mx.arange(width)[None, :] <= rows[:, None])[:, None, None, :]
    owner = mx.array([i for i, n in enumerate(sizes) for _ in range(n)])  # the same for every layer
    layers = len(layer_caches[0])
    return [
        PackedLayerCache([caches[layer] for caches in layer_caches], sizes, rows, mask, owner)
        for layer in range(layers)
    ]


# mlx-lm's plain KV cache, and ours that also keeps a decoding pass's rows in NumPy.
PLAIN_CACHES = (KVCache, NumpyKVCache)


def can_pack(caches: Sequence) -> bool:
    """Whether a conversation's caches can join a packed pass: plain KV caches only (a rotating or
    recurrent cache writes its own way)."""
    return all(type(c) in PLAIN_CACHES for c in caches)
