"""Custom kernels: each family keeps a plain-mx reference, a kernel built once, and a dispatcher;
the route (route.py) decides once which of them runs here."""

from ._common import KernelCheck, preloaded_mlx_blas
from .checks import kernel_self_check
from .route import Route, current_route, kernels_override, resolve_route
from .signals_numpy import float64_token_signals

__all__ = [
    "KernelCheck",
    "Route",
    "current_route",
    "float64_token_signals",
    "kernel_self_check",
    "kernels_override",
    "preloaded_mlx_blas",
    "resolve_route",
]
