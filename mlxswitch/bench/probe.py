"""A learned signal: logistic regression on the cheap tier's last hidden state and its scalar signals.

Labels need no human: at each teacher-forced position, does the top tier lower the NLL by more
than δ (0.1 nat)? Trained on calibration text by `calibrate`, judged by AUROC on held-out text,
saved under the user directory keyed by the ladder's models. NumPy only.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..resources import user_dir
from .simulate import Positions

SCALARS = ("entropy", "varentropy", "margin")


def features(positions: list[Positions]) -> np.ndarray | None:
    """Per position: the bottom tier's hidden state and its three scalar signals (None: no hidden states)."""
    if not positions or any(p.hidden is None for p in positions):
        return None
    rows = [np.concatenate([p.hidden, np.stack([p.signal(s)[0] for s in SCALARS], axis=1)], axis=1)
            for p in positions]
    return np.concatenate(rows, axis=0).astype(np.float64)


def labels(positions: list[Positions], gain_nats: float) -> np.ndarray:
    """Whether the top tier lowers the NLL by more than `gain_nats` at each position."""
    return np.concatenate([(p.nll[0] - p.nll[-1]) > gain_nats for p in positions])


@dataclass
class Probe:
    """Standardize, then logistic regression: p(the top tier helps here)."""

    mean: np.ndarray
    scale: np.ndarray
    weights: np.ndarray
    bias: float

    def score(self, x: np.ndarray) -> np.ndarray:
        """The probability for each row of features."""
        z = ((x - self.mean) / self.scale) @ self.weights + self.bias
        return 1.0 / (1.0 + np.exp(-np.clip(z, -40, 40)))

    def save(self, path: Path, meta: dict) -> Path:
        """Write the probe and what it was trained on (npz + JSON metadata in one file)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, mean=self.mean, scale=self.scale, weights=self.weights, bias=self.bias,
                 meta=json.dumps(meta))
        return path


def fit(x: np.ndarray, y: np.ndarray, l2: float = 1.0, iterations: int = 25) -> Probe:
    """L2-regularised logistic regression by Newton's method (a few hundred features: exact and fast)."""
    mean, scale = x.mean(axis=0), x.std(axis=0) + 1e-6
    z = (x - mean) / scale
    z1 = np.concatenate([z, np.ones((len(z), 1))], axis=1)
    w = np.zeros(z1.shape[1])
    reg = np.full(z1.shape[1], l2)
    reg[-1] = 0.0  # the bias is not shrunk
    target = y.astype(np.float64)
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(z1 @ w, -40, 40)))
        gradient = z1.T @ (p - target) + reg * w
        hessian = (z1 * (p * (1 - p))[:, None]).T @ z1 + np.diag(reg + 1e-9)
        step = np.linalg.solve(hessian, gradient)
        w -= step
        if np.abs(step).max() < 1e-6:
            break
    return Probe(mean, scale, w[:-1], float(w[-1]))


L2_CHOICES = (1.0, 10.0, 100.0, 1000.0, 10000.0)


def fit_cross_validated(x: np.ndarray, y: np.ndarray, folds: int = 5, seed: int = 0) -> tuple[Probe, float, dict]:
    """Choose the L2 strength by k-fold AUROC on the training text alone, then fit on all of it.

    Hundreds of hidden-state features against a few hundred positions overfit without it; the
    held-out text never takes part in the choice. Returns the probe, the strength and the CV table.
    """
    from .metrics import auroc

    order = np.random.default_rng(seed).permutation(len(y))
    parts = np.array_split(order, folds)
    table = {}
    for l2 in L2_CHOICES:
        scores = []
        for k in range(folds):
            test = parts[k]
            train = np.concatenate([parts[j] for j in range(folds) if j != k])
            if y[train].all() or not y[train].any() or y[test].all() or not y[test].any():
                continue
            scores.append(auroc(fit(x[train], y[train], l2).score(x[test]), y[test]))
        table[l2] = float(np.mean(scores)) if scores else float("nan")
    finite = {k: v for k, v in table.items() if v == v}
    best = max(finite, key=finite.get) if finite else 1.0
    return fit(x, y, best), best, table


def probe_path(key_parts: list[str]) -> Path:
    """Where the probe of this ladder lives: keyed by its models and tiers."""
    key = hashlib.sha256("\n".join(key_parts).encode()).hexdigest()[:16]
    return user_dir() / "probes" / f"{key}.npz"


def per_token_cost_s(probe: Probe, dims: int, repeats: int = 200) -> float:
    """Seconds the probe adds to one token (one feature row scored), measured here."""
    row = np.random.default_rng(0).normal(size=(1, dims))
    probe.score(row)
    start = time.perf_counter()
    for _ in range(repeats):
        probe.score(row)
    return (time.perf_counter() - start) / repeats
