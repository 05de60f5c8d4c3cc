"""`mlxswitch doctor`'s kernel lines: each kernel against its reference, each reference against the truth."""

from __future__ import annotations

import numpy as np

from ._common import KernelCheck
from .entropy import entropy_self_check
from .nested import nested_self_check


def kernel_self_check() -> list[KernelCheck]:
    """Compare every kernel with its reference (and each reference with float64) on random inputs."""
    return entropy_self_check(np.random.default_rng(0)) + nested_self_check()
