"""Several conversations' KV caches kept at once, so a server that alternates between clients
does not prefill each one's history again: mlx-lm's LRUPromptCache (a token trie, least recently
used out first), holding every cache group of the ladder as one entry.

mlx-lm keys one model's cache by the tokens it holds; a ladder's groups can hold different
counts (the top model lags behind the tokens the cheap one made), so an entry is trimmed to the
tokens every group holds, and all its caches are then trimmed alike when it is reused.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from mlx_lm.models.cache import LRUPromptCache, trim_prompt_cache
from mlx_lm.utils import common_prefix_len

from ..errors import UsageError
from .tiers import CacheGroup

# A new prompt that drops fewer of the held tokens than this continues the same conversation (a
# chat template re-renders the last answer's ending): not worth a copy of every cache.
KEEP_MIN_DROPPED = 32
_KEY = "ladder"  # one ladder per session: the trie needs a model key, and there is only one


class PromptCaches:
    """Up to `size` conversations' caches besides the one in use (0: none kept)."""

    def __init__(self, size: int):
        if size < 0:
            raise UsageError(f"--prompt-cache-size must be ≥ 0 (got {size})")
        self.size = size
        self._lru = LRUPromptCache(max_size=max(size, 1))  # never filled when size is 0

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def nbytes(self) -> int:
        """Bytes the kept caches hold."""
        return self._lru.nbytes

    def switch(self, groups: Sequence[CacheGroup], held_ids: list[int], prompt_ids: list[int]) -> int | None:
        """Before answering `prompt_ids` with the caches holding `held_ids`: keep a copy of the
        conversation the prompt leaves, then load the kept one it continues best, if that shares
        more with it than what is held. How many of the prompt's ids the caches then hold, or
        None when they still hold the same conversation."""
        held = min([len(held_ids)] + [g.seen for g in groups])
        shared = common_prefix_len(held_ids[:held], prompt_ids)
        if self.size == 0 or not all(g.trimmable for g in groups):
            return None
        if held - shared >= KEEP_MIN_DROPPED:
            self._keep(groups, held_ids[:held])
        cache, rest = self._lru.fetch_nearest_cache(_KEY, prompt_ids)
        reused = len(prompt_ids) - len(rest)
        if cache is None or reused <= shared:
            return None
        for group in groups:  # the entry is every group's caches, in the ladder's order
            group.restore(cache[: len(group.cache)], reused)
            cache = cache[len(group.cache) :]
        return reused

    def _keep(self, groups: Sequence[CacheGroup], ids: list[int]) -> None:
        caches = []
        for group in groups:
            mine = copy.deepcopy(group.cache)
            trim_prompt_cache(mine, group.seen - len(ids))  # to the tokens every group holds
            caches += mine
        self._lru.insert_cache(_KEY, list(ids), caches)  # evicts the least recently used past `size`
