"""Training the probe (routing/probe.py): logistic regression on the cheap tier's state, by `calibrate`.

Labels need no human: at each teacher-forced position, does the top tier lower the NLL by more
than δ (0.1 nat)? The hidden state has hundreds of dimensions against a few hundred positions,
so the fit first projects it onto its leading principal components; how many (none: the three
scalars alone, up to all) and the L2 strength are chosen by cross-validation over whole prompts
of the calibration text. Held-out text never takes part. NumPy only.
"""

from __future__ import annotations

import time

import numpy as np

from ..routing.probe import SCALARS, Probe, feature_rows
from .metrics import auroc
from .simulate import Positions

L2_CHOICES = (1.0, 10.0, 100.0, 1000.0, 10000.0)
COMPONENT_CHOICES = (0, 8, 32, None)  # leading principal components of the hidden state (None: all)
FOLDS = 5


def features(positions: list[Positions]) -> np.ndarray | None:
    """Per position: the bottom tier's hidden state and its three scalar signals (None: no hidden states)."""
    if not positions or any(p.hidden is None for p in positions):
        return None
    return np.concatenate([_feature_rows(p) for p in positions], axis=0)


def _feature_rows(p: Positions) -> np.ndarray:
    measured = p.measured()
    if p.hidden is None or any(m is None for m in measured):
        raise ValueError(
            f"{p.prompt_id}: the probe's features need the hidden state and every measured signal"
        )
    return feature_rows(p.hidden, [m[0] for m in measured if m is not None])


def labels(positions: list[Positions], gain_nats: float) -> np.ndarray:
    """Whether the top tier lowers the NLL by more than `gain_nats` at each position."""
    return np.concatenate([(p.nll[0] - p.nll[-1]) > gain_nats for p in positions])


def _newton(z: np.ndarray, y: np.ndarray, l2: float, iterations: int = 25) -> tuple[np.ndarray, float]:
    """L2-regularised logistic regression on standardized features by Newton's method (exact, fast)."""
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
    return w[:-1], float(w[-1])


def _basis(z: np.ndarray, components: int | None) -> np.ndarray:
    """(features, kept): the hidden part onto its leading principal components, the scalars as they are."""
    hidden = z.shape[1] - len(SCALARS)
    if components is None or components >= min(hidden, len(z)):
        return np.eye(z.shape[1])
    basis = np.zeros((z.shape[1], components + len(SCALARS)))
    if components:
        _, _, vt = np.linalg.svd(z[:, :hidden], full_matrices=False)
        basis[:hidden, :components] = vt[:components].T
    basis[hidden:, components:] = np.eye(len(SCALARS))
    return basis


def fit(x: np.ndarray, y: np.ndarray, l2: float = 1.0, components: int | None = None) -> Probe:
    """Standardize, project (see _basis), fit; folded back into one weight per feature."""
    mean, scale = x.mean(axis=0), x.std(axis=0) + 1e-6
    z = (x - mean) / scale
    basis = _basis(z, components)
    reduced = z @ basis
    r_mean, r_scale = reduced.mean(axis=0), reduced.std(axis=0) + 1e-6
    w, b = _newton((reduced - r_mean) / r_scale, y, l2)
    # σ(((z B − m) / s) · w + b) = σ(z · (B (w / s)) + b − (m / s) · w): the same Probe as any other.
    return Probe(mean, scale, basis @ (w / r_scale), b - float((r_mean / r_scale) @ w))


def _folds(groups: np.ndarray, folds: int, seed: int) -> list[np.ndarray]:
    # Whole prompts per fold: positions of one answer are alike, and a fold must not see its own prompt.
    names = np.unique(groups)
    order = np.random.default_rng(seed).permutation(len(names))
    return [np.flatnonzero(np.isin(groups, names[part])) for part in np.array_split(order, folds)]


def fit_cross_validated(
    x: np.ndarray, y: np.ndarray, groups: np.ndarray, folds: int = FOLDS, seed: int = 0
) -> tuple[Probe, dict, dict, np.ndarray]:
    """Choose components and L2 by k-fold AUROC over prompts, then fit on all of the calibration text.

    Returns the probe, the choice, the CV table ("components/l2" → mean AUROC) and the
    out-of-fold score of every position under the choice (what calibrate sweeps thresholds on:
    in-sample scores of a probe are optimistic).
    """
    parts = [p for p in _folds(groups, folds, seed) if p.size]
    table: dict[str, float] = {}
    best: tuple[int | None, float] | None = None
    best_key: tuple[float, ...] = (-np.inf,)
    for components in COMPONENT_CHOICES:
        for l2 in L2_CHOICES:
            scores = []
            for test in parts:
                train = np.setdiff1d(np.arange(len(y)), test)
                if y[train].all() or not y[train].any() or y[test].all() or not y[test].any():
                    continue
                scores.append(auroc(fit(x[train], y[train], l2, components).score(x[test]), y[test]))
            value = float(np.mean(scores)) if scores else float("nan")
            table[f"{'all' if components is None else components}/{l2:g}"] = value
            # Ties go to the simpler model (fewer components, stronger L2): listed first / later.
            key = (value, -(components if components is not None else x.shape[1]), l2)
            if value == value and key > best_key:
                best, best_key = (components, l2), key
    components, l2 = best if best is not None else (0, 1.0)
    oof = np.full(len(y), np.nan)
    for test in parts:
        train = np.setdiff1d(np.arange(len(y)), test)
        if y[train].any() and not y[train].all():
            oof[test] = fit(x[train], y[train], l2, components).score(x[test])
    choice = {"components": "all" if components is None else components, "l2": l2}
    return fit(x, y, l2, components), choice, table, oof


def per_token_cost_s(probe: Probe, repeats: int = 200) -> float:
    """Seconds the probe adds to one token, measured here on the path the token loop runs."""
    hidden = np.random.default_rng(0).normal(size=probe.dims - len(SCALARS)).astype(np.float32)
    signals = [2.0, 3.0, 0.5]
    probe.score_position(hidden, signals)
    start = time.perf_counter()
    for _ in range(repeats):
        probe.score_position(hidden, signals)
    return (time.perf_counter() - start) / repeats
