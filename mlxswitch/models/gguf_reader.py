"""Reading a GGUF file without loading it: its header, the ggml type table, metadata values."""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx

from ..errors import ModelFormatError

GROUP_SIZE = 32  # every GGUF block format that mx.load maps onto MLX quantization has 32 values


@dataclass(frozen=True)
class GGMLType:
    """A ggml tensor type: whether we load it, and what an element costs once loaded."""

    name: str
    native: bool = False  # mx.load hands it over faithfully
    float_bytes: int = 0  # a float type: bytes per element as mx.load returns it
    quant_bits: int = 0  # a 32-value block type: bits per weight (plus a scale and bias per block)


# One table for the loader and the memory estimate. `native`: mx.load's decoding equals the gguf
# package's (tests/test_gguf_convert.py proves it per type); every other type is converted
# (gguf_convert.py). mx.load decodes Q4_K wrongly and reads BF16 as float16, which rounds
# bf16's small values, so neither is native.
GGML_TYPES = {
    0: GGMLType("F32", True, float_bytes=4),
    1: GGMLType("F16", True, float_bytes=2),
    2: GGMLType("Q4_0", True, quant_bits=4),
    3: GGMLType("Q4_1", True, quant_bits=4),
    8: GGMLType("Q8_0", True, quant_bits=8),
    30: GGMLType("BF16", float_bytes=2),
    **{
        k: GGMLType(name)
        for k, name in {
            6: "Q5_0",
            7: "Q5_1",
            9: "Q8_1",
            10: "Q2_K",
            11: "Q3_K",
            12: "Q4_K",
            13: "Q5_K",
            14: "Q6_K",
            15: "Q8_K",
            16: "IQ2_XXS",
            17: "IQ2_XS",
            18: "IQ3_XXS",
            19: "IQ1_S",
            20: "IQ4_NL",
            21: "IQ3_S",
            22: "IQ2_S",
            23: "IQ4_XS",
            24: "I8",
            25: "I16",
            26: "I32",
            27: "I64",
            28: "F64",
            29: "IQ1_M",
        }.items()
    },
}


def ggml_type(kind: int) -> GGMLType:
    """The table entry of a ggml type id (an unknown id: a foreign type named by its number)."""
    return GGML_TYPES.get(kind, GGMLType(f"type {kind}"))


def meta_value(meta: dict, key: str, path: Path, default: Any = ...) -> Any:
    """A metadata value as a Python scalar, str or list; a missing required key names the file."""
    if key not in meta:
        if default is ...:
            raise ModelFormatError(f"{path.name}: GGUF metadata lacks '{key}'")
        return default
    value = meta[key]
    if isinstance(value, mx.array):
        if value.size != 1:
            raise ModelFormatError(
                f"{path.name}: metadata '{key}' has one value per layer; only uniform layers are supported"
            )
        return value.item()
    return value


_METADATA_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_METADATA_STRING, _METADATA_ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFHeader:
    """What a GGUF (v2/v3) header says, read without loading any tensor."""

    meta: dict  # scalar and string values by key; arrays (vocabulary, merges) are skipped as None
    tensors: dict[str, tuple[int, int]]  # tensor name -> (ggml type id, element count)


def read_header(path: Path) -> GGUFHeader:
    """Parse a GGUF header; ValueError or struct.error when the file is not one."""
    with open(path, "rb") as handle:

        def unpack(fmt: str):
            return struct.unpack(fmt, handle.read(struct.calcsize(fmt)))[0]

        size = os.fstat(handle.fileno()).st_size

        def string() -> str:
            length = unpack("<Q")
            if length > size:  # a damaged header: never allocate what the file cannot hold
                raise ValueError(f"a string of {length} bytes in a file of {size}")
            return handle.read(length).decode("utf-8")

        def value(kind: int):
            if kind == _METADATA_STRING:
                return string()
            if kind == _METADATA_ARRAY:
                item, count = unpack("<I"), unpack("<Q")
                if item in _METADATA_SCALARS:
                    handle.seek(count * struct.calcsize(_METADATA_SCALARS[item]), 1)
                elif item == _METADATA_STRING:
                    for _ in range(count):
                        handle.seek(unpack("<Q"), 1)
                else:
                    for _ in range(count):
                        value(item)
                return None
            if kind not in _METADATA_SCALARS:
                raise ValueError(f"unknown metadata value type {kind}")
            return unpack(_METADATA_SCALARS[kind])

        magic, version = handle.read(4), unpack("<I")
        if magic != b"GGUF" or version < 2:
            raise ValueError(f"not a GGUF v2/v3 header (magic {magic!r}, version {version})")
        tensor_count, kv_count = unpack("<Q"), unpack("<Q")
        meta = {}
        for _ in range(kv_count):
            key = string()
            meta[key] = value(unpack("<I"))
        tensors = {}
        for _ in range(tensor_count):
            name = string()
            dims = [unpack("<Q") for _ in range(unpack("<I"))]
            kind = unpack("<I")
            unpack("<Q")  # data offset
            tensors[name] = (kind, math.prod(dims))
    return GGUFHeader(meta, tensors)


def tensor_types(path: Path) -> dict[str, int]:
    """The ggml type id of every tensor in a GGUF file, read from its header."""
    return {name: kind for name, (kind, _) in read_header(path).tensors.items()}


def header_types_or_none(path: Path) -> dict[str, int] | None:
    """tensor_types, or None when the header cannot be read."""
    try:
        return tensor_types(path)
    except (OSError, ValueError, struct.error, UnicodeDecodeError):
        return None
