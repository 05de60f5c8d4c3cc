"""A plain quantized linear's product on the compiled quantized kernel (quant_cpu.py), the CPU
route of every quantized linear and nested gear where the kernel built: from MLX arrays
(quant_matmul, evaluated at the call) or from a decoder block's NumPy rows (numpy_quant_rows,
numpy_quant_rows_together: cpu_blocks.numpy_block), with integer activations where the route and
the layer allow them."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from ._common import as_numpy_rows, rows_as_mx
from .quant_cpu import INT8_MAX_POSITIONS, int8_applies, quant_kernel, quant_weights_times
from .quant_packs import WeightPack, times_together
from .quant_weights import QuantWeight
from .route import Route, current_route


def quant_matmul(
    x: mx.array, weights: Sequence[QuantWeight], bias: mx.array | None = None, int8_inputs: bool = True
) -> mx.array | None:
    """x · (Σ weights)ᵀ (+ bias) by the compiled quantized kernel on the stored codes (the CPU
    route of every quantized linear and nested gear where it built). None where evaluation is
    refused (mx.compile): the caller stays in MLX. int8_inputs: whether the layer may take int8
    activations (quant_cpu.int8_inputs)."""
    xs = as_numpy_rows(x)
    if xs is None:
        return None
    # A sequence's positions in this pass: x is (batch, positions, dims), or (rows, dims) when its
    # rows are different sequences' (a packed pass's head).
    positions = x.shape[-2] if x.ndim > 2 else 1
    decoding = positions <= INT8_MAX_POSITIONS  # each row computed as a step computes it
    y = rows_as_mx(quant_rows_times(xs, weights, decoding, int8_inputs), x)
    y = y if y.dtype == x.dtype else y.astype(x.dtype)
    return y if bias is None else y + bias


def quant_rows_times(
    xs: np.ndarray, weights: Sequence[QuantWeight], decoding: bool, int8_inputs: bool
) -> np.ndarray:
    """xs (rows × in, fp32 NumPy) · (Σ weights)ᵀ on the quantized kernel, as quant_matmul computes
    it, with integer activations where the route allows (int8 where the layer does,
    quant_weights_times). decoding: the rows are a decoding pass's (≤ INT8_MAX_POSITIONS a
    sequence), each computed as a step computes it; else (a prefill) by the many-row paths."""
    route = current_route()
    integer = route.quant_activations == "int8"
    return quant_weights_times(xs, weights, route.blas_threads, integer, by_row=decoding, narrow=int8_inputs)


def _int8_activations(route: Route, int8_inputs: bool) -> bool:
    """Whether a decoding pass rounds this layer's rows to int8: the layer allows it and so does the
    route (each weight then by int8_applies; a layer that does not allow it takes int16 where
    quant_cpu.wide_applies)."""
    return int8_inputs and route.quant_activations == "int8"


def bias_row(bias: mx.array) -> np.ndarray:
    """A layer's bias as the fp32 NumPy row added to its products."""
    return np.asarray(bias if bias.dtype == mx.float32 else bias.astype(mx.float32))


def int8_decoding_weight(weights: Sequence[QuantWeight], int8_inputs: bool) -> QuantWeight | None:
    """The weight a decoding pass multiplies on int8 activations in one product (a plain linear:
    one plane), or None where quant_rows_times takes another path for these rows."""
    if (
        len(weights) != 1
        or not _int8_activations(current_route(), int8_inputs)
        or not int8_applies(weights[0])
    ):
        return None
    return weights[0]


def numpy_quant_rows_together(
    xs: np.ndarray, pack: WeightPack, biases: Sequence[mx.array | None]
) -> list[np.ndarray] | None:
    """A pass's rows times each of the pack's weights (+ its bias) in one kernel call: the bits
    numpy_quant_rows gives each (int8_decoding_weight's path; a prefill's only on tiles). None
    where the kernel refused: the caller multiplies one at a time."""
    kernel = quant_kernel()
    assert kernel is not None, "packs are made only where the kernel is"
    y = times_together(kernel, xs, pack, current_route().blas_threads)
    if y is None:
        return None
    outs = np.split(y, pack.ends[:-1], axis=1)
    for out, bias in zip(outs, biases, strict=True):
        if bias is not None:
            out += bias_row(bias)  # a view: y's columns
    return outs


def numpy_quant_rows(
    xs: np.ndarray, weights: Sequence[QuantWeight], bias: mx.array | None, int8_inputs: bool, decoding: bool
) -> np.ndarray:
    """A pass's rows (fp32 NumPy) · (Σ weights)ᵀ (+ bias) in NumPy: the bits quant_matmul gives
    those rows, without a round trip through MLX (cpu_blocks.numpy_block). decoding: as
    quant_rows_times."""
    y = quant_rows_times(xs, weights, decoding, int8_inputs)
    if bias is not None:
        y += bias_row(bias)
    return y
