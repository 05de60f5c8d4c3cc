"""Nested gears: one model, every precision. Residual planes q(W), q(W − W₁), … in MLX's affine format.

Gear k multiplies with the first k planes (a sum of `mx.quantized_matmul` calls), so all gears
stay resident in about the footprint of the largest, and a gear change is one attribute write.
Gears are named by the bits a weight costs to read: planes 4/4/8 give gears 4, 8 and 16. The
name is a cost, not a claim: from a 4-bit source no gear is more precise than the source.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..errors import ModelFormatError, UsageError
from ..kernels.nested import nested_matmul
from ..kernels.quant_cpu import integer_applies, quant_kernel
from ..kernels.quant_linear import numpy_quant_rows, quant_matmul
from ..kernels.quant_tiles import tiled_values_mx, tiled_weight
from ..kernels.quant_weights import QuantViews, QuantWeight, quant_views
from ..kernels.route import current_route
from .rows import Q4KLinear, Q6KLinear, TiledLinear

DEFAULT_PLANE_BITS = (4, 4, 8)
DEFAULT_GROUP_SIZE = 64
GROUP_SIZES = (32, 64, 128)  # what mx.quantize takes
SUPPORTED_PLANE_BITS = (2, 3, 4, 5, 6, 8)
# Plane scales/biases are stored in half precision; fp16 keeps 3 more mantissa bits than bf16,
# bf16 keeps fp32's range (a residual plane's scales, ~1e-5, are subnormal in fp16).
STORAGE_DTYPE = mx.float16
HALF_DTYPES = (mx.float16, mx.bfloat16)
# Whatever is not a plane is stored (and, when nesting, rounded) as a bf16 copy would hold it.
OTHER_DTYPE = mx.bfloat16


class GearState:
    """The one switch every nested layer of a model reads: how many planes are active."""

    def __init__(self, plane_bits: tuple[int, ...], source_bits: int | None = None):
        self.plane_bits = tuple(plane_bits)
        self.gears = tuple(sum(self.plane_bits[: i + 1]) for i in range(len(self.plane_bits)))
        self.source_bits = source_bits  # bits of an already-quantized source; None for float
        self.active_planes = len(self.plane_bits)

    @property
    def gear(self) -> int:
        """Bits per weight read at the current gear."""
        return self.gears[self.active_planes - 1]

    def set(self, gear: int) -> None:
        """Switch every nested layer to `gear` (O(1): one int is written, no array is touched)."""
        if gear not in self.gears:
            raise UsageError(
                f"gear {gear} is not built; this model has gears {', '.join(map(str, self.gears))}"
            )
        self.active_planes = self.gears.index(gear) + 1

    def __repr__(self) -> str:
        return f"GearState(gears={self.gears}, gear={self.gear})"


def _round_to(values: mx.array, dtype: mx.Dtype, memory: mx.Dtype) -> mx.array:
    return values.astype(dtype).astype(memory)


class NestedLinear(nn.Module):
    """A linear layer whose weight is a sum of quantized residual planes; the GearState picks how many."""

    # Whether its input may be rounded to int8 (quant_cpu.int8_inputs; set by row_routes.mark_int8_inputs).
    int8_inputs: bool = True
    # The kernel's views of the planes once they hold its tiles (_take_tiles), and whether that
    # was tried; plain attributes.
    tiled_planes: QuantViews | None = None
    tiles_tried: bool = False

    def __init__(
        self,
        planes: list[dict],
        plane_bits: tuple[int, ...],
        group_size: int,
        state: GearState,
        bias: mx.array | None = None,
    ):
        super().__init__()
        self.planes = planes
        self.plane_bits = tuple(plane_bits)
        self.group_size = group_size
        # A plain object attribute (nn.Module.state is taken): not a parameter, never saved.
        self.gear_state = state
        if bias is not None:
            self.bias = bias
        self.freeze()  # like nn.QuantizedLinear: packed planes are not trainable

    @classmethod
    def from_weight(
        cls,
        weight: mx.array,
        plane_bits: tuple[int, ...],
        group_size: int,
        state: GearState,
        bias: mx.array | None = None,
        scale_dtype: mx.Dtype | None = STORAGE_DTYPE,
        dtype: mx.Dtype = mx.float32,
    ) -> NestedLinear:
        """Planes q(W), q(W − W₁), …: scales/biases rounded to scale_dtype (None: exact), held in dtype."""
        residual = weight.astype(mx.float32)
        # Rounding each plane's scales to how they are stored before taking the next residual
        # lets the next plane correct it. fp16 fails on tiny scales (subnormal, then zero), so
        # each plane keeps whichever of fp16 and bf16 reconstructs it better.
        candidates = (scale_dtype, mx.bfloat16) if scale_dtype == mx.float16 else (scale_dtype or dtype,)
        planes = []
        for index, bits in enumerate(plane_bits):
            peak: float = mx.max(mx.abs(residual)).item()  # type: ignore[assignment]  # mlx: int | float | complex
            # mx.quantize floors scales at 1e-7, coarser than a tiny residual needs: lift it by an
            # exact power of two first (never the first plane: it stays plain mx.quantize).
            lift = 2.0 ** -math.floor(math.log2(peak)) if index and 0 < peak < math.inf else 1.0
            q, scales, biases = mx.quantize(residual * lift, group_size=group_size, bits=bits)
            scales, biases = scales / lift, biases / lift
            best: tuple[float, mx.array, mx.array, mx.array] | None = None
            for candidate in candidates:
                s, b = _round_to(scales, candidate, dtype), _round_to(biases, candidate, dtype)
                part = mx.dequantize(
                    q, s.astype(mx.float32), b.astype(mx.float32), group_size=group_size, bits=bits
                )
                error: float = mx.sum(mx.square(residual - part)).item()  # type: ignore[assignment]  # mlx: int | float | complex
                if best is None or error < best[0]:
                    best = (error, s, b, part)
            assert best is not None  # candidates is never empty
            _, scales, biases, part = best
            residual = residual - part
            planes.append({"weight": q, "scales": scales, "biases": biases})
            mx.eval(residual, planes[-1])
        return cls(planes, plane_bits, group_size, state, bias)

    @classmethod
    def from_linear(
        cls,
        layer: nn.Module,
        plane_bits: tuple[int, ...] = DEFAULT_PLANE_BITS,
        group_size: int = DEFAULT_GROUP_SIZE,
        state: GearState | None = None,
        scale_dtype: mx.Dtype | None = STORAGE_DTYPE,
        dtype: mx.Dtype | None = None,
    ) -> NestedLinear:
        """Nest an nn.Linear or nn.QuantizedLinear (dequantized to fp32 first)."""
        weight = _source_weight(layer)
        if weight.shape[-1] % group_size:
            raise ModelFormatError(
                f"a linear layer has {weight.shape[-1]} inputs, not a multiple of "
                f"the group size {group_size}; choose another group size"
            )
        if isinstance(layer, (Q6KLinear, Q4KLinear)):  # its scales live in its blocks; it computes in fp32
            source_dtype = mx.float32
        else:
            source_dtype = layer.scales.dtype if isinstance(layer, nn.QuantizedLinear) else layer.weight.dtype
        return cls.from_weight(
            weight,
            plane_bits,
            group_size,
            state or GearState(plane_bits),
            layer.bias if "bias" in layer else None,
            scale_dtype,
            dtype or source_dtype,
        )

    @classmethod
    def skeleton(
        cls,
        out_dims: int,
        in_dims: int,
        plane_bits: tuple[int, ...],
        group_size: int,
        state: GearState,
        has_bias: bool,
        dtype: mx.Dtype,
    ) -> NestedLinear:
        """Placeholders of the right shapes, for loading saved planes without re-quantizing."""
        planes = [
            {
                "weight": mx.zeros((out_dims, in_dims * bits // 32), dtype=mx.uint32),
                "scales": mx.zeros((out_dims, in_dims // group_size), dtype=dtype),
                "biases": mx.zeros((out_dims, in_dims // group_size), dtype=dtype),
            }
            for bits in plane_bits
        ]
        return cls(
            planes, plane_bits, group_size, state, mx.zeros((out_dims,), dtype=dtype) if has_bias else None
        )

    def dequantized(self, planes: int | None = None) -> mx.array:
        """The fp32 weight the first `planes` planes represent (all of them by default)."""
        count = planes or len(self.planes)
        if self.planes_tiled:
            return sum(  # type: ignore[return-value]  # as below
                tiled_values_mx(p["weight"], p["scales"], p["biases"], self.group_size)
                for p in self.planes[:count]
            )
        return sum(  # type: ignore[return-value]  # typed array | 0: a layer always has a plane
            mx.dequantize(
                p["weight"],
                p["scales"].astype(mx.float32),
                p["biases"].astype(mx.float32),
                group_size=self.group_size,
                bits=bits,
            )
            for p, bits in zip(self.planes[:count], self.plane_bits[:count], strict=True)
        )

    @property
    def planes_tiled(self) -> bool:
        """Whether the planes hold the quantized kernel's tiles (_take_tiles) instead of MLX's layout."""
        return self.tiled_planes is not None

    def _kernel_views(self) -> QuantViews | None:
        """The quantized kernel's views of the planes where the route multiplies them so (built
        once and kept on the layer): the first time the route rounds rows to integers, the planes
        are laid out as its tiles where the kernel tiles them all (_take_tiles), for good; else
        views of MLX's layout. None where a plane does not fit the kernel, or off the route."""
        route = current_route()
        if route.nested != "quant-kernel":
            return None
        integer_rows = route.quant_activations == "int8"
        if self.planes_tiled:
            return self.tiled_planes if integer_rows else None
        if not hasattr(self, "quant_planes"):
            self.quant_planes = quant_views(self.planes, self.plane_bits, self.group_size)
        if self.quant_planes is not None and integer_rows and not self.tiles_tried:
            self.tiles_tried = True  # a refusal holds: the kernel and the layer's mark do not change
            self.tiled_planes = self._take_tiles(self.quant_planes, route.blas_threads)
            if self.planes_tiled:
                self.quant_planes = None  # views of the arrays the tiles replaced
                return self.tiled_planes
        return self.quant_planes

    def _take_tiles(self, views: QuantViews, threads: int) -> QuantViews | None:
        """Replace every plane's arrays by the same values laid out as the kernel's tiles (each
        plane's product then one integer product at any row count: SmolLM2's 45-token prompts were
        prefilled at gear 8 on MLX's layout in ~1.5x the time), or None where one does not tile.
        Copied, then swapped: the arrays they replace are freed, so a layer is held once."""
        kernel = quant_kernel()
        if kernel is None:
            return None
        for weight in views.weights:  # tiles multiply integer rows only: where this layer's rows are
            if not (integer_applies(weight, self.int8_inputs) and kernel.tiles(weight, not self.int8_inputs)):
                return None
        tiled = tuple(tiled_weight(kernel, weight, threads) for weight in views.weights)
        for plane, view in zip(self.planes, tiled, strict=True):
            plane["weight"], plane["scales"], plane["biases"] = view.keep
        return QuantViews(tiled)

    def numpy_rows(self, xs: np.ndarray, decoding: bool) -> np.ndarray | None:
        """A pass's rows (fp32 NumPy, rows × in) · (Σ active planes)ᵀ (+ bias) in NumPy, as __call__
        computes them (decoding: as quant_linear.numpy_quant_rows); None where the gear takes a route
        other than the quantized kernel."""
        views = self._kernel_views()
        if views is None:
            return None
        bias = self.bias if "bias" in self else None
        active = views.weights[: self.gear_state.active_planes]
        return numpy_quant_rows(xs, active, bias, self.int8_inputs, decoding)

    def integer_planes(self) -> tuple[QuantWeight, ...] | None:
        """The active planes on the kernel's tiles, where the route multiplies this layer's rows so
        (integer rows, every row count: the one-call decoding pass reads them, models/block_calls.py);
        else None."""
        views = self._kernel_views()
        if views is None or not self.planes_tiled:
            return None
        return views.weights[: self.gear_state.active_planes]

    def __call__(self, x: mx.array) -> mx.array:
        """x · (Σ active planes)ᵀ (+ bias), by the fastest checked route (kernels/nested.py)."""
        bias = self.bias if "bias" in self else None
        views = self._kernel_views()
        if views is not None:
            y = quant_matmul(x, views.weights[: self.gear_state.active_planes], bias, self.int8_inputs)
            if y is not None:
                return y
        if self.planes_tiled:  # a route without integer rows (exact), or mx.compile: W's values in mx
            y = x @ self.dequantized(self.gear_state.active_planes).T.astype(x.dtype)
            return y if bias is None else y + bias
        return nested_matmul(
            x,
            self.planes,
            self.plane_bits,
            self.group_size,
            self.gear_state.active_planes,
            bias,
        )


def _source_weight(layer: nn.Module) -> mx.array:
    if isinstance(layer, (Q6KLinear, TiledLinear)):  # Q6_K blocks, or the kernel's tiles: not MLX's rows
        return layer.stored_values()
    if isinstance(layer, nn.QuantizedLinear):
        biases = layer.get("biases")
        return mx.dequantize(
            layer.weight,
            layer.scales.astype(mx.float32),
            None if biases is None else biases.astype(mx.float32),
            group_size=layer.group_size,
            bits=layer.bits,
            mode=layer.mode,
        )
    return layer.weight.astype(mx.float32)
