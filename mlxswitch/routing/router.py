"""Entropy router (pure Python): picks the tier of the next token from recent entropies.

Contract (the telemetry re-derives from it; `replay` and `derive_tiers` run it on a record):
- State: rung r (0 = bottom, top = num_tiers - 1), a window W of the last `window` entropies,
  a count c of tokens emitted since the last move, and a streak s of near-maximal entropies in
  a row. Boundary i (between rungs i and i+1) has an up threshold up[i] and a down threshold
  down[i] <= up[i] (the hysteresis band).
- Default down: without explicit down thresholds, down[i] = min(up[i], 0.6 * up[i]): 60% of a
  positive up (what every bundled profile uses), up itself when up is <= 0 or infinite.
- Units: entropies are in bits. With normalize, H / log2(V) is compared and kept in W instead
  (the thresholds are then fractions of the maximum). mean(W) is NaN while W is empty, and no
  comparison with NaN holds, so an empty window never moves the router.
- Start (H0: the bottom tier's entropy at the end of the prompt): r = 0, W = [H0], c = 0, s = 0;
  while r < top and mean(W) > up[r]: r += 1. Only here can several rungs be climbed at once.
- After each emitted token with entropy H: append H to W (keep the last `window`), c += 1;
  if c >= min_run: if r < top and mean(W) > up[r]: r += 1, c = 0;
  else if r > 0 and mean(W) < down[r-1]: r -= 1, c = 0.
  One rung per decision; the new r applies to the next token.
- Catastrophic guard: a non-finite H (NaN, inf), or H > guard_fraction * log2(V) for
  guard_count tokens in a row (s >= guard_count), while r < top_local: r = top_local at once
  (ignoring min_run), c = 0; the decision is marked guard and so is the token it produces.
  Without vocab_size only a non-finite H fires it. A non-finite H0 fires it at start too.
  H0 never starts a streak: at rung 0 the first token is sampled from that same distribution,
  and counting it twice would let one near-maximal distribution fire the guard.
- A non-finite H never enters W (it would poison the mean for `window` tokens and the guard has
  already acted on it), but it counts toward c and extends the streak.
- No entropy (None, e.g. a cloud tier's token): c += 1 and the rules run, but W is unchanged and
  the streak is broken. A rung that reports no entropy therefore does not move down by itself
  (W was high enough to climb there); the engine feeds real entropies or ends the span.
  start(None) leaves W empty and r = 0.
- top_local (default: top) is the highest local rung; rungs above it (a cloud tier) are reached
  through the up thresholds only, never by the guard, and the guard never moves down.
- A cloud span: when the decision names a rung above top_local, the engine asks the cloud for a
  short continuation. Its tokens carry no entropy and are not observed; when the span ends the
  engine calls resume(top_local): r = top_local, c = 0, s = 0, W unchanged. So the next climb
  to the cloud needs min_run local tokens whose mean still exceeds up[top_local].
- Defaults: window 5, min_run 10 (as in the Entropy Adaptive Decoding paper).
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..errors import SettingError, UsageError
from .registry import DEFAULT_MIN_RUN, DEFAULT_WINDOW, POLICIES, POLICY_BY_NAME, SIGNAL_BY_NAME, SIGNALS

# Matches the bundled profiles (down = 0.6 x up): a tier keeps the lead for a while after taking it.
DEFAULT_DOWN_RATIO = 0.6
# Which tier makes a token (`ead`, `peek`: policies.py) and what it reads (entropy, varentropy,
# margin, probe): each described once in registry.py. Thresholds are in the signal's units.
POLICY_NAMES = tuple(p.name for p in POLICIES)
SIGNAL_NAMES = tuple(s.name for s in SIGNALS)
# Signals measured on the bottom rung only (the probe reads the cheap tier's hidden state): only a
# policy that computes every position on the bottom rung first can route on them.
BOTTOM_ONLY_SIGNALS = tuple(s.name for s in SIGNALS if s.bottom_only)


def max_entropy_bits(vocab_size: int) -> float:
    """Entropy of the uniform distribution over the vocabulary: log2 V (the normalisation unit)."""
    return math.log2(vocab_size)


# RouterConfig's fields that models.toml and the flags of `chat` and `serve` set by these names
# (the thresholds come as `up`/`down` and `--tau`/`--tau-down`; the decoding mode's beside them are
# decoding/mode.py's MODE_SETTINGS).
SETTINGS_BY_NAME = ("window", "min_run", "normalize", "policy", "signal")


@dataclass(frozen=True)
class RouterConfig:
    """Thresholds, timing, normalisation and guard settings of the router, checked when built.

    Every source (flags, models.toml, /tau, the library) builds one of these, so the rules and
    their messages live here once: the constructor refuses anything the router cannot honour.
    `validate(num_tiers)` then checks the config against a ladder's shape.
    """

    up: tuple[float, ...]
    down: tuple[float, ...] | None = None
    window: int = DEFAULT_WINDOW
    min_run: int = DEFAULT_MIN_RUN
    normalize: bool = False
    vocab_size: int | None = None
    guard_fraction: float = 0.9
    guard_count: int = 2
    top_local: int | None = None
    policy: str = "ead"
    signal: str = "entropy"

    def __post_init__(self) -> None:
        if self.policy not in POLICY_NAMES:
            raise SettingError(
                "policy", f"the policy must be one of {', '.join(POLICY_NAMES)} (got {self.policy!r})"
            )
        if self.signal not in SIGNAL_NAMES:
            raise SettingError(
                "signal", f"the signal must be one of {', '.join(SIGNAL_NAMES)} (got {self.signal!r})"
            )
        spec = SIGNAL_BY_NAME[self.signal]
        if self.normalize and not spec.normalisable:
            raise SettingError(
                "normalize", f"normalize divides entropy by log2(V); it does not apply to {self.signal}"
            )
        if spec.bottom_only and not POLICY_BY_NAME[self.policy].reads_bottom_only:
            reader = next(p.name for p in POLICIES if p.reads_bottom_only)
            raise SettingError(
                "signal",
                f"the {self.signal} reads the cheap tier's state at the position "
                f"it scores, so it needs the {reader} policy (--policy {reader})",
            )
        object.__setattr__(self, "up", tuple(float(u) for u in self.up))
        if self.down is not None:
            object.__setattr__(self, "down", tuple(float(d) for d in self.down))
        downs = self.downs()
        if len(downs) != len(self.up):
            raise SettingError(
                "down", f"{len(self.up) + 1} tiers need {len(self.up)} down threshold(s), got {len(downs)}"
            )
        if any(math.isnan(t) for t in (*self.up, *downs)):
            raise SettingError("up", "thresholds cannot be NaN")
        for i, (u, d) in enumerate(zip(self.up, downs, strict=True)):
            if d > u:
                raise SettingError(
                    "down", f"down threshold {d:g} exceeds up threshold {u:g} at boundary {i + 1}"
                )
        if self.normalize or spec.probability:
            # Normalised entropies and probabilities lie in [0, 1]: a finite threshold outside them is
            # never crossed.
            outside = [t for t in (*self.up, *downs) if math.isfinite(t) and not 0 <= t <= 1]
            if outside:
                what = (
                    "with normalize, thresholds are fractions of log2(V)"
                    if self.normalize
                    else f"the {self.signal}'s thresholds are probabilities"
                )
                raise SettingError(
                    "down" if set(outside) <= set(downs) - set(self.up) else "up",
                    f"{what}, between 0 and 1; got {', '.join(f'{t:g}' for t in outside)}",
                )
        if self.window < 1:
            raise SettingError("window", f"the window must be at least 1 token (got {self.window})")
        if self.min_run < 1:
            raise SettingError("min_run", f"the min run must be at least 1 token (got {self.min_run})")
        if self.vocab_size is not None and self.vocab_size < 2:
            raise UsageError(f"the vocabulary size must be at least 2 (got {self.vocab_size})")
        if not 0 < self.guard_fraction <= 1:
            raise UsageError(f"the guard fraction must be in (0, 1] (got {self.guard_fraction:g})")
        if self.guard_count < 1:
            raise UsageError(f"the guard count must be at least 1 token (got {self.guard_count})")

    def downs(self) -> tuple[float, ...]:
        """Down thresholds: the explicit ones, else min(up, 0.6 x up) per boundary."""
        if self.down is not None:
            return tuple(self.down)
        return tuple(min(u, DEFAULT_DOWN_RATIO * u) for u in self.up)

    def validate(self, num_tiers: int) -> None:
        """Refuse a config that does not fit a ladder of `num_tiers`, with a one-line message."""
        if num_tiers < 1:
            raise UsageError("the ladder has no tiers")
        if num_tiers == 1 and self.up:
            raise SettingError("up", "this ladder has a single tier: there are no thresholds to set")
        if len(self.up) != num_tiers - 1:
            raise SettingError(
                "up", f"{num_tiers} tiers need {num_tiers - 1} up threshold(s), got {len(self.up)}"
            )
        if self.top_local is not None and not 0 <= self.top_local < num_tiers:
            raise UsageError(
                f"the top local tier must be between 0 and {num_tiers - 1} (got {self.top_local})"
            )

    def pins_top(self) -> bool:
        """Whether every token is the top local tier's whatever it measures: each up threshold is
        −inf (a forced arm, "the large model alone") and no cloud rung sits above."""
        return bool(self.up) and self.top_local is None and all(u == -math.inf for u in self.up)

    def with_vocab(self, vocab_size: int) -> RouterConfig:
        """The same settings for a ladder whose distributions have `vocab_size` entries."""
        return dataclasses.replace(self, vocab_size=vocab_size)

    def units(self, entropy: float) -> float:
        """An entropy in bits as the thresholds compare it (a fraction of log2 V when normalized)."""
        if not self.normalize:
            return entropy
        if self.vocab_size is None:
            raise UsageError("normalised thresholds need the vocabulary size")
        return entropy / max_entropy_bits(self.vocab_size)

    def settings(self, number: Callable[[float], object] = float) -> dict:
        """The settings a record or a profile rebuilds this config from; thresholds through `number`."""
        return {
            "policy": self.policy,
            "signal": self.signal,
            "up": [number(u) for u in self.up],
            "down": [number(d) for d in self.downs()],
            "window": self.window,
            "min_run": self.min_run,
            "normalize": self.normalize,
        }

    def with_thresholds(self, up: tuple[float, ...], down: tuple[float, ...] | None = None) -> RouterConfig:
        """The same settings with new thresholds (checked like any other config)."""
        return dataclasses.replace(self, up=up, down=down)


@dataclass(frozen=True)
class Decision:
    """The router's choice after an observation: the tier of the next token and why."""

    rung: int  # tier of the NEXT token
    moved: int  # -1, 0, +1; rungs climbed at start; the jump size for a guard jump
    guard: bool  # the move was the catastrophic guard
    mean: float  # rolling mean after this observation, in the compared units (NaN: empty window)


class Router:
    """Stateful router for one answer; start() it with the prompt's entropy, then observe() each token."""

    def __init__(self, config: RouterConfig, num_tiers: int):
        config.validate(num_tiers)
        if config.normalize and config.vocab_size is None:
            raise UsageError("normalised thresholds need the vocabulary size")
        self.config = config
        self.num_tiers = num_tiers
        self.top = num_tiers - 1
        self.top_local = self.top if config.top_local is None else config.top_local
        self._up = tuple(config.up)
        self._down = config.downs()
        self._log2v = max_entropy_bits(config.vocab_size) if config.vocab_size else None
        # Compared in bits, so normalisation does not change which tokens are near-maximal.
        # Near-maximal is a statement about entropy: with another signal only non-finite values fire.
        if self._log2v is not None and SIGNAL_BY_NAME[config.signal].normalisable:
            self._hot_bits = config.guard_fraction * self._log2v
        else:
            self._hot_bits = math.inf
        self._rung, self._count, self._streak = 0, 0, 0
        self._window: deque[float] = deque(maxlen=config.window)

    @property
    def rung(self) -> int:
        """The tier of the next token."""
        return self._rung

    @property
    def count(self) -> int:
        """Tokens emitted since the last move (c)."""
        return self._count

    @property
    def mean(self) -> float:
        """Rolling mean of the window in the compared units (NaN when empty)."""
        # fsum: a correctly rounded sum, so a replay in any language gets the same mean.
        return math.fsum(self._window) / len(self._window) if self._window else math.nan

    def start(self, initial_entropy: float | None) -> Decision:
        """Seed W with the prompt's entropy H0, climb while mean(W) > up[r]; the tier of token 0."""
        self._rung, self._count, self._streak = 0, 0, 0
        self._window.clear()
        if initial_entropy is not None and not math.isfinite(initial_entropy):
            return self._guard_jump()
        if initial_entropy is not None:
            self._window.append(self.config.units(initial_entropy))
        while self._rung < self.top and self.mean > self._up[self._rung]:
            self._rung += 1
        return Decision(self._rung, self._rung, False, self.mean)

    def resume(self, rung: int) -> Decision:
        """A cloud span ended: go on at `rung` (one below the cloud) with a fresh count, W kept."""
        self._rung, self._count, self._streak = rung, 0, 0
        return Decision(rung, 0, False, self.mean)

    def observe(self, entropy: float | None) -> Decision:
        """Record the entropy of the token just emitted (None: none known); the tier of the next token."""
        self._count += 1
        broken = entropy is not None and not math.isfinite(entropy)
        if entropy is None:
            self._streak = 0
        elif broken:
            self._streak += 1
        else:
            self._streak = self._streak + 1 if entropy > self._hot_bits else 0
            self._window.append(self.config.units(entropy))
        if broken or self._streak >= self.config.guard_count:
            decision = self._guard_jump()
            if decision.guard:
                return decision
        moved = 0
        if self._count >= self.config.min_run:
            mean = self.mean
            if self._rung < self.top and mean > self._up[self._rung]:
                moved = 1
            elif self._rung > 0 and mean < self._down[self._rung - 1]:
                moved = -1
            if moved:
                self._rung += moved
                self._count = 0
        return Decision(self._rung, moved, False, self.mean)

    def certain_next(self) -> int | None:
        """The tier observe(H) will name for every finite H, or None where H decides it: once the
        count reaches min_run the mean may cross a threshold, and a hot streak may fire the guard."""
        may_guard = (
            self._rung < self.top_local
            and math.isfinite(self._hot_bits)
            and self._streak + 1 >= self.config.guard_count
        )
        ripe = self._count + 1 >= self.config.min_run
        may_climb = ripe and self._rung < self.top and self._up[self._rung] < math.inf
        may_descend = ripe and self._rung > 0 and self._down[self._rung - 1] > -math.inf
        return None if may_guard or may_climb or may_descend else self._rung

    def _guard_jump(self) -> Decision:
        # Only upwards: at or above the top local rung (e.g. on the cloud) the guard has nothing to do.
        if self._rung >= self.top_local:
            return Decision(self._rung, 0, False, self.mean)
        jump = self.top_local - self._rung
        self._rung, self._count = self.top_local, 0
        return Decision(self._rung, jump, True, self.mean)


def replay(
    initial_entropy: float | None, entropies: Iterable[float | None], config: RouterConfig, num_tiers: int
) -> list[Decision]:
    """Every decision of a recorded run: start()'s, then one observe() per recorded entropy."""
    router = Router(config, num_tiers)
    decisions = [router.start(initial_entropy)]
    decisions.extend(router.observe(h) for h in entropies)
    return decisions


def derive_tiers(
    initial_entropy: float | None, entropies: Iterable[float | None], config: RouterConfig, num_tiers: int
) -> list[int]:
    """Re-derive the tier of every token from recorded entropies (the telemetry check)."""
    # Token 0's tier comes from start(), token k+1's from observe(entropies[k]); so the list is
    # one longer than `entropies`, its last entry being the tier a next token would have had.
    return [d.rung for d in replay(initial_entropy, entropies, config, num_tiers)]


def parse_thresholds(text: str) -> tuple[float, ...]:
    """Parse '0.5,1.2' / 'inf' / '-inf' into floats; a UsageError on anything else."""
    parts = [part.strip() for part in text.split(",")]
    try:
        if not all(parts):
            raise ValueError
        values = tuple(float(part) for part in parts)
    except ValueError:
        raise UsageError(f"thresholds must be comma-separated numbers, inf or -inf (got '{text}')") from None
    if any(math.isnan(v) for v in values):
        raise UsageError(f"thresholds cannot be NaN (got '{text}')")
    return values
