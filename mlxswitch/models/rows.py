"""Plain quantized linears on the CPU routes: prefill, catch-up and decode without MLX's scalar
quantized mat-vec.

The route (kernels/route.py, its `plain_linears`) decides. On a CPU with the compiled quantized
kernel (MLXSWITCH_KERNELS=auto, where it built) every plain quantized linear and a tied output
head are multiplied on their stored codes: no copy. With MLXSWITCH_KERNELS=fp32 or blas (or no C
compiler) each keeps a resident fp32 copy of its weight (4 bytes a parameter beside the ~0.6 of
its codes) where the copies fit. On other CPU settings the codes are used through MLX. On a GPU
plain quantized linears stay MLX's own nn.QuantizedLinear modules (only nested gears get ours).
Which layer takes which route is decided once, at load (models/row_routes.py).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..kernels.nested import quantized_matmul_rows
from ..kernels.nested_cpu import resident_copy, resident_dense_matmul
from ..kernels.panel_cpu import PanelWeight
from ..kernels.quant_cpu import quant_kernel, widened_codes
from ..kernels.quant_linear import int8_decoding_weight, numpy_quant_rows, quant_matmul
from ..kernels.quant_tiles import (
    q4k_tiled_values_mx,
    q6k_tiled_values_mx,
    tiled_q4k_weight,
    tiled_q6k_weight,
    tiled_values_mx,
    tiled_weight,
    tiles_q6k,
)
from ..kernels.quant_weights import (
    DIRECT_BITS,
    Q6K_TILED,
    SUPPORTED_BITS,
    QuantViews,
    QuantWeight,
    fp16_scales,
    q6k_values_mx,
    quant_views,
)
from ..kernels.route import current_route


class RowsQuantizedLinear(nn.QuantizedLinear):
    """nn.QuantizedLinear whose product takes the dispatcher's route (same arrays, same results)."""

    # The resident fp32 copy, when the CPU route keeps one: panels (the panel kernel) or Wᵀ (BLAS).
    dense: np.ndarray | PanelWeight | None = None
    # The quantized kernel's view of the stored codes, when the route multiplies them in place.
    quant: QuantViews | None = None
    # Whether its input may be rounded to int8 (quant_cpu.int8_inputs: not a down projection's).
    int8_inputs: bool = True
    # The stored codes' own width where keep_quantized widened them to bytes (`bits` is then 8).
    code_bits: int = 0
    # Whether keep_quantized narrowed fp32 scales to fp16 (an embedding's lookups widen them back).
    scales_narrowed: bool = False

    def __call__(self, x: mx.array) -> mx.array:
        """x · Wᵀ (+ bias): by the quantized kernel on the stored codes, or on the resident fp32
        weight, else many rows through one dequantized product and few through MLX's quantized
        matmul (kernels/quant_linear.py; kernels/nested.py, kernels/nested_cpu.py)."""
        if self.quant is not None and current_route().plain_linears == "quant-kernel":
            y = quant_matmul(x, self.quant.weights, self.get("bias"), self.int8_inputs)
            if y is not None:
                return y
        if self.dense is not None and current_route().plain_linears == "resident-fp32":
            y = resident_dense_matmul(x, self.dense, self.get("bias"))
            if y is not None:
                return y
        return quantized_matmul_rows(
            x,
            self["weight"],
            self["scales"],
            self.get("biases"),
            self.group_size,
            self.bits,
            self.get("bias"),
            mode=self.mode,
        )

    def numpy_rows(self, xs: np.ndarray, decoding: bool) -> np.ndarray | None:
        """A pass's rows (fp32 NumPy, rows × in) · Wᵀ (+ bias) in NumPy, as __call__ computes them
        (decoding: a decoding pass's, else a prefill's: quant_linear.numpy_quant_rows); None where
        this layer takes a route other than the quantized kernel."""
        if self.quant is None or current_route().plain_linears != "quant-kernel":
            return None
        return numpy_quant_rows(xs, self.quant.weights, self.get("bias"), self.int8_inputs, decoding)

    def int8_weight(self) -> QuantWeight | None:
        """The weight this layer's decoding rows are multiplied by on int8 activations in one
        kernel product (numpy_rows' path), or None where they take another."""
        if self.quant is None or current_route().plain_linears != "quant-kernel":
            return None
        return int8_decoding_weight(self.quant.weights, self.int8_inputs)

    def keep_quantized(self) -> bool:
        """Take the quantized kernel's view of the stored codes (no copy for 4- and 8-bit codes
        with fp32, fp16 or bf16 scales); False where the layer's shape or mode does not fit the
        kernel. Where the route says so, fp32 scales and biases are narrowed to fp16 in place
        (quant_cpu.fp16_scales). 2-, 3-, 5- and 6-bit codes are widened in place to MLX's 8-bit
        layout, a byte a code, which the kernel reads as it is: the same W, held once (not the
        packed codes beside a byte copy: ~190 MB more for the Qwen 0.5B)."""
        if self.mode != "affine" or self.get("biases") is None:
            return False
        code_bits = self.code_bits or self.bits
        if self.bits not in DIRECT_BITS and self.bits in SUPPORTED_BITS:
            self.weight = widened_codes(self["weight"], self.bits)
            self.bits, self.code_bits = 8, code_bits
        plane = {"weight": self["weight"], "scales": self["scales"], "biases": self["biases"]}
        self.quant = quant_views([plane], (self.bits,), self.group_size, code_bits)
        if self.quant is None:
            return False
        # Only a layer the kernel takes: MLX's own quantized matmul is slower on fp16 scales.
        narrowed = (
            fp16_scales(plane["scales"], plane["biases"]) if current_route().quant_scales == "fp16" else None
        )
        if narrowed is not None:  # replaced, not copied: the fp32 ones are freed
            self.scales, self.biases = plane["scales"], plane["biases"] = narrowed
            self.scales_narrowed = True
            self.quant = quant_views([plane], (self.bits,), self.group_size, code_bits)
        return True

    def keep_dense(self) -> None:
        """Dequantize the weight once into the resident fp32 NumPy copy the route multiplies (not a
        parameter): panels for the panel kernel, else Wᵀ (nested_cpu.resident_copy)."""
        biases = self.get("biases")

        def weight_rows(r0: int, r1: int) -> np.ndarray:
            block = mx.dequantize(
                self["weight"][r0:r1],
                self["scales"][r0:r1],
                None if biases is None else biases[r0:r1],
                group_size=self.group_size,
                bits=self.bits,
                mode=self.mode,
            ).astype(mx.float32)
            return np.array(block)

        out_dims = self["weight"].shape[0]
        in_dims = self["weight"].shape[1] * 32 // self.bits
        self.dense = resident_copy(weight_rows, out_dims, in_dims)


class RowsQuantizedEmbedding(nn.QuantizedEmbedding):
    """nn.QuantizedEmbedding whose output-head product (`as_linear`, a tied head) takes the resident
    fp32 route like the linears; looking ids up stays MLX's own (a few rows dequantized)."""

    dense: np.ndarray | PanelWeight | None = None
    quant: QuantViews | None = None
    code_bits: int = 0  # as RowsQuantizedLinear's
    scales_narrowed: bool = False  # as RowsQuantizedLinear's

    def __call__(self, x: mx.array) -> mx.array:
        """The ids' rows, as fp32 as the model's other floats where keep_quantized narrowed the
        scales (MLX's lookup would dequantize them in fp16)."""
        if not self.scales_narrowed:
            return super().__call__(x)
        return mx.dequantize(
            self["weight"][x],
            self["scales"][x].astype(mx.float32),
            self["biases"][x].astype(mx.float32),
            group_size=self.group_size,
            bits=self.bits,
            mode=self.mode,
        )

    def as_linear(self, x: mx.array) -> mx.array:
        """x · Wᵀ: by the quantized kernel, or on the resident fp32 weight when the route keeps one,
        else MLX's quantized matmul (a scalar loop on x86 that cost SmolLM2-135M a third of its
        step, growing with the rows)."""
        if self.quant is not None and current_route().plain_linears == "quant-kernel":
            y = quant_matmul(x, self.quant.weights)
            if y is not None:
                return y
        if self.dense is not None and current_route().plain_linears == "resident-fp32":
            y = resident_dense_matmul(x, self.dense)
            if y is not None:
                return y
        return super().as_linear(x)

    keep_dense = RowsQuantizedLinear.keep_dense
    keep_quantized = RowsQuantizedLinear.keep_quantized


def _dense_linear(weight: mx.array, bias: mx.array | None) -> nn.Linear:
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    linear.weight = weight
    if bias is not None:
        linear.bias = bias
    return linear


class Q6KLinear(RowsQuantizedLinear):
    """A linear whose weight is a GGUF file's Q6_K blocks as stored (6.56 bits a weight), multiplied
    by the quantized kernel (quant_rows.c's q6k_rows); its parameters: `weight` (the blocks, uint8)
    and the linear's own bias. Taken only where the kernel is the route (use_q6k_blocks)."""

    in_dims: int = 0

    def __call__(self, x: mx.array) -> mx.array:
        """x · Wᵀ (+ bias): the kernel, or in mx.compile (where it is refused) the blocks' values in
        plain mx ops (also where tiles meet a route without integer activations)."""
        assert self.quant is not None, "a Q6_K linear always has its kernel view"
        if not self._tiled() or current_route().quant_activations == "int8":
            y = quant_matmul(x, self.quant.weights, self.get("bias"), self.int8_inputs)
            if y is not None:
                return y
        y = x @ self.stored_values().T.astype(x.dtype)
        return y if self.get("bias") is None else y + self["bias"]

    def _tiled(self) -> bool:
        return self.quant is not None and self.quant.weights[0].layout == Q6K_TILED

    def numpy_rows(self, xs: np.ndarray, decoding: bool) -> np.ndarray | None:
        """As RowsQuantizedLinear.numpy_rows; None where tiles meet a route without int8."""
        tiles_refused = self._tiled() and current_route().quant_activations != "int8"
        return None if tiles_refused else super().numpy_rows(xs, decoding)

    def stored_values(self) -> mx.array:
        """W as fp32 from its blocks (or their tiles), in plain mx ops."""
        if self._tiled():
            return q6k_tiled_values_mx(self["weight"], self.in_dims)
        return q6k_values_mx(self["weight"], self.in_dims)

    def dense_linear(self) -> nn.Linear:
        """The layer as a plain fp32 nn.Linear of its blocks' values (for mlx-lm's fp32 arm of the
        bench, whose dequantize_model reads MLX's affine triples only)."""
        return _dense_linear(self.stored_values(), self.get("bias"))

    def take_blocks(self, blocks: mx.array) -> None:
        """Hold the blocks in place of the layer's MLX affine weight (8-bit codes re-rounded from
        them by the converter), which is dropped unread where the model was loaded lazily; laid
        out as the kernel's tiles where it tiles them (quant_tiles.py: the same bytes)."""
        self.in_dims = self["weight"].shape[1] * 32 // self.bits
        self.code_bits = 6  # what nesting.source_bits reads as the source's width
        view = QuantWeight.from_q6k(blocks, self.in_dims)
        kernel = quant_kernel()
        route = current_route()
        if kernel is not None and kernel.tiled and route.quant_activations == "int8" and tiles_q6k(view):
            view = tiled_q6k_weight(kernel, view, route.blas_threads, in_place=True)
        self.quant = QuantViews((view,))
        self.weight = view.keep[0]
        for name in ("scales", "biases"):
            self.pop(name, None)


class TiledLinear(RowsQuantizedLinear):
    """A quantized linear on integer activations (4-bit codes, or codes held a byte each) whose codes,
    scales and biases are laid out once as the quantized kernel's tiles read them
    (kernels/quant_tiles.py): the same arrays' shapes and types, another order. Every pass goes
    through the tiles, so a check's rows cost little more than a step's. Taken only where the
    kernel is the route and tiles (take_tiles)."""

    def __call__(self, x: mx.array) -> mx.array:
        """x · Wᵀ (+ bias): the kernel, or where it is refused (mx.compile, another route) W's
        values in plain mx ops."""
        if self._on_tiles() and self.quant is not None:
            y = quant_matmul(x, self.quant.weights, self.get("bias"), self.int8_inputs)
            if y is not None:
                return y
        y = x @ self.stored_values().T.astype(x.dtype)
        return y if self.get("bias") is None else y + self["bias"]

    def _on_tiles(self) -> bool:
        # The tiles multiply int8 activations only: a route changed since load (exact) takes mx's.
        route = current_route()
        return (
            self.quant is not None
            and route.plain_linears == "quant-kernel"
            and route.quant_activations == "int8"
        )

    def numpy_rows(self, xs: np.ndarray, decoding: bool) -> np.ndarray | None:
        """As RowsQuantizedLinear.numpy_rows, on the tiles; None off them."""
        return super().numpy_rows(xs, decoding) if self._on_tiles() else None

    def int8_weight(self) -> QuantWeight | None:
        """As RowsQuantizedLinear.int8_weight, on the tiles; None off them."""
        return super().int8_weight() if self._on_tiles() else None

    def stored_values(self) -> mx.array:
        """W as fp32, from the tiles (for gears and the bench's fp32 arm, which read MLX's layout)."""
        return tiled_values_mx(self["weight"], self["scales"], self["biases"], self.group_size)

    def dense_linear(self) -> nn.Linear:
        """The layer as a plain fp32 nn.Linear (as Q6KLinear.dense_linear)."""
        return _dense_linear(self.stored_values(), self.get("bias"))

    def take_tiles(self) -> None:
        """Lay the layer's arrays out as tiles, replacing MLX's (freed: held once)."""
        assert self.quant is not None
        kernel = quant_kernel()
        assert kernel is not None, "a layer is tiled only where the kernel is"
        view = tiled_weight(kernel, self.quant.weights[0], current_route().blas_threads, in_place=True)
        self.weight, self.scales, self.biases = view.keep
        self.bits = view.bits  # 5 where 5-bit codes held a byte each became 5-bit tiles
        self.quant = QuantViews((view,))


class Q4KLinear(TiledLinear):
    """A linear whose weight is a GGUF file's Q4_K blocks as stored (4.5 bits a weight, where the
    converter's affine copy holds 5), laid out as the quantized kernel's tiles; its parameters:
    `weight` (the tiles, uint8) and the linear's own bias. Taken only where the kernel tiles and
    the layer's rows take integer activations (row_routes.use_k_blocks)."""

    in_dims: int = 0

    def stored_values(self) -> mx.array:
        """W as fp32 from its tiles, in plain mx ops."""
        return q4k_tiled_values_mx(self["weight"], self.in_dims)

    def take_q4k_blocks(self, blocks: mx.array) -> bool:
        """Hold the blocks, laid out as tiles in their own array, in place of the layer's affine
        weight (dropped unread where the model was loaded lazily); False where they do not tile."""
        kernel = quant_kernel()
        assert kernel is not None, "Q4_K blocks are taken only where the kernel is"
        in_dims = self["weight"].shape[1] * 32 // self.bits
        view = tiled_q4k_weight(kernel, blocks, in_dims, current_route().blas_threads)
        if view is None:
            return False
        self.in_dims, self.code_bits = in_dims, 4
        self.quant = QuantViews((view,))
        self.weight = view.keep[0]
        for name in ("scales", "biases"):
            self.pop(name, None)
        return True
