"""Custom kernels: each family keeps a plain-mx reference, a kernel built once, and a dispatcher."""

from ._common import KernelCheck, float64_token_signals
from .checks import kernel_self_check

__all__ = ["KernelCheck", "float64_token_signals", "kernel_self_check"]
