"""Nested-gear models: made from a loaded model, saved losslessly, loaded back without
re-quantizing, and reported (what they hold and read per token)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import EllipsisType

import mlx.core as mx
import mlx.nn as nn

from ..errors import ModelFormatError, ModelNotFoundError, OutputError, UsageError
from ..files import atomic_dir
from .arrays import flat_parameters, load_arrays
from .gears import DEFAULT_GROUP_SIZE, HALF_DTYPES, OTHER_DTYPE, STORAGE_DTYPE, GearState, NestedLinear
from .gguf import use_rope_factors
from .model_bytes import bytes_per_token, resident_bytes
from .nesting import (
    exact_dtype,
    honest_plane_bits,
    linear_layers,
    nest_model,
    plane_bits_for,
    replace_module,
    source_bits,
)
from .row_routes import use_fast_rows
from .weights import LoadedModel, compute_dtype, load_checked_weights, model_classes


def save_geared(model: nn.Module, config: dict, out_dir: Path, scale_dtype: mx.Dtype = STORAGE_DTYPE) -> Path:
    """Write model.safetensors (planes; half-precision scales) and config.json (+ "mlxswitch_gears").

    Lossless: each float tensor goes out in the first of scale_dtype (planes) / bf16 (the rest)
    and the other half dtype that holds it exactly, else in float32 — so nest with the same
    scale_dtype to get half-size scales. Tokenizer files are the caller's.
    """
    state: GearState = model.gear_state
    if any(isinstance(m, NestedLinear) and m.planes_tiled for _, m in model.named_modules()):
        raise UsageError(
            "this geared model has decoded on the CPU, which laid its planes out as tiles; "
            "save a model before it decodes (mlxswitch gears build)"
        )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = {}
    for name, value in flat_parameters(model):
        if mx.issubdtype(value.dtype, mx.floating):
            first = scale_dtype if ".planes." in name else OTHER_DTYPE
            value = value.astype(exact_dtype(value, (first, *HALF_DTYPES)) or mx.float32)
        weights[name] = value
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights)
    # The source's quantization keys describe the source's tensors, not these planes.
    saved = {
        k: v
        for k, v in config.items()
        if k not in ("quantization", "quantization_config", "quantization_label")
    }
    embedding = next((m for _, m in model.named_modules() if isinstance(m, nn.QuantizedEmbedding)), None)
    saved["mlxswitch_gears"] = {
        **config.get("mlxswitch_gears", {}),
        "plane_bits": list(state.plane_bits),
        "group_size": plane_group_size(model),
        "source_bits": state.source_bits,
        "embedding": (
            {"bits": embedding.bits, "group_size": embedding.group_size, "mode": embedding.mode}
            if embedding is not None
            else None
        ),
    }
    (out_dir / "config.json").write_text(json.dumps(saved, indent=2))
    return out_dir


def load_geared(out_dir: Path, float_dtype: mx.Dtype | None = None) -> tuple[nn.Module, dict]:
    """Rebuild a saved nested model without re-quantizing; floats cast to float_dtype (fp32 on CPU)."""
    path = Path(out_dir)
    if not (path / "config.json").exists() or not (path / "model.safetensors").exists():
        raise ModelNotFoundError(f"{path}: no saved nested-gear model (config.json, model.safetensors)")
    config = json.loads((path / "config.json").read_text())
    spec = config.get("mlxswitch_gears")
    if not spec:
        raise ModelFormatError(f"{path}: config.json has no mlxswitch_gears section")
    # One dtype for everything: quantized_matmul promotes mixed fp16/bf16 scales to fp32.
    dtype = float_dtype or compute_dtype() or OTHER_DTYPE
    model_class, args_class = model_classes(config, str(path))
    model = model_class(args_class.from_dict(config))
    if spec.get("embedding"):
        nn.quantize(model, class_predicate=lambda _, m: isinstance(m, nn.Embedding) and spec["embedding"])
    state = GearState(tuple(spec["plane_bits"]), spec.get("source_bits"))
    for name, layer in linear_layers(model):
        replace_module(
            model,
            name,
            NestedLinear.skeleton(
                layer.weight.shape[0],
                layer.weight.shape[1],
                state.plane_bits,
                spec["group_size"],
                state,
                "bias" in layer,
                dtype,
            ),
        )
    if config.get("rope_freqs"):
        use_rope_factors(model, config, mx.array(config["rope_freqs"]), path)
    weights = load_arrays(str(path / "model.safetensors"))
    load_checked_weights(model, weights, dtype, f"{path}: saved gears do not fit its config")
    model.gear_state = state
    use_fast_rows(model)  # the CPU's NumPy blocks, as every other load takes them
    return model, config


def load_geared_dir(source: str, path: Path, name: str):
    """A saved nested-gear directory as a LoadedModel (model, tokenizer, config, precision note)."""
    from mlx_lm.utils import load_tokenizer

    model, config = load_geared(path)
    tokenizer = load_tokenizer(Path(path), eos_token_ids=config.get("eos_token_id"))
    return LoadedModel(source, name, model, tokenizer, config, precision=gear_report(model).honesty_note())


def check_writable_dir(out: Path, force: bool) -> None:
    """Refuse an output directory that is a file, or holds files and `force` is not given."""
    out = Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UsageError(f"--out {out}: the directory is not empty; use --force to replace it")
    ancestor = out.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputError(f"cannot write {out}: {ancestor} is not a directory")


def build_geared(
    loaded: LoadedModel,
    out: Path,
    plane_bits: tuple[int, ...] | None = None,
    group_size: int = DEFAULT_GROUP_SIZE,
    force: bool = False,
) -> list[str]:
    """Nest a loaded model (default planes: honest for its source) and save it with its tokenizer.

    Written under a temporary name beside `out` and renamed at the end, so a failure (a full
    disk, Ctrl-C) leaves nothing behind; a non-empty `out` is replaced only with `force`.
    """
    out = Path(out).expanduser()
    check_writable_dir(out, force)
    planes = tuple(plane_bits or honest_plane_bits(source_bits(loaded.model)))
    plane_bits_for(tuple(sum(planes[: i + 1]) for i in range(len(planes))))  # validates widths
    with atomic_dir(out, replace=True) as staging:
        nest_model(loaded.model, planes, group_size)
        save_geared(loaded.model, {**loaded.config, "mlxswitch_gears": {"source": loaded.source}}, staging)
        loaded.tokenizer.save_pretrained(str(staging))  # the wrapper forwards to the HF tokenizer
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    return [
        f"built {out} from {loaded.source}",
        *gear_report(loaded.model).lines(),
        f"saved {size / 1e6:.1f} MB",
    ]


# -- in memory, and the report ------------------------------------------------------------------


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
        return (
            f"source is {self.source_bits}-bit: gears {', '.join(map(str, above))} only reproduce "
            f"the source more exactly, they add no precision beyond {self.source_bits} bits"
        )

    def lines(self) -> list[str]:
        """Human-readable lines."""
        out = [
            f"gears {'/'.join(map(str, self.gears))} (planes {'+'.join(map(str, self.plane_bits))} "
            f"bits, group {self.group_size}); resident {self.resident_bytes / 1e6:.1f} MB"
        ]
        out += [f"  g{g}: {b / 1e6:.1f} MB read per token" for g, b in self.bytes_per_token.items()]
        out.append(self.honesty_note())
        return out


def gear_report(model: nn.Module, source: int | None | EllipsisType = ...) -> GearReport:
    """Resident bytes and per-gear bytes read of a nested model (source bits: as recorded)."""
    state: GearState = model.gear_state
    source = state.source_bits if source is ... else source
    return GearReport(
        state.gears,
        state.plane_bits,
        plane_group_size(model),
        source,
        resident_bytes(model),
        {g: bytes_per_token(model, g) for g in state.gears},
    )


def plane_group_size(model: nn.Module) -> int:
    for _, module in model.named_modules():
        if isinstance(module, NestedLinear):
            return module.group_size
    return DEFAULT_GROUP_SIZE


def prepare_geared(loaded, gears: tuple[int, ...], progress: Callable[[str], None] | None = None):
    """Make a loaded model geared (nesting it in memory unless it was saved nested); return it."""
    say = progress or (lambda message: None)
    model = loaded.model
    if getattr(model, "gear_state", None) is None:
        planes = plane_bits_for(tuple(gears))
        state = nest_model(
            model,
            planes,
            DEFAULT_GROUP_SIZE,
            progress=lambda done, total: say(f"building gears {done}/{total} layers"),
        )
        loaded.config["mlxswitch_gears"] = {
            "plane_bits": list(planes),
            "group_size": DEFAULT_GROUP_SIZE,
            "source_bits": state.source_bits,
        }
    missing = [g for g in gears if g not in model.gear_state.gears]
    if missing:
        raise UsageError(
            f"model {loaded.source} has gears {', '.join(map(str, model.gear_state.gears))}; "
            f"gear(s) {', '.join(map(str, missing))} are not among them"
        )
    loaded.precision = gear_report(model).honesty_note()
    return loaded
