"""Several conversations' KV caches kept at once, so a server that alternates between clients
does not prefill each one's history again: every cache group of the ladder kept as one entry,
bounded by a count and by the bytes their K/V arrays hold, least recently used out first.

A ladder's groups can hold different counts (the top model lags behind the tokens the cheap one
made), so an entry is trimmed to the tokens every group holds, and all its caches are then
trimmed alike when it is reused. An entry a conversation continues is taken out, not copied: it
is the conversation in use then, and it is kept again (as the most recently used) when it is left.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache
from mlx_lm.utils import common_prefix_len

from ..errors import UsageError
from .tiers import CacheGroup

# A new prompt that drops fewer of the held tokens than this continues the same conversation (a
# chat template re-renders the last answer's ending): not worth a copy of every cache.
KEEP_MIN_DROPPED = 32
DEFAULT_SIZE = 4
DEFAULT_MAX_BYTES = 4 << 30  # 4 GiB of kept K/V


def check_bounds(size: int, max_bytes: int) -> None:
    """Refuse a negative count or byte bound (a UsageError naming serve's options)."""
    if size < 0:
        raise UsageError(f"--prompt-cache-size must be ≥ 0 (got {size})")
    if max_bytes < 0:
        raise UsageError(f"--prompt-cache-bytes must be ≥ 0 (got {max_bytes})")


def cache_nbytes(caches: Sequence) -> int:
    """Bytes the arrays of mlx-lm cache objects hold (their `nbytes`, else their state's)."""
    total = 0
    for cache in caches:
        try:
            total += int(cache.nbytes)
        except (AttributeError, NotImplementedError):
            state = cache.state
            total += sum(int(a.nbytes) for a in (state if isinstance(state, list | tuple) else [state]))
    return total


@dataclass
class _Entry:
    caches: list  # every group's caches, in the ladder's order
    nbytes: int


class PromptCaches:
    """Up to `size` conversations' caches besides the one in use, holding at most `max_bytes`
    (0 for either: none kept); the least recently used is evicted first."""

    def __init__(self, size: int = DEFAULT_SIZE, max_bytes: int = DEFAULT_MAX_BYTES):
        check_bounds(size, max_bytes)
        self.size = size
        self.max_bytes = max_bytes
        # Keyed by (tier, ids): "" for a ladder's caches kept together (switch), else the tier whose
        # cache alone is kept (take/keep: the batched server's answers). Least recent first.
        self._entries: OrderedDict[tuple[str, tuple[int, ...]], _Entry] = OrderedDict()
        self._nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes the kept caches hold."""
        return self._nbytes

    @property
    def kept(self) -> list[tuple[int, ...]]:
        """The kept conversations' token ids, least recently used first."""
        return [ids for _, ids in self._entries]

    def switch(self, groups: Sequence[CacheGroup], held_ids: list[int], prompt_ids: list[int]) -> int | None:
        """Before answering `prompt_ids` with the caches holding `held_ids`: keep a copy of the
        conversation the prompt leaves, then load the kept one it continues best, if that shares
        more with it than what is held. How many of the prompt's ids the caches then hold, or
        None when they still hold the same conversation."""
        held = min([len(held_ids)] + [g.seen for g in groups])
        shared = common_prefix_len(held_ids[:held], prompt_ids)
        if self.size == 0 or self.max_bytes == 0 or not all(g.trimmable for g in groups):
            return None
        best, reused = None, shared
        for tier, ids in reversed(self._entries):  # the most recent wins a tie
            common = common_prefix_len(list(ids), prompt_ids)
            if tier == "" and common > reused:
                best, reused = ids, common
        taken = self._pop(("", best)) if best is not None else None
        if held - shared >= KEEP_MIN_DROPPED:
            self._keep(groups, held_ids[:held])
        if taken is None:
            return None
        caches = taken.caches
        for group in groups:  # the entry is every group's caches, in the ladder's order
            mine, caches = caches[: len(group.cache)], caches[len(group.cache) :]
            trim_prompt_cache(mine, len(best or ()) - reused)
            group.restore(mine, reused)
        return reused

    def take(self, prompt_ids: list[int], tier: str = "model") -> tuple[list, int] | None:
        """For the batched server's answers, one tier's cache at a time (`tier`: its name): caches
        holding the longest prefix of `prompt_ids` that a kept conversation of that tier shares
        (all but the prompt's last id at most: it must be fed), with its length; None when none
        shares an id. A conversation the prompt continues whole is handed over; one it shares
        only a beginning with (a system prompt, say) is copied and stays kept, so concurrent
        requests all reuse that beginning."""
        best, reused = None, 0
        for kept_tier, ids in reversed(self._entries):  # the most recent wins a tie
            common = min(common_prefix_len(list(ids), prompt_ids), len(prompt_ids) - 1)
            if kept_tier == tier and common > reused:
                best, reused = ids, common
        if best is None:
            return None
        key = (tier, best)
        if reused == len(best):
            caches = self._pop(key).caches
        else:
            self._entries.move_to_end(key)
            caches = copy.deepcopy(self._entries[key].caches)
            trim_prompt_cache(caches, len(best) - reused)
        return caches, reused

    def keep(self, ids: list[int], caches: list, tier: str = "model") -> None:
        """For the batched server's answers: keep one tier's `caches` (handed over, not copied),
        holding `ids`. Each tier's cache is an entry of its own."""
        if ids and self.size and self.max_bytes and can_trim_prompt_cache(caches):
            self._store((tier, tuple(ids)), caches)

    def _pop(self, key: tuple[str, tuple[int, ...]]) -> _Entry:
        entry = self._entries.pop(key)
        self._nbytes -= entry.nbytes
        return entry

    def _keep(self, groups: Sequence[CacheGroup], ids: list[int]) -> None:
        # The copy would hold what the live caches' arrays hold: too large alone, it is not made.
        if sum(cache_nbytes(g.cache) for g in groups) > self.max_bytes:
            return
        caches = []
        for group in groups:
            mine = copy.deepcopy(group.cache)
            trim_prompt_cache(mine, group.seen - len(ids))  # to the tokens every group holds
            caches += mine
        self._store(("", tuple(ids)), caches)

    def _store(self, key: tuple[str, tuple[int, ...]], caches: list) -> None:
        # A kept prefix of this conversation (or the same one) of the same tier is redundant:
        # this one trims to it.
        tier, ids = key
        for old in [k for k in self._entries if k[0] == tier and ids[: len(k[1])] == k[1]]:
            self._pop(old)
        entry = _Entry(caches, cache_nbytes(caches))
        self._entries[key] = entry
        self._nbytes += entry.nbytes
        # `size` conversations per tier (a pair's conversation is an entry per tier it ran on).
        while sum(k[0] == tier for k in self._entries) > self.size:
            self._pop(next(k for k in self._entries if k[0] == tier))  # its least recently used
        while self._nbytes > self.max_bytes:
            self._pop(next(iter(self._entries)))  # the least recently used
