"""What the Metal kernels' emulation tests share: when they run, and why they fail instead of
skipping (tests/test_signals.py, tests/test_kernels_nested.py)."""

from __future__ import annotations

import sys

import mlx.core as mx
import pytest

# Where Metal exists the real kernel is tested instead; the emulation targets Linux's g++. Where
# it should run it never skips: missing g++ or source fails, so the kernels cannot go untested.
needs_gxx = pytest.mark.skipif(
    mx.metal.is_available() or sys.platform != "linux",
    reason="Metal runs the real kernel tests; the emulation targets Linux",
)
NO_SOURCE = (
    "MLX {version} printed no generated Metal source while export tracing a metal_kernel launch "
    "with verbose=True: the emulation cannot run, and without Metal the kernels would have no "
    "test at all. Find how this MLX exposes the source (or pin MLX); never skip."
)
NO_GXX = (
    "the Metal kernels' emulation needs g++ 12+ (C++20, _Float16) on Linux: without it the kernels "
    "have no test here. Install g++ (e.g. apt-get install g++)."
)
