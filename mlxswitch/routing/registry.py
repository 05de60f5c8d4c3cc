"""The routing signals and policies, each described once (pure Python).

A signal is one number per computed position, read as an uncertainty (higher = less sure). The
ones with an `index` come out of the one logits reduction (kernels/entropy.py: the Metal kernel,
its mx reference and the NumPy route), in that order; the probe comes from the cheap tier's
hidden state. A policy's class lives in policies.py; what the bench and the checks need to know
about it lives here, so that router.py can check a name without importing the policies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SignalSpec:
    """One routing signal: where it comes from, its unit and the rules that depend on it."""

    name: str
    index: int | None  # its place in the logits reduction's output; None: computed elsewhere
    unit: str  # the unit of the value routed on (and of the thresholds)
    normalisable: bool  # bits of a distribution over V: --normalize divides it by log2 V
    bottom_only: bool  # measured on the bottom rung only: a policy must compute every position there
    flipped: bool = False  # measured as a certainty: routed as 1 − value
    probability: bool = False  # lies in [0, 1]: a finite threshold outside is never crossed


SIGNALS: tuple[SignalSpec, ...] = (
    SignalSpec("entropy", 0, "bits", normalisable=True, bottom_only=False),
    SignalSpec("varentropy", 1, "bits²", normalisable=False, bottom_only=False),
    # Measured as p1 − p2 (a certainty); routed as 1 − (p1 − p2).
    SignalSpec("margin", 2, "1 − (p1 − p2)", normalisable=False, bottom_only=False, flipped=True),
    # p(the top tier lowers the NLL here by more than 0.1 nat), from the cheap tier's hidden state.
    SignalSpec("probe", None, "probability", normalisable=False, bottom_only=True, probability=True),
)
SIGNAL_BY_NAME = {s.name: s for s in SIGNALS}
# The reduction's outputs, in its order: what the probe reads as scalars and the teacher records.
MEASURED: tuple[SignalSpec, ...] = tuple(s for s in SIGNALS if s.index is not None)
assert [s.index for s in MEASURED] == list(range(len(MEASURED))), "list them in the reduction's order"


def uncertainty(name: str, measured: Sequence):
    """Signal `name` as routed, from the reduction's outputs in MEASURED order (floats or arrays)."""
    spec = SIGNAL_BY_NAME[name]
    if spec.index is None:
        raise ValueError(f"the {name} is not computed by the logits reduction")
    value = measured[spec.index]
    return 1.0 - value if spec.flipped else value


@dataclass(frozen=True)
class PolicySpec:
    """One routing policy as the checks, the bench and the plot see it (its class: policies.py)."""

    name: str
    reads_bottom_only: bool  # computes every position on the bottom rung first when asked to
    sweep_timing: tuple[int, int]  # the bench sweep's and calibrate's (window, min run)
    colour: str  # its line in the bench plot


# As in the Entropy Adaptive Decoding paper: a 5-token rolling mean, 10 tokens before a move.
# The router's defaults, and `ead`'s timing wherever the bench compares against it.
DEFAULT_WINDOW = 5
DEFAULT_MIN_RUN = 10

POLICIES: tuple[PolicySpec, ...] = (
    # The Entropy Adaptive Decoding contract: its timing is part of the policy, as published.
    PolicySpec(
        "ead", reads_bottom_only=False, sweep_timing=(DEFAULT_WINDOW, DEFAULT_MIN_RUN), colour="tab:orange"
    ),
    # Each position decided on its own: the setting in which it is meant to beat `ead`.
    PolicySpec("peek", reads_bottom_only=True, sweep_timing=(1, 1), colour="tab:green"),
)
POLICY_BY_NAME = {p.name: p for p in POLICIES}
