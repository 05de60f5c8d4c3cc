"""Prompt-lookup drafting: the tokens that followed an earlier occurrence of the sequence's tail.

Pure Python. Code answers echo what they just read (a signature, a docstring, a name), so the
ids that followed the answer's last n ids earlier in the prompt or the answer are a draft that
costs no model step; verify.py has the top tier check it like any other.

A tail of at least MIN_NGRAM ids must match, the longest (up to NGRAM) preferred: two or three
ids recur by chance in prose ("of the"), and what followed them then is a draft the check
throws away. Replayed on the recorded answers (bench/replay_drafting.py, the Qwen pair on this
CPU; bench/results/draft-replay-pair.txt), lookup rounds made 0.65× the 1.5B's one-row rate on
the everyday prompts with 2-id matches and 1.51× with 4-id ones; on HumanEval 2.07× and 3.68×.

Where a match was found matters as much: a draft that starts a copy from the answer itself is
kept far less often than one from the prompt (`found_at` says which; the planner weighs it).
Over the traced answers, a new copy's first token was kept 0.63 of the time from the answer
against 0.78 from the prompt on everyday requests, and 0.36 against 0.96 on HumanEval.
"""

from __future__ import annotations

NGRAM, MIN_NGRAM = 8, 4  # the longest tail looked up, and the shortest that counts as a match


def lookup_draft(
    ids: list[int], start: int, max_tokens: int, ngram: int = NGRAM, min_ngram: int = MIN_NGRAM
) -> list[int]:
    """Prompt-lookup drafting: the tokens that followed the latest earlier occurrence of the
    sequence's last n ids (n from `ngram` down to `min_ngram`), up to `max_tokens`; [] without one.

    `start` is where the search may begin (0: the prompt and the answer so far)."""
    if max_tokens < 1:
        return []
    end = len(ids)
    for n in range(ngram, min_ngram - 1, -1):
        if end - n <= start:
            continue
        tail = ids[end - n :]
        # The latest earlier match: code answers echo what they just read.
        for at in range(end - n - 1, start - 1, -1):
            if ids[at : at + n] == tail:
                follow = ids[at + n : min(at + n + max_tokens, end)]
                if follow:
                    return list(follow)
    return []


class LookupIndex:
    """lookup_draft for a sequence that only grows, without rescanning it: each n-gram's latest
    start is indexed once, so a round costs the new ids, not the whole prompt and answer."""

    def __init__(self, ngram: int = NGRAM, min_ngram: int = MIN_NGRAM):
        self.ngram, self.min_ngram = ngram, min_ngram
        self._latest: dict[tuple[int, ...], int] = {}
        self._next = dict.fromkeys(range(min_ngram, ngram + 1), 0)  # per n: the next start to index
        self.found_at = -1  # where the last draft's first id stands in `ids` (-1: no draft)

    def draft(self, ids: list[int], max_tokens: int) -> list[int]:
        """What lookup_draft(ids, 0, max_tokens) returns; `ids` must extend the last call's."""
        self.found_at = -1
        if max_tokens < 1:
            return []
        end = len(ids)
        # Index every n-gram that ends before the last id (the tail is what is looked up), in
        # order of its start, so each keeps its latest earlier occurrence.
        for n, first in self._next.items():
            for at in range(first, end - n):
                self._latest[tuple(ids[at : at + n])] = at
            self._next[n] = max(first, end - n)
        for n in range(self.ngram, self.min_ngram - 1, -1):
            if end - n <= 0:
                continue
            found = self._latest.get(tuple(ids[end - n :]))
            if found is not None and found <= end - n - 1:
                follow = ids[found + n : min(found + n + max_tokens, end)]
                if follow:
                    self.found_at = found + n
                    return list(follow)
        return []
