"""Nested gears: one model, every precision. Residual planes q(W), q(W − W₁), … in MLX's affine format.

Gear k multiplies with the first k planes (a sum of `mx.quantized_matmul` calls), so all gears
stay resident in about the footprint of the largest, and a gear change is one attribute write.
Gears are named by the bits a weight costs to read: planes 4/4/8 give gears 4, 8 and 16.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from .errors import ModelFormatError, UsageError

DEFAULT_PLANE_BITS = (4, 4, 8)
DEFAULT_GROUP_SIZE = 64
SUPPORTED_PLANE_BITS = (2, 3, 4, 5, 6, 8)
# bf16 keeps the range of fp32: the last plane's scales (~1e-7) would underflow in fp16.
STORAGE_DTYPE = mx.bfloat16


class GearState:
    """The one switch every nested layer of a model reads: how many planes are active."""

    def __init__(self, plane_bits: tuple[int, ...]):
        self.plane_bits = tuple(plane_bits)
        self.gears = tuple(sum(self.plane_bits[: i + 1]) for i in range(len(self.plane_bits)))
        self.active_planes = len(self.plane_bits)

    @property
    def gear(self) -> int:
        """Bits per weight read at the current gear."""
        return self.gears[self.active_planes - 1]

    def set(self, gear: int) -> None:
        """Switch every nested layer to `gear` (O(1): no arrays are touched)."""
        if gear not in self.gears:
            raise UsageError(f"gear {gear} is not built; this model has gears "
                             f"{', '.join(map(str, self.gears))}")
        self.active_planes = self.gears.index(gear) + 1


class NestedLinear(nn.Module):
    """A linear layer whose weight is a sum of quantized residual planes; the GearState picks how many."""

    def __init__(self, planes: list[dict], plane_bits: tuple[int, ...], group_size: int,
                 switch: GearState, bias: mx.array | None = None):
        super().__init__()
        self.planes = planes
        self.plane_bits = tuple(plane_bits)
        self.group_size = group_size
        self.switch = switch  # a plain attribute: not a parameter, never saved
        if bias is not None:
            self.bias = bias

    @classmethod
    def from_weight(cls, weight: mx.array, plane_bits: tuple[int, ...], group_size: int,
                    switch: GearState, bias: mx.array | None = None,
                    scale_dtype: mx.Dtype = mx.float32) -> "NestedLinear":
        """Quantize W, then each residual, against scales rounded to their storage dtype."""
        residual = weight.astype(mx.float32)
        planes = []
        for bits in plane_bits:
            q, scales, biases = mx.quantize(residual, group_size=group_size, bits=bits)
            # Round scales/biases to how they are stored, so the next plane corrects that too.
            scales = scales.astype(STORAGE_DTYPE).astype(mx.float32)
            biases = biases.astype(STORAGE_DTYPE).astype(mx.float32)
            residual = residual - mx.dequantize(q, scales, biases, group_size=group_size, bits=bits)
            planes.append({"weight": q, "scales": scales.astype(scale_dtype),
                           "biases": biases.astype(scale_dtype)})
            mx.eval(residual, planes[-1])
        return cls(planes, plane_bits, group_size, switch, bias)

    @classmethod
    def skeleton(cls, out_dims: int, in_dims: int, plane_bits: tuple[int, ...], group_size: int,
                 switch: GearState, has_bias: bool, dtype: mx.Dtype) -> "NestedLinear":
        """Placeholders of the right shapes, for loading saved planes without re-quantizing."""
        planes = [{"weight": mx.zeros((out_dims, in_dims * bits // 32), dtype=mx.uint32),
                   "scales": mx.zeros((out_dims, in_dims // group_size), dtype=dtype),
                   "biases": mx.zeros((out_dims, in_dims // group_size), dtype=dtype)}
                  for bits in plane_bits]
        return cls(planes, plane_bits, group_size, switch, mx.zeros((out_dims,)) if has_bias else None)

    def dequantized(self, planes: int | None = None) -> mx.array:
        """The weight the first `planes` planes represent (all of them by default)."""
        count = planes or len(self.planes)
        return sum(mx.dequantize(p["weight"], p["scales"], p["biases"], group_size=self.group_size,
                                 bits=bits)
                   for p, bits in zip(self.planes[:count], self.plane_bits[:count]))

    def __call__(self, x: mx.array) -> mx.array:
        out = None
        for plane, bits in zip(self.planes[: self.switch.active_planes], self.plane_bits):
            y = mx.quantized_matmul(x, plane["weight"], plane["scales"], plane["biases"],
                                    transpose=True, group_size=self.group_size, bits=bits)
            out = y if out is None else out + y
        if "bias" in self:
            out = out + self.bias
        return out


def plane_bits_for(gears: tuple[int, ...]) -> tuple[int, ...]:
    """Plane widths that give these cumulative gears: (4, 8, 16) → (4, 4, 8)."""
    planes = tuple(b - a for a, b in zip((0,) + tuple(gears), gears))
    bad = [p for p in planes if p not in SUPPORTED_PLANE_BITS]
    if bad or list(gears) != sorted(set(gears)):
        raise UsageError(f"gears {','.join(map(str, gears))} need planes of "
                         f"{','.join(map(str, planes))} bits; each plane must be one of "
                         f"{', '.join(map(str, SUPPORTED_PLANE_BITS))}")
    return planes


def source_bits(model: nn.Module) -> int | None:
    """Bits of the source's linear weights when it was already quantized (None for float)."""
    for _, module in model.named_modules():
        if isinstance(module, nn.QuantizedLinear):
            return module.bits
        if isinstance(module, nn.Linear):
            return None
    return None


def _linear_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(name, m) for name, m in model.named_modules()
            if isinstance(m, (nn.Linear, nn.QuantizedLinear))]


def _source_weight(layer: nn.Module) -> mx.array:
    if isinstance(layer, nn.QuantizedLinear):
        return mx.dequantize(layer.weight, layer.scales, layer.biases, group_size=layer.group_size,
                             bits=layer.bits)
    return layer.weight


def nest_model(model: nn.Module, plane_bits: tuple[int, ...] = DEFAULT_PLANE_BITS,
               group_size: int = DEFAULT_GROUP_SIZE,
               progress: Callable[[int, int], None] | None = None) -> GearState:
    """Replace every linear layer (attention, MLP, untied head) by a NestedLinear sharing one GearState."""
    switch = GearState(plane_bits)
    layers = _linear_layers(model)
    scale_dtype = activation_dtype(model)
    replacements = []
    for done, (name, layer) in enumerate(layers, 1):
        weight = _source_weight(layer)
        if weight.shape[-1] % group_size:
            raise ModelFormatError(f"layer {name} has {weight.shape[-1]} inputs, not a multiple of "
                                   f"the group size {group_size}; choose another --group-size")
        bias = layer.bias if "bias" in layer else None
        replacements.append((name, NestedLinear.from_weight(weight, plane_bits, group_size, switch,
                                                            bias, scale_dtype)))
        if progress:
            progress(done, len(layers))
    model.update_modules(tree_unflatten(replacements))
    _round_to_half(model)
    model.gear_state = switch
    return switch


def _half_dtype(value: mx.array) -> mx.Dtype | None:
    """The half-precision dtype that holds `value` exactly, if any."""
    for dtype in (mx.float16, mx.bfloat16):
        if mx.array_equal(value.astype(dtype).astype(value.dtype), value).item():
            return dtype
    return None


def _round_to_half(model: nn.Module) -> None:
    # What runs is what gets saved: other float tensors are rounded once, as a bf16 copy would be.
    rounded = [(k, v.astype(mx.bfloat16).astype(v.dtype)) for k, v in tree_flatten(model.parameters())
               if mx.issubdtype(v.dtype, mx.floating) and _half_dtype(v) is None]
    if rounded:
        model.load_weights(rounded, strict=False)
        mx.eval(model.parameters())


def activation_dtype(model: nn.Module) -> mx.Dtype:
    """The float dtype the model computes in (its norms' dtype): scales must match it."""
    for name, value in tree_flatten(model.parameters()):
        if name.endswith("norm.weight"):
            return value.dtype
    return mx.float32


def resident_bytes(model: nn.Module) -> int:
    """Bytes of every parameter the model holds (all gears)."""
    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


def bytes_per_token(model: nn.Module, gear: int | None = None) -> int:
    """Bytes of weights read to decode one token (at `gear` for a nested model).

    Only the active planes count; a tied output head reads the whole embedding matrix, an
    untied input embedding one row.
    """
    switch: GearState | None = getattr(model, "gear_state", None)
    active = switch.gears.index(gear) + 1 if switch is not None and gear is not None else None
    params = tree_flatten(model.parameters())
    tied = not any(name.startswith("lm_head") for name, _ in params)
    total = 0
    for name, value in params:
        parts = name.split(".")
        if "planes" in parts and active is not None:
            total += value.nbytes if int(parts[parts.index("planes") + 1]) < active else 0
        elif "embed_tokens" in parts and not tied:
            total += value.nbytes // value.shape[0]
        else:
            total += value.nbytes
    return total


@dataclass(frozen=True)
class GearReport:
    """What a nested model holds and reads, for `models`, `doctor`, the build and the telemetry."""

    gears: tuple[int, ...]
    plane_bits: tuple[int, ...]
    group_size: int
    source_bits: int | None
    resident_bytes: int
    bytes_per_token: dict[int, int]

    def honesty_note(self) -> str:
        """Which gears add precision beyond the source (never claim more than it has)."""
        if self.source_bits is None:
            return "built from a float source: every gear is real precision"
        above = [g for g in self.gears if g > self.source_bits]
        if not above:
            return f"source is {self.source_bits}-bit: all gears are at or below it"
        return (f"source is {self.source_bits}-bit: gears {', '.join(map(str, above))} only reproduce "
                f"the source more exactly, they add no precision beyond {self.source_bits} bits")

    def lines(self) -> list[str]:
        """Human-readable lines."""
        out = [f"gears {'/'.join(map(str, self.gears))} (planes {'+'.join(map(str, self.plane_bits))} "
               f"bits, group {self.group_size}); resident {self.resident_bytes / 1e6:.1f} MB"]
        out += [f"  g{g}: {b / 1e6:.1f} MB read per token" for g, b in self.bytes_per_token.items()]
        out.append(self.honesty_note())
        return out


def gear_report(model: nn.Module, source: int | None) -> GearReport:
    """Resident bytes and per-gear bytes read of a nested model."""
    switch: GearState = model.gear_state
    return GearReport(switch.gears, switch.plane_bits, _group_size(model), source,
                      resident_bytes(model), {g: bytes_per_token(model, g) for g in switch.gears})


def _group_size(model: nn.Module) -> int:
    for _, module in model.named_modules():
        if isinstance(module, NestedLinear):
            return module.group_size
    return DEFAULT_GROUP_SIZE


# -- loading, building, saving ------------------------------------------------------------------

def prepare_geared(loaded, gears: tuple[int, ...], progress: Callable[[str], None] | None = None):
    """Make a loaded model geared (nesting it in memory unless it was saved nested); return it."""
    say = progress or (lambda message: None)
    model = loaded.model
    if getattr(model, "gear_state", None) is None:
        bits = source_bits(model)
        planes = plane_bits_for(tuple(gears))
        nest_model(model, planes, DEFAULT_GROUP_SIZE,
                   progress=lambda done, total: say(f"building gears {done}/{total} layers"))
        loaded.config["mlxswitch_gears"] = {"plane_bits": list(planes), "group_size": DEFAULT_GROUP_SIZE,
                                            "source_bits": bits}
    missing = [g for g in gears if g not in model.gear_state.gears]
    if missing:
        raise UsageError(f"model {loaded.source} has gears {', '.join(map(str, model.gear_state.gears))}; "
                         f"gear(s) {', '.join(map(str, missing))} are not among them")
    loaded.precision = gear_report(model, loaded.config["mlxswitch_gears"].get("source_bits")).honesty_note()
    return loaded


def build_and_save(source: str, out: Path, plane_bits: tuple[int, ...] | None = None,
                   group_size: int = DEFAULT_GROUP_SIZE) -> list[str]:
    """Load `source`, nest it and save safetensors + config + tokenizer in `out`."""
    from .loading import load_model

    loaded = load_model(source)
    bits = source_bits(loaded.model)
    planes = tuple(plane_bits or DEFAULT_PLANE_BITS)
    plane_bits_for(tuple(sum(planes[: i + 1]) for i in range(len(planes))))  # validates widths
    nest_model(loaded.model, planes, group_size)
    report = gear_report(loaded.model, bits)
    save_geared(loaded, out, planes, group_size, bits)
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    return [f"built {out} from {source}", *report.lines(), f"saved {size / 1e6:.1f} MB"]


def save_geared(loaded, out: Path, plane_bits: tuple[int, ...], group_size: int,
                source: int | None) -> None:
    """Write model.safetensors (planes, half-precision scales), config.json and the tokenizer."""
    out.mkdir(parents=True, exist_ok=True)
    weights = {}
    for name, value in tree_flatten(loaded.model.parameters()):
        # Lossless: nesting left every float tensor exactly representable in a half dtype.
        half = _half_dtype(value) if mx.issubdtype(value.dtype, mx.floating) else None
        weights[name] = value.astype(half) if half is not None else value
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    # The source's quantization keys describe the GGUF file, not these planes.
    config = {k: v for k, v in loaded.config.items() if k not in ("quantization_label", "quantization")}
    embedding = loaded.model.model.embed_tokens if hasattr(loaded.model, "model") else None
    config["mlxswitch_gears"] = {
        "plane_bits": list(plane_bits), "group_size": group_size, "source_bits": source,
        "source": loaded.source,
        "embedding": ({"bits": embedding.bits, "group_size": embedding.group_size}
                      if isinstance(embedding, nn.QuantizedEmbedding) else None),
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    loaded.tokenizer._tokenizer.save_pretrained(str(out))


def load_geared_dir(source: str, path: Path, name: str):
    """Load a saved nested-gear model without re-quantizing."""
    from mlx_lm.utils import _get_classes, load_tokenizer

    from .loading import LoadedModel, compute_dtype, load_checked_weights

    config = json.loads((path / "config.json").read_text())
    spec = config["mlxswitch_gears"]
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    if spec.get("embedding"):
        nn.quantize(model, class_predicate=lambda _, m: isinstance(m, nn.Embedding) and spec["embedding"])
    dtype = compute_dtype() or STORAGE_DTYPE
    switch = GearState(tuple(spec["plane_bits"]))
    skeletons = [(layer_name, NestedLinear.skeleton(
                    layer.weight.shape[0], layer.weight.shape[1], switch.plane_bits, spec["group_size"],
                    switch, "bias" in layer, dtype))
                 for layer_name, layer in _linear_layers(model)]
    model.update_modules(tree_unflatten(skeletons))
    if config.get("rope_freqs"):
        from .gguf import use_rope_factors

        use_rope_factors(model, config, mx.array(config["rope_freqs"]), path)
    load_checked_weights(model, mx.load(str(path / "model.safetensors")), dtype,
                         f"model '{source}': saved gears do not fit its config")
    model.gear_state = switch
    tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    loaded = LoadedModel(source, name, model, tokenizer, config)
    loaded.precision = gear_report(model, spec.get("source_bits")).honesty_note()
    return loaded


def copy_tokenizer_files(src: Path, out: Path) -> None:
    """Copy an mlx-lm directory's tokenizer files next to saved planes."""
    for pattern in ("tokenizer*", "special_tokens_map.json", "*.jinja", "vocab.json", "merges.txt"):
        for file in src.glob(pattern):
            shutil.copy(file, out / file.name)
