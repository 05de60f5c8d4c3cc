"""What a model's files on disk will take in memory here, read from their headers (no weights loaded)."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelFormatError
from ..kernels.route import current_route
from .gguf_convert import REQUANT_BITS
from .gguf_reader import GROUP_SIZE as GGUF_GROUP_SIZE
from .gguf_reader import ggml_type, read_header
from .weights import compute_dtype, read_json

_SAFETENSORS_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I64": 8,
    "U64": 8,
    "I32": 4,
    "U32": 4,
    "I16": 2,
    "U16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}


@dataclass(frozen=True)
class Footprint:
    """A model's weights as they will sit in memory here, and its shape for the KV cache."""

    bytes: int
    params: int  # parameters, quantized ones unpacked
    config: dict  # mlx-lm style: num_hidden_layers, num_key_value_heads, head_dim, …
    # Of those, held by the quantized matrices that multiply rows (rows.py keeps fp32 copies of them
    # on a CPU): every one but the embedding, and the embedding too when it is the tied output head.
    linear_params: int = 0


def float_width(stored: int) -> int:
    """Bytes a float stored in `stored` bytes takes once loaded (fp32 on a CPU)."""
    return 4 if compute_dtype() is not None else stored


def scale_width(stored: int) -> int:
    """Bytes a quantization scale or bias stored in `stored` bytes takes once loaded: fp16 where
    the quantized kernel holds them so (rows.py; a layer whose scales fp16 cannot hold keeps fp32,
    which this estimate does not foresee), else as any float."""
    return 2 if current_route().quant_scales == "fp16" else float_width(stored)


# The files mlx-lm loads (a converted GGUF's Q6_K blocks beside them replace some of their
# tensors on the CPU's kernel: counting the tensors they replace keeps the estimate on the safe side).
WEIGHT_FILES = "model*.safetensors"


def dir_footprint(folder: Path) -> Footprint | None:
    """An mlx-lm directory's footprint from its safetensors headers; None when incomplete."""
    try:
        return _dir_footprint(folder)
    except (OSError, ValueError, KeyError, struct.error):
        size = sum(f.stat().st_size for f in folder.glob(WEIGHT_FILES))
        return Footprint(size, size // 2, _read_json(folder / "config.json")) if size else None


def _dir_footprint(folder: Path) -> Footprint | None:
    files = sorted(folder.glob(WEIGHT_FILES))
    shards = set(_read_json(folder / "model.safetensors.index.json").get("weight_map", {}).values())
    if not files or not shards <= {file.name for file in files}:
        return None  # nothing here, or a download that stopped half-way
    config = _read_json(folder / "config.json")
    quant = config.get("quantization") or config.get("quantization_config") or {}
    bits = int(quant.get("bits", 4)) if isinstance(quant, dict) else 4
    size = params = linear = embed = 0
    tied = True  # no lm_head tensor: the embedding is the output head
    plain = "mlxswitch_gears" not in config  # a gear's planes keep their scales as they are
    embed_scales = 0  # bytes an embedding's scales take beyond scale_width's, unless it is the head
    for file in files:
        # The header is an 8-byte little-endian length and a JSON table: no weights are read.
        with open(file, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        header.pop("__metadata__", None)
        for name, info in header.items():
            tied = tied and "lm_head" not in name
            count = math.prod(info["shape"])
            dtype = info["dtype"]
            is_float = dtype.startswith(("F", "BF"))
            stored = _SAFETENSORS_BYTES.get(dtype, 4)
            if is_float and plain and name.endswith((".scales", ".biases")):
                size += count * scale_width(stored)
                if "embed" in name:  # narrowed only where it is the output head too (below)
                    embed_scales += count * (float_width(stored) - scale_width(stored))
            else:
                size += count * (float_width(stored) if is_float else stored)
            if dtype == "U32" and name.endswith("weight"):
                params += count * 32 // bits  # packed quantized weights
                if "embed" in name:
                    embed += count * 32 // bits
                else:
                    linear += count * 32 // bits
            elif not name.endswith((".scales", ".biases")):
                params += count
    size += 0 if tied else embed_scales
    return Footprint(size, params, config, linear + (embed if tied else 0))


def gguf_footprint(path: Path) -> Footprint:
    """A GGUF's footprint once loaded (directly, or converted to MLX affine at REQUANT_BITS)."""
    try:
        return _gguf_footprint(path)
    except (OSError, ValueError, KeyError, struct.error):
        # Not a readable GGUF: the loader will say so; guess from the file size meanwhile.
        size = path.stat().st_size
        return Footprint(size, size * 2, {})


def _gguf_footprint(path: Path) -> Footprint:
    header = read_header(path)
    meta = header.meta
    size = params = linear = embed = 0
    for name, (kind, count) in header.tensors.items():
        params += count
        gtype = ggml_type(kind)
        bits = gtype.quant_bits or REQUANT_BITS.get(gtype.name, 0)
        quantized = count if bits and not gtype.float_bytes else 0
        if name.startswith("token_embd"):
            embed += quantized
        else:
            linear += quantized
        if gtype.float_bytes:
            size += count * float_width(gtype.float_bytes)
        elif bits:
            # MLX holds a block as packed weights plus a scale and a bias (fp16; see scale_width).
            size += count * bits // 8 + 2 * (count // GGUF_GROUP_SIZE) * scale_width(2)
        else:  # a type the loader will refuse anyway: count it at 8 bits
            size += count
    arch = meta.get("general.architecture", "llama")
    heads = meta.get(f"{arch}.attention.head_count")
    config = {
        "num_hidden_layers": meta.get(f"{arch}.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": meta.get(f"{arch}.attention.head_count_kv", heads),
        "hidden_size": meta.get(f"{arch}.embedding_length"),
        "max_position_embeddings": meta.get(f"{arch}.context_length"),
    }
    tied = "output.weight" not in header.tensors  # no output matrix: the embedding is the head
    return Footprint(size, params, config, linear + (embed if tied else 0))


def _read_json(path: Path) -> dict:
    # An estimate goes on without a file the loader will complain about itself.
    try:
        return read_json(path)
    except ModelFormatError:
        return {}
