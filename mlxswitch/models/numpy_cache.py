"""mlx-lm's plain KV cache with a NumPy copy that a decoding pass writes and reads (cpu_blocks).

Why our own: a decoding pass's block runs in NumPy, and writing its keys and values through
mlx-lm's cache meant two conversions, a slice update and an MLX evaluation a layer (~0.1 ms each:
~3 ms of a Qwen 1.5B step). Here a decoding pass writes the NumPy copy only, and the MLX arrays
are brought up to date when anything else reads them (a prefill, a packed pass, the prompt
cache): every mlx-lm reader sees the same cache as before. mlx-lm's KVCache is subclassed, not
rewritten: its growth, trimming and state are its own.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

# Positions a NumPy copy grows by (mlx-lm's KVCache.step).
GROWTH = KVCache.step
# "The MLX arrays hold every position": larger than any offset.
EVERY_POSITION = 1 << 62


class NumpyKVCache(KVCache):
    """A KVCache whose positions [0, mirrored) are also held in NumPy (fp32, B × heads × T × D)
    and whose positions [pending, offset) are held only there (pending: EVERY_POSITION where MLX's
    arrays are up to date). Every position below the offset is in one or both: MLX's below
    `pending`, NumPy's below `mirrored`."""

    def __init__(self) -> None:
        self._keys: mx.array | None = None
        self._values: mx.array | None = None
        self._numpy: tuple[np.ndarray, np.ndarray] | None = None
        self._offset = 0
        self.pending = EVERY_POSITION
        self.mirrored = 0
        super().__init__()

    # mlx-lm's code reads and assigns these attributes: each read brings MLX up to date first.
    @property
    def keys(self) -> mx.array | None:
        self._write_pending()
        return self._keys

    @keys.setter
    def keys(self, value: mx.array | None) -> None:
        self._keys, self.mirrored, self.pending = value, 0, EVERY_POSITION

    @property
    def values(self) -> mx.array | None:
        self._write_pending()
        return self._values

    @values.setter
    def values(self, value: mx.array | None) -> None:
        self._values, self.mirrored, self.pending = value, 0, EVERY_POSITION

    @property
    def offset(self) -> int:
        return self._offset

    @offset.setter
    def offset(self, value: int) -> None:
        # a trim or a new state: positions from here on are written again before they are read
        self._offset = value
        self.mirrored = min(self.mirrored, value)
        if self.pending >= value:  # MLX's arrays hold every position below it
            self.pending = EVERY_POSITION

    @property
    def nbytes(self) -> int:
        """Bytes held: MLX's arrays (mlx-lm's count) and the NumPy copy (a kept conversation's
        caches count both against --prompt-cache-bytes)."""
        copy = 0 if self._numpy is None else sum(a.nbytes for a in self._numpy)
        return super().nbytes + copy

    def lazy_arrays(self) -> list[mx.array]:
        """What evaluating this cache's writes takes: MLX's arrays where MLX wrote the last
        positions (a lazy update), none where NumPy holds them (reading `state` would copy them
        into MLX's arrays too: a second copy of a prompt's keys and values that nothing reads)."""
        if self.pending < self._offset:
            return []
        return [a for a in (self._keys, self._values) if a is not None]

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """mlx-lm's: MLX writes these positions, so NumPy no longer holds them."""
        self.mirrored = min(self.mirrored, self._offset)
        return super().update_and_fetch(keys, values)

    def append_rows(self, keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Write a decoding pass's keys and values (fp32, B × heads × L × D) after the offset, in
        NumPy only; every position's keys and values as NumPy views (B × heads × offset × D)."""
        held_keys, held_values, start = self.reserve_rows(keys.shape, values.shape)
        end = start + keys.shape[2]
        held_keys[:, :, start:end] = keys
        held_values[:, :, start:end] = values
        self.commit_rows(end)
        return held_keys[:, :, :end], held_values[:, :, :end]

    def reserve_rows(
        self, keys_shape: tuple[int, ...], values_shape: tuple[int, ...]
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """Room for a decoding pass's keys and values (shapes B × heads × L × D) after the offset,
        the positions before it held in NumPy: the whole NumPy copy (keys, values) and where the
        pass's positions start. commit_rows(end) once they are written."""
        start = self._offset
        self._mirror_upto(start)
        held_keys, held_values = self._room(start + keys_shape[2], keys_shape, values_shape)
        return held_keys, held_values, start

    def commit_rows(self, end: int) -> None:
        """The positions from the offset up to `end` are written in the NumPy copy (reserve_rows)."""
        self._offset, self.pending, self.mirrored = end, min(self.pending, self._offset), end

    def _room(
        self, end: int, keys_shape: tuple[int, ...], values_shape: tuple[int, ...]
    ) -> tuple[np.ndarray, np.ndarray]:
        """The NumPy copy, grown (a whole GROWTH of positions at a time) to hold `end` positions."""
        held = self._numpy
        if held is not None and held[0].shape[2] >= end:
            return held
        size = -(-end // GROWTH) * GROWTH
        grown = tuple(
            np.zeros((*shape[:2], size, shape[3]), dtype=np.float32) for shape in (keys_shape, values_shape)
        )
        if held is not None:
            for old, new in zip(held, grown, strict=True):
                new[:, :, : self.mirrored] = old[:, :, : self.mirrored]
        self._numpy = (grown[0], grown[1])
        return self._numpy

    def _mirror_upto(self, end: int) -> None:
        """Copy MLX's positions [mirrored, end) into NumPy (after a prefill or a new state)."""
        if self.mirrored >= end:
            return
        assert self._keys is not None and self._values is not None, "positions below the offset are held"
        start = self.mirrored
        parts = [a[:, :, start:end].astype(mx.float32) for a in (self._keys, self._values)]
        mx.eval(*parts)
        keys, values = (np.asarray(a) for a in parts)
        held_keys, held_values = self._room(end, keys.shape, values.shape)
        held_keys[:, :, start:end] = keys
        held_values[:, :, start:end] = values
        self.mirrored = end

    def _write_pending(self) -> None:
        """Bring MLX's arrays up to date with the positions only NumPy holds."""
        start, end = self.pending, self._offset
        if start >= end:
            return
        assert self._numpy is not None, "pending positions are NumPy's"
        keys, values = (mx.array(a[:, :, start:end]) for a in self._numpy)
        mirrored = self.mirrored
        self.pending, self._offset = EVERY_POSITION, start  # mlx-lm's update reads keys and values
        KVCache.update_and_fetch(self, keys, values)  # grows MLX's arrays as mlx-lm does
        self.pending, self.mirrored = EVERY_POSITION, mirrored  # its growth assigned keys: NumPy's hold


def arrays_to_evaluate(cache) -> list[mx.array]:
    """A cache's arrays to evaluate after a prefill chunk: its state (mlx-lm's habit), but for a
    NumpyKVCache only what MLX wrote (its lazy_arrays: reading its state would copy the NumPy-held
    positions into MLX's arrays)."""
    return cache.lazy_arrays() if isinstance(cache, NumpyKVCache) else cache.state
