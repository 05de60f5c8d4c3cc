"""Which CPU route each plain quantized linear of a loaded model takes (models/rows.py holds the
layers): decided once, at load, from the route (kernels/route.py): on the quantized kernel's
stored codes (laid out as its tiles where it tiles them, Q6_K blocks as stored), on resident fp32
copies where those fit, or MLX's own modules (a GPU)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from ..kernels import quant_cpu
from ..kernels.quant_cpu import int8_applies, int8_inputs, quant_kernel, wide_applies
from ..kernels.quant_weights import Q4K_BYTES, Q4K_VALUES
from ..kernels.route import current_route
from .cpu_blocks import use_numpy_blocks
from .machine import available_memory_bytes
from .rows import Q4KLinear, Q6KLinear, RowsQuantizedEmbedding, RowsQuantizedLinear, TiledLinear


def tiles_layer(module: nn.Module) -> bool:
    """Whether a plain linear on the kernel is laid out as tiles: the layer takes integer
    activations (int8, or int16 where it refuses int8: a down projection; quant_cpu.int8_applies,
    wide_applies) and the kernel tiles its weight (QuantKernel.tiles: an AVX2 or AVX-512 build)."""
    kernel = quant_kernel()
    if kernel is None or module.quant is None or len(module.quant.weights) != 1:
        return False
    view = module.quant.weights[0]
    integer = int8_applies(view) if module.int8_inputs else wide_applies(view)  # int8 rows, or int16
    wide = not module.int8_inputs
    return current_route().quant_activations == "int8" and integer and kernel.tiles(view, wide)


# A decoder block's q, k and v (and gate and up) are multiplied in one kernel call on the CPU
# (cpu_blocks.py, kernels/quant_packs.py), which takes affine weights: a Q6_K one there keeps them.
PACKED_LINEARS = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")


def use_k_blocks(model: nn.Module, blocks: dict[str, mx.array]) -> int:
    """Give every plain quantized linear named in `blocks` (a converted GGUF's Q6_K and Q4_K
    tensors, by module path) its blocks as stored, where the quantized kernel is the route: Q6_K
    where the linear does not share a kernel call, Q4_K where the kernel tiles and the layer's rows
    take integer activations (q4k_applies); how many took them. Before the model's parameters are
    evaluated: the affine weights they replace are then never read."""
    if current_route().plain_linears != "quant-kernel":
        return 0
    taken = 0
    for name, module in model.named_modules():
        found = blocks.pop(name, None)  # not held past its layer: tiles replace it
        if found is None or type(module) is not nn.QuantizedLinear:
            continue
        in_dims = module["weight"].shape[1] * 32 // module.bits
        if found.shape[1] == in_dims // Q4K_VALUES * Q4K_BYTES:
            if q4k_applies(in_dims):
                module.__class__ = Q4KLinear
                if module.take_q4k_blocks(found):
                    taken += 1
                else:
                    module.__class__ = nn.QuantizedLinear
        elif name.rsplit(".", 1)[-1] not in PACKED_LINEARS:
            module.__class__ = Q6KLinear
            module.take_blocks(found)
            taken += 1
    return taken


def q4k_applies(in_dims: int) -> bool:
    """Whether a Q4_K linear of `in_dims` inputs is read as stored: its rows take integer
    activations (quant_cpu.int8_applies: int8, or int16 where a down projection's) and this build
    multiplies tiles; elsewhere it keeps the converter's affine copy."""
    route = current_route()
    kernel = quant_kernel() if route.quant_activations == "int8" else None
    return kernel is not None and kernel.tiled and in_dims >= quant_cpu.INT8_MIN_INPUTS


def _tied_head(model: nn.Module) -> nn.QuantizedEmbedding | None:
    """The quantized embedding that is also the output head (mlx-lm models without an lm_head)."""
    if getattr(model, "lm_head", None) is not None:
        return None
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    return embed if type(embed) is nn.QuantizedEmbedding else None


DENSE_SHARE = 0.5  # of the available memory, what one model's fp32 copies may take


def keeps_dense_weights(params: int) -> bool:
    """Whether a model's plain quantized linears (`params` weights) get resident fp32 copies: where
    the route says so (a CPU with NumPy routes), when the copies fit (a 7B would need 28 GB: it
    keeps its planes only)."""
    return (
        current_route().plain_linears == "resident-fp32"
        and 4 * params <= DENSE_SHARE * available_memory_bytes()
    )


def mark_int8_inputs(model: nn.Module) -> None:
    """Mark the linears whose rows may not be rounded to int8 (quant_cpu.int8_inputs: a down
    projection's, or rows too narrow), read by our linears and nested gears once they take over:
    at load, and again once a model is nested into gears (its linears replaced)."""
    for name, module in model.named_modules():
        if not int8_inputs(name, _input_dims(module)):
            module.int8_inputs = False  # a plain attribute: never a parameter


def _input_dims(module: nn.Module) -> int | None:
    """A linear's input width (a quantized one's, a nested gear's first plane's), else None."""
    if getattr(module, "in_dims", 0):  # a layer holding K-quant blocks, whose weight is not MLX's
        return module.in_dims
    if isinstance(module, nn.QuantizedLinear):
        return module["weight"].shape[1] * 32 // module.bits
    if isinstance(module, nn.Linear):
        return module["weight"].shape[1]
    planes = getattr(module, "planes", None)  # a NestedLinear (models/gears.py)
    if planes:
        return planes[0]["weight"].shape[1] * 32 // module.plane_bits[0]
    return None


def use_fast_rows(model: nn.Module) -> str:
    """Give every plain nn.QuantizedLinear the CPU routes; which route its linears took:
    "mlx-module" (the route keeps MLX's own: a GPU), "quant-kernel" (multiplied on the stored
    codes), "resident-fp32" (fp32 copies kept), "rows" (the planes only: no NumPy route, or the
    copies do not fit) or "none" (no plain layer)."""
    route = current_route().plain_linears
    if route == "mlx-module":
        return "mlx-module"
    if current_route().numpy_allowed:
        use_numpy_blocks(model)  # attention and the MLP's activation in NumPy (cpu_blocks.py)
    mark_int8_inputs(model)
    plain: list[nn.Module] = [m for _, m in model.named_modules() if type(m) is nn.QuantizedLinear]
    head = _tied_head(model)
    if not plain and not any(isinstance(m, (Q6KLinear, TiledLinear)) for _, m in model.named_modules()):
        return "none"  # (every one read as stored, use_k_blocks: the head below still takes the kernel)
    if route == "quant-kernel":
        # Only the exact class: a subclass (or another library's layer) keeps its own __call__.
        # Changing the class leaves the parameters, and so loading and saving, untouched.
        taken = 0
        for module in plain:
            module.__class__ = RowsQuantizedLinear
            kept = module.keep_quantized()
            if kept and tiles_layer(module):
                module.__class__ = TiledLinear
                module.take_tiles()
            taken += kept
        if head is not None:
            head.__class__ = RowsQuantizedEmbedding
            head.keep_quantized()
        # A layer the kernel cannot take (another mode, an odd group) keeps the multi-row route.
        return "quant-kernel" if taken == len(plain) else "rows"
    dense = keeps_dense_weights(sum(m.weight.size * 32 // m.bits for m in plain + ([head] if head else [])))
    for module in plain:
        # Only the exact class: a subclass (or another library's layer) keeps its own __call__.
        # Changing the class leaves the parameters, and so loading and saving, untouched.
        module.__class__ = RowsQuantizedLinear
        if dense:
            module.keep_dense()
    if head is not None and dense:
        head.__class__ = RowsQuantizedEmbedding
        head.keep_dense()
    return "resident-fp32" if dense else "rows"
