"""Nesting a model: every linear layer replaced by a NestedLinear (gears.py), one GearState shared,
and the rules that choose and keep the planes: the plane widths a list of gears asks for, the
widths worth building from a source of a given precision, and the dtypes a nested model holds so
that a saved one computes the same.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn

from ..errors import ModelFormatError, UsageError
from .arrays import flat_parameters
from .gears import (
    DEFAULT_GROUP_SIZE,
    DEFAULT_PLANE_BITS,
    HALF_DTYPES,
    OTHER_DTYPE,
    STORAGE_DTYPE,
    SUPPORTED_PLANE_BITS,
    GearState,
    NestedLinear,
)
from .row_routes import mark_int8_inputs


def plane_bits_for(gears: tuple[int, ...]) -> tuple[int, ...]:
    """Plane widths that give these cumulative gears: (4, 8, 16) → (4, 4, 8)."""
    planes = tuple(b - a for a, b in zip((0,) + tuple(gears), gears, strict=False))  # one shorter by design
    bad = [p for p in planes if p not in SUPPORTED_PLANE_BITS]
    if bad or list(gears) != sorted(set(gears)):
        raise UsageError(
            f"gears {','.join(map(str, gears))} need planes of "
            f"{','.join(map(str, planes))} bits; each plane must be one of "
            f"{', '.join(map(str, SUPPORTED_PLANE_BITS))}"
        )
    return planes


def source_bits(model: nn.Module) -> int | None:
    """Bits of the source's linear weights when all were quantized (the widest); None if any is float."""
    state = getattr(model, "gear_state", None)
    if state is not None:  # already nested: the source was recorded then
        return state.source_bits
    # A CPU load widens narrow codes to bytes (rows.py): code_bits keeps the source's width.
    bits = [
        (getattr(m, "code_bits", 0) or m.bits) if isinstance(m, nn.QuantizedLinear) else None
        for _, m in linear_layers(model)
    ]
    widths = [b for b in bits if b is not None]
    return None if not bits or len(widths) < len(bits) else max(widths)


def honest_plane_bits(source_bits: int | None) -> tuple[int, ...]:
    """Planes worth building from a source of `source_bits` (None: float): top gear ≈ the source, no more."""
    if source_bits is None or source_bits >= 16:
        return DEFAULT_PLANE_BITS
    # Measured on SmolLM2-135M Q4_1 (NLL/token on 255 tokens; source 4.086): planes 4+4 give
    # g4 4.306 (a lossy re-quantization) and g8 4.086 (the source again); 2+2 give g2 9.91
    # (unusable) and g4 4.52; 3+1 give g3 5.03, g4 6.48. So: a usable 4-bit gear plus one
    # 4-bit residual plane that reproduces the source; a third plane would only add bytes.
    return (min(source_bits, 4), 4)


def linear_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(name, m) for name, m in model.named_modules() if isinstance(m, (nn.Linear, nn.QuantizedLinear))]


def replace_module(root: nn.Module, name: str, new: nn.Module) -> None:
    # One layer at a time, so a source layer is freed as soon as its planes exist (peak memory).
    *path, leaf = name.split(".")
    parent = root
    for part in path:
        parent = parent[int(part)] if isinstance(parent, list) else parent[part]
    if isinstance(parent, list):
        parent[int(leaf)] = new
    else:
        setattr(parent, leaf, new)


def nest_model(
    model: nn.Module,
    plane_bits: tuple[int, ...] = DEFAULT_PLANE_BITS,
    group_size: int = DEFAULT_GROUP_SIZE,
    progress: Callable[[int, int], None] | None = None,
    scale_dtype: mx.Dtype | None = STORAGE_DTYPE,
) -> GearState:
    """Replace every linear layer (attention, MLP, untied head) by a NestedLinear sharing one GearState."""
    # The embedding is left alone (a tied head reads it). With a half scale_dtype every float
    # tensor ends up exactly as `save_geared` stores it, so a saved model computes the same.
    if getattr(model, "gear_state", None) is not None:
        raise UsageError(f"the model is already nested (gears {model.gear_state.gears}); load it afresh")
    state = GearState(plane_bits, source_bits(model))
    layers = linear_layers(model)
    dtype = activation_dtype(model)
    total = len(layers)
    for done in range(1, total + 1):
        name, layer = layers.pop(0)  # hold no reference: the source layer is freed once replaced
        try:
            nested = NestedLinear.from_linear(layer, plane_bits, group_size, state, scale_dtype, dtype)
        except ModelFormatError as exc:
            raise ModelFormatError(f"layer {name}: {exc}") from None
        replace_module(model, name, nested)
        del layer
        if progress:
            progress(done, total)
    if scale_dtype in HALF_DTYPES:
        _round_other_floats(model)
    mark_int8_inputs(model)  # the nested linears replaced the ones a load marked
    model.gear_state = state  # a plain attribute of the model: not a parameter
    return state


def exact_dtype(value: mx.array, preferred: tuple[mx.Dtype, ...]) -> mx.Dtype | None:
    """The first of `preferred` that holds `value` exactly, if any."""
    for dtype in preferred:
        if mx.array_equal(value.astype(dtype).astype(value.dtype), value).item():
            return dtype
    return None


def _round_other_floats(model: nn.Module) -> None:
    # What runs is what gets saved: float tensors outside the planes are rounded once to bf16.
    rounded = [
        (k, v.astype(OTHER_DTYPE).astype(v.dtype))
        for k, v in flat_parameters(model)
        if ".planes." not in k and mx.issubdtype(v.dtype, mx.floating) and exact_dtype(v, HALF_DTYPES) is None
    ]
    if rounded:
        model.load_weights(rounded, strict=False)
        mx.eval(model.parameters())


def activation_dtype(model: nn.Module) -> mx.Dtype:
    """The float dtype the model computes in (its norms' dtype): scales must match it."""
    for name, value in flat_parameters(model):
        if name.endswith("norm.weight"):
            return value.dtype
    return mx.float32
