"""Helpers shared by kernel modules: readers of the route, error measure, BLAS."""

from __future__ import annotations

import ctypes
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache

import mlx.core as mx
import numpy as np

from .route import KERNELS_ENV as KERNELS_ENV  # re-exported: tests and scripts name it here
from .route import available_cores as available_cores  # re-exported: the CLI and tests name it here
from .route import current_route, set_route_threads

# The route (kernels/route.py) is decided once; these read it. MLXSWITCH_KERNELS is read there only.


def kernels_setting() -> str:
    """The MLXSWITCH_KERNELS setting the current route was resolved with."""
    return current_route().kernels


def force_reference() -> bool:
    """Whether MLXSWITCH_KERNELS=reference forces every dispatcher onto its reference."""
    return current_route().force_reference


def numpy_routes_allowed() -> bool:
    """Whether a dispatcher may hand work to NumPy (it evaluates its inputs eagerly there)."""
    return current_route().numpy_allowed


def relative_max_error(got: mx.array, want: mx.array) -> float:
    """max |got − want| / max(max |want|, 1e-30), in fp32; inf when shapes differ or NaN appears."""
    if got.shape != want.shape:
        return float("inf")
    g, w = got.astype(mx.float32), want.astype(mx.float32)
    # mlx types item() as int | float | complex; a max of absolute fp32 values is a float.
    err: float = mx.max(mx.abs(g - w)).item()  # type: ignore[assignment]
    scale: float = mx.max(mx.abs(w)).item()  # type: ignore[assignment]
    if err != err or scale != scale:  # NaN
        return float("inf")
    return err / max(scale, 1e-30)


@lru_cache(maxsize=1)
def _openblas_threads():
    # NumPy's wheels on Linux bundle OpenBLAS under a prefixed name; find the loaded copy and its
    # thread setter (what threadpoolctl does). None elsewhere (macOS: Accelerate) or on failure.
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
        for path in sorted(paths):
            lib = ctypes.CDLL(path)
            for prefix in ("scipy_openblas", "openblas"):
                for suffix in ("64_", ""):
                    get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                    set_ = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
                    if get is not None and set_ is not None:
                        set_.argtypes = [ctypes.c_int]
                        return get, set_
    except (OSError, AttributeError):
        pass
    return None


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def preloaded_mlx_blas() -> dict | None:
    """The BLAS that MLX's CPU matmul calls when one preloaded into the process (LD_PRELOAD)
    overrides the reference BLAS the `mlx[cpu]` wheel bundles: its path and OpenBLAS thread count.
    None when MLX uses its own (or off Linux)."""
    # Python loads extension modules with RTLD_LOCAL, so the bundled libblas is not in the global
    # scope: a cblas_sgemm found there was preloaded, and the dynamic linker binds MLX's calls to it.
    if not sys.platform.startswith("linux"):
        return None
    try:
        process = ctypes.CDLL(None)
        sgemm = getattr(process, "cblas_sgemm", None)
        if sgemm is None:
            return None
        info = _DlInfo()
        if not process.dladdr(ctypes.cast(sgemm, ctypes.c_void_p), ctypes.byref(info)) or not info.dli_fname:
            return None
        get = getattr(process, "openblas_get_num_threads", None)
        threads = int(get()) if get is not None else None
    except (OSError, AttributeError):
        return None
    return {"path": os.path.realpath(info.dli_fname.decode()), "threads": threads}


# The fewest rows a product needs before more than one BLAS thread may take it. On a quiet
# machine two threads made every row count 1.3-1.9x faster on the Qwen pair's layers, the one-row
# mat-vec included: one core does not saturate the memory bandwidth (bench/results/threads-qwen.txt).
# On cores shared with another process the spinning workers can cost more than they give: --threads 1.
THREADED_MIN_ROWS = 1
# The threads a product may use are the route's blas_threads (every core until set_blas_threads).


def set_blas_threads(threads: int | None) -> int:
    """Let multi-row NumPy products use `threads` BLAS threads (None: every available core);
    returns the count in force. Products below THREADED_MIN_ROWS rows run on one thread."""
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be at least 1 (got {threads})")
    return set_route_threads(available_cores() if threads is None else threads).blas_threads


def blas_threads_setting() -> int:
    """The threads a product may use (set_blas_threads; every core until it is called)."""
    return current_route().blas_threads


def blas_threads(rows: int):
    """Run NumPy's OpenBLAS inside the block on the threads a product of `rows` rows may use
    (one below THREADED_MIN_ROWS), then restore its setting."""
    # Below THREADED_MIN_ROWS (none today: see its comment) a product keeps one thread.
    return _openblas_on(current_route().blas_threads if rows >= THREADED_MIN_ROWS else 1)


@contextmanager
def _openblas_on(count: int):
    threads = _openblas_threads()
    if threads is None:
        yield
        return
    get, set_ = threads
    before = get()
    set_(count)
    try:
        yield
    finally:
        set_(before)


def single_threaded_blas():
    """Run NumPy's OpenBLAS on one thread inside the block, then restore its setting."""
    return _openblas_on(1)


@dataclass(frozen=True)
class KernelCheck:
    """One line of `mlxswitch doctor`'s kernel self-check."""

    name: str
    backend: str
    status: str


def as_numpy_rows(x: mx.array) -> np.ndarray | None:
    """x as a 2-D fp32 NumPy array (rows × last dim), or None where evaluation is refused."""
    # Evaluates x here (a sync point); under mx.compile / vmap / export evaluation is refused,
    # and the caller stays in MLX. No gradient flows through NumPy: an inference-only route.
    x32 = x.astype(mx.float32)
    try:
        mx.eval(x32)
    except ValueError:
        return None
    return np.asarray(x32).reshape(-1, x.shape[-1])  # a zero-copy view of MLX's buffer


def rows_as_mx(y: np.ndarray, x: mx.array) -> mx.array:
    """A (rows × out) NumPy result as an mx.array of shape (*x.shape[:-1], out)."""
    return mx.array(y.reshape(*x.shape[:-1], y.shape[-1]))
