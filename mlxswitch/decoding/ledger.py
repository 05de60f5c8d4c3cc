"""Where an answer's seconds went: each model pass timed to the moment its result was read.

At each sync point the loops take the wall time since the previous one (`lap()`) and book it to
the pass just read (`add(model, rows, seconds, prefill)`), so the passes and what ran between
them (sampling, Python) add up to the answer's time; the summary's "rest" is what no pass
claimed. Rows are bucketed the way their cost differs on a CPU (one row: a mat-vec; a few: one
mat-vec each; more: one matrix product).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

ROW_BUCKETS = ((1, 1), (2, 3), (4, 8), (9, 16), (17, 32), (33, None))


def row_bucket(rows: int) -> str:
    """The bucket a pass of `rows` rows is reported in ("1", "2-3", …, "33+")."""
    for lo, hi in ROW_BUCKETS:
        if hi is None:
            return f"{lo}+"
        if rows <= hi:
            return str(lo) if lo == hi else f"{lo}-{hi}"
    raise AssertionError("unreachable")


@dataclass
class PassLedger:
    """Seconds, passes and rows per (model, kind, row bucket) for one answer."""

    entries: dict[str, list[float]] = field(default_factory=dict)  # key → [passes, rows, seconds]
    _mark: float = field(default_factory=time.perf_counter)

    def restart(self) -> None:
        """Time the next pass from now (what happened before it is not a pass)."""
        self._mark = time.perf_counter()

    def lap(self) -> float:
        """Seconds since the previous mark; moves the mark to now."""
        now = time.perf_counter()
        seconds, self._mark = now - self._mark, now
        return seconds

    def add(self, model: str, rows: int, seconds: float, prefill: bool = False) -> None:
        """Count one pass of `model` over `rows` rows that took `seconds` (a prompt's: prefill)."""
        key = f"{model} prefill" if prefill else f"{model} {row_bucket(rows)}"
        entry = self.entries.setdefault(key, [0, 0, 0.0])
        entry[0] += 1
        entry[1] += rows
        entry[2] += seconds

    @property
    def seconds(self) -> float:
        """Seconds claimed by passes."""
        return sum(e[2] for e in self.entries.values())

    def record(self, elapsed_s: float) -> dict:
        """The JSON record: each entry's passes, rows and seconds, and the rest of `elapsed_s`."""
        out: dict[str, dict | float] = {
            key: {"passes": int(e[0]), "rows": int(e[1]), "seconds": round(e[2], 4)}
            for key, e in sorted(self.entries.items())
        }
        out["rest_s"] = round(max(0.0, elapsed_s - self.seconds), 4)
        return out
