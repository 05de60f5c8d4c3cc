"""The probe as a routing signal: p(the top tier helps here) from the cheap tier's state.

A logistic regression on the bottom tier's last hidden state (after the final norm) and its
three scalar signals. `mlxswitch calibrate` trains it (bench/probe.py) and saves it under the
user directory, keyed by the profile, its models and its tiers; a session routing on
`--signal probe` loads it from there. NumPy only: one dot product per token.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import UsageError
from ..files import atomic_file
from ..resources import user_dir
from .registry import MEASURED, uncertainty

# The scalar features: every signal of the logits reduction, each as the router reads it.
SCALARS = tuple(s.name for s in MEASURED)


def feature_rows(hidden: np.ndarray, measured) -> np.ndarray:
    """Features per position: the hidden state (n, d) then the scalar uncertainties, from the
    reduction's outputs in registry.MEASURED order (each (n,) or a float)."""
    scalars = np.stack(
        [np.asarray(uncertainty(s, measured), dtype=np.float64).reshape(-1) for s in SCALARS], axis=1
    )
    return np.concatenate([np.asarray(hidden, dtype=np.float64).reshape(len(scalars), -1), scalars], axis=1)


@dataclass
class Probe:
    """Standardize, then logistic regression: p(the top tier helps here)."""

    mean: np.ndarray
    scale: np.ndarray
    weights: np.ndarray
    bias: float

    @property
    def dims(self) -> int:
        """Features it reads: the hidden size plus the three scalars."""
        return int(self.weights.shape[0])

    def score(self, x: np.ndarray) -> np.ndarray:
        """The probability for each row of features."""
        z = ((x - self.mean) / self.scale) @ self.weights + self.bias
        return 1.0 / (1.0 + np.exp(-np.clip(z, -40, 40)))

    def score_position(self, hidden: np.ndarray, signals: list[float]) -> float:
        """One position: its hidden state (d,) and the reduction's outputs (registry.MEASURED order)."""
        if not all(math.isfinite(v) for v in signals):
            return math.nan  # broken logits: the policy's guard takes it (as for any signal)
        return float(self.score(feature_rows(hidden[None], signals))[0])

    def save(self, path: Path, meta: dict) -> Path:
        """Write the probe and what it was trained on (npz + JSON metadata in one file), atomically."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path, "the probe", binary=True) as handle:
            np.savez(
                handle,
                mean=self.mean,
                scale=self.scale,
                weights=self.weights,
                bias=self.bias,
                meta=json.dumps(meta),
            )
        return path

    @classmethod
    def load(cls, path: Path) -> Probe:
        """Read a probe saved by `save`; a UsageError naming the file when it is not one."""
        try:
            with np.load(path) as data:
                probe = cls(data["mean"], data["scale"], data["weights"], float(data["bias"]))
        except (OSError, ValueError, KeyError) as exc:
            raise UsageError(
                f"{path}: not a probe saved by `mlxswitch calibrate` ({exc}); "
                "run calibrate again to replace it"
            ) from None
        if not probe.mean.shape == probe.scale.shape == probe.weights.shape or probe.weights.ndim != 1:
            raise UsageError(f"{path}: a probe with inconsistent shapes; run `mlxswitch calibrate` again")
        return probe


def probe_path(profile_name: str, models: tuple[str, ...], tiers: tuple[str, ...]) -> Path:
    """Where the probe of this profile lives: keyed by its name, its models and its local tiers."""
    key = hashlib.sha256("\n".join([profile_name, *models, *tiers]).encode()).hexdigest()[:16]
    return user_dir() / "probes" / f"{key}.npz"


def load_probe(profile_name: str, models: tuple[str, ...], tiers: tuple[str, ...]) -> Probe:
    """The saved probe of this profile; a UsageError saying how to train one when there is none."""
    path = probe_path(profile_name, models, tiers)
    if not path.exists():
        raise UsageError(
            f"no probe is trained for profile '{profile_name}' on these models: run "
            f"`mlxswitch calibrate --profile {profile_name} --target-share 0.25` first "
            f"(it saves one under {path.parent})"
        )
    return Probe.load(path)


def describe_probe(profile_name: str, models: tuple[str, ...], tiers: tuple[str, ...]) -> str:
    """One line for `doctor`: where this profile's probe is and how it scored, or how to train one."""
    path = probe_path(profile_name, models, tiers)
    if not path.exists():
        return f"none (train one: mlxswitch calibrate --profile {profile_name} --target-share 0.25)"
    try:
        with np.load(path) as data:
            meta = json.loads(str(data["meta"]))
    except (OSError, ValueError, KeyError):
        return f"{path}: unreadable (run mlxswitch calibrate again)"
    auroc = meta.get("auroc_heldout")
    scored = f"held-out AUROC {auroc:.3f}, " if isinstance(auroc, float) and math.isfinite(auroc) else ""
    return f"{path} ({scored}{meta.get('positions', '?')} training positions)"
