"""Helpers shared by kernel modules: the environment switch, device test, error measure, BLAS."""

from __future__ import annotations

import ctypes
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache

import mlx.core as mx

# The one place the environment is read. Values:
#   "auto" (default, or unset): custom kernels and fast routes where they exist and passed checks;
#   "reference": every dispatcher returns its plain-mx reference (to rule the kernels out of a bug);
#   "mx": only MLX computes (no NumPy BLAS route), results stay lazy and traceable.
KERNELS_ENV = "MLXSWITCH_KERNELS"
_SETTINGS = ("auto", "reference", "mx")


def kernels_setting() -> str:
    """The MLXSWITCH_KERNELS setting, read at every call so a test or a user can flip it."""
    value = os.environ.get(KERNELS_ENV, "").strip().lower() or "auto"
    if value not in _SETTINGS:
        raise ValueError(f"{KERNELS_ENV}={value!r}: expected one of {', '.join(_SETTINGS)}")
    return value


def force_reference() -> bool:
    """Whether MLXSWITCH_KERNELS=reference forces every dispatcher onto its reference."""
    return kernels_setting() == "reference"


def numpy_routes_allowed() -> bool:
    """Whether a dispatcher may hand work to NumPy (it evaluates its inputs eagerly there)."""
    return kernels_setting() == "auto"


def on_gpu() -> bool:
    """Whether the default device is a GPU (custom GPU kernels run on GPU streams only)."""
    return mx.default_device().type == mx.DeviceType.gpu


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


@contextmanager
def single_threaded_blas():
    """Run NumPy's OpenBLAS on one thread inside the block, then restore its setting."""
    # On shared cores OpenBLAS's spinning worker threads can make a small product orders of
    # magnitude slower; uncontended, one thread loses little next to dequantizing the planes.
    threads = _openblas_threads()
    if threads is None:
        yield
        return
    get, set_ = threads
    before = get()
    set_(1)
    try:
        yield
    finally:
        set_(before)


@dataclass(frozen=True)
class KernelCheck:
    """One line of `mlxswitch doctor`'s kernel self-check."""

    name: str
    backend: str
    status: str
