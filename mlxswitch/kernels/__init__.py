"""Custom kernels: each family keeps a plain-mx reference, a kernel built once, and a dispatcher."""

from ._common import KernelCheck, preloaded_mlx_blas
from .checks import kernel_self_check
from .entropy import float64_token_signals

__all__ = ["KernelCheck", "float64_token_signals", "kernel_self_check", "preloaded_mlx_blas"]
