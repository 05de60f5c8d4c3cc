"""Resident fp32 weights kept in panels, multiplied by a small C kernel (panel_rows.c).

Why our own: OpenBLAS's sgemm packs the whole weight on every call, so on the Qwen pair's
layers 2-8 rows cost 3-5x one row and a 47-row prefill 8.7x (bench/bench_layers.py threads --panels;
bench/results/panel-rows-qwen.txt). The kernel streams each 64-column panel of W once and
multiplies up to 6 rows per read (more rows: 6 at a time while the panel is in cache), so a check
of a few drafted tokens costs about one decoding step, as it does on Apple silicon. mlx-lm has no
CPU route of its own to reuse (MLX's CPU matmul uses its bundled reference BLAS).

The kernel is compiled on first use with the machine's C compiler (`cc`, -O3 -march=native
-fopenmp: OpenMP threads split the panels) into the per-machine kernel cache (cbuild.py), loaded
with ctypes, and checked against NumPy before any model uses it. Without a compiler, or on a failed check,
`panel_kernel()` is None and the resident route keeps NumPy's BLAS (kernels/route.py says which).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from .cbuild import compile_source

PANEL = 64  # output columns a panel holds; panel_rows.c reads the same (checked on load)
SOURCE = Path(__file__).with_name("panel_rows.c")
BUILD_BLOCK = 1 << 20  # bytes of W turned into panels at a time (about L2)
# Tried in order: a compiler may refuse -march=native or lack OpenMP (then one thread).
COMPILE_FLAGS = (
    ("-O3", "-march=native", "-fopenmp"),
    ("-O3", "-fopenmp"),
    ("-O3", "-march=native"),
    ("-O3",),
)


@dataclass(frozen=True, eq=False)
class PanelWeight:
    """A resident fp32 W (out × in) in panels, flat: full panels (in × PANEL each), then the rest
    of the columns (in × out mod PANEL). Exactly out × in floats, as W itself."""

    data: np.ndarray
    out_dims: int
    in_dims: int

    @property
    def nbytes(self) -> int:
        return self.data.nbytes


def panel_copy(weight_rows: Callable[[int, int], np.ndarray], out_dims: int, in_dims: int) -> PanelWeight:
    """W in panels, built a block of its rows at a time: `weight_rows(r0, r1)` gives rows r0..r1 of
    W as fp32 NumPy. No whole fp32 W is ever held beside the result."""
    data = np.empty(out_dims * in_dims, dtype=np.float32)
    full = out_dims // PANEL
    step = max(1, BUILD_BLOCK // (4 * in_dims * PANEL))
    for p0 in range(0, full, step):
        p1 = min(p0 + step, full)
        block = weight_rows(p0 * PANEL, p1 * PANEL).reshape(p1 - p0, PANEL, in_dims)
        data[p0 * PANEL * in_dims : p1 * PANEL * in_dims] = block.transpose(0, 2, 1).ravel()
    if full * PANEL < out_dims:
        data[full * PANEL * in_dims :] = weight_rows(full * PANEL, out_dims).T.ravel()
    return PanelWeight(data, out_dims, in_dims)


class PanelKernel:
    """The compiled panel_rows.c: `times(xs, weight, threads)` is xs · Wᵀ."""

    def __init__(self, library: ctypes.CDLL, flags: tuple[str, ...]):
        self._library = library  # kept: the function below lives in it
        self._rows = library.panel_rows
        self._rows.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long] * 3 + [ctypes.c_int]
        self._rows.restype = ctypes.c_int
        self.flags = flags
        self.threaded = bool(library.panel_threaded())

    def times(self, xs: np.ndarray, weight: PanelWeight, threads: int = 1) -> np.ndarray:
        """xs (rows × in) · Wᵀ as rows × out fp32, the panels split between `threads` threads."""
        xs = np.ascontiguousarray(xs, dtype=np.float32)
        rows, in_dims = xs.shape
        if in_dims != weight.in_dims:
            raise ValueError(f"x has {in_dims} columns, the weight {weight.in_dims}")
        y = np.empty((rows, weight.out_dims), dtype=np.float32)
        self._rows(
            xs.ctypes.data, weight.data.ctypes.data, y.ctypes.data, rows, in_dims, weight.out_dims, threads
        )
        return y


@dataclass(frozen=True)
class PanelBuild:
    """What building the kernel gave: the kernel, or None and why not (for `mlxswitch doctor`)."""

    kernel: PanelKernel | None
    detail: str


def check_kernel(kernel: PanelKernel) -> str | None:
    """None when the kernel equals NumPy on odd shapes at every row grouping, else what differed."""
    rng = np.random.default_rng(0)
    out_dims, in_dims = 2 * PANEL + 3, 37  # a narrow last panel; in not a multiple of the lanes
    weight = rng.standard_normal((out_dims, in_dims)).astype(np.float32)
    panels = panel_copy(lambda r0, r1: weight[r0:r1], out_dims, in_dims)
    for rows in (1, 2, 5, 6, 7, 13):
        xs = rng.standard_normal((rows, in_dims)).astype(np.float32)
        want = xs.astype(np.float64) @ weight.T.astype(np.float64)
        for threads in (1, 2):
            got = kernel.times(xs, panels, threads)
            if got.shape != want.shape or not np.allclose(got, want, rtol=1e-4, atol=1e-4):
                return f"{rows} rows on {threads} threads differed from NumPy"
    return None


@cache
def build_panel_kernel() -> PanelBuild:
    """Compile, load and check the kernel once per process (a few tenths of a second)."""
    built = compile_source(SOURCE, COMPILE_FLAGS)
    if isinstance(built, str):
        return PanelBuild(None, built)
    library, flags = built.library, built.flags
    try:
        width = int(library.panel_width())
        kernel = PanelKernel(library, flags)
    except AttributeError as error:  # a source without the functions this module calls
        return PanelBuild(None, f"the compiled kernel lacks a function ({error})")
    if width != PANEL:
        return PanelBuild(None, f"panel_rows.c reads panels of {width} columns, not {PANEL}")
    mismatch = check_kernel(kernel)
    if mismatch is not None:
        return PanelBuild(None, f"check failed: {mismatch}")
    return PanelBuild(kernel, built.detail(kernel.threaded, "NumPy"))


def panel_kernel() -> PanelKernel | None:
    """The checked kernel, or None where it could not be built (see build_panel_kernel)."""
    return build_panel_kernel().kernel
