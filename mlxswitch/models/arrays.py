"""Typed views of mlx calls whose stubs are broader than what they return for a module or a file."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten


def flat_parameters(model: nn.Module) -> list[tuple[str, mx.array]]:
    """tree_flatten(model.parameters()): (dotted name, array) pairs."""
    # mlx types the leaves as Any | str; a module's parameter tree holds only arrays.
    return tree_flatten(model.parameters())  # type: ignore[return-value]


def load_arrays(path: str) -> dict[str, mx.array]:
    """mx.load of a safetensors/npz file: name → array."""
    # mlx types the result as a union over formats and return_metadata; a weights file gives a dict.
    return mx.load(path)  # type: ignore[return-value]
