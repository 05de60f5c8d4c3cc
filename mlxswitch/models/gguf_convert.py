"""A GGUF that MLX cannot read exactly, converted once into an mlx-lm directory in the user's cache.

MLX 0.32.4's `mx.load` decodes Q4_K wrongly and refuses Q5_0/Q5_1/Q5_K/Q6_K, so such files go
through the `gguf` package (llama.cpp's own reader): one tensor at a time is dequantized there to
float32 and re-quantized to MLX's affine format (group 32) at the bits its type maps to. The result
is keyed by the file's sha256 and written under a temporary name, renamed when whole.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..errors import ModelFormatError, OutputError
from ..files import atomic_dir, atomic_file
from ..kernels.quant_weights import Q6K_VALUES
from ..resources import cache_dir, file_sha256
from .gguf_reader import GROUP_SIZE

Progress = Callable[[str], None]

# ggml type → bits of its MLX affine re-quantization (group 32); 0 keeps it as a float.
# Chosen by measurement (`bench/bench_gguf_requant.py`, table in the README): each source keeps
# a re-quantization error well under its own quantization error against the float weights.
REQUANT_BITS = {
    "F32": 0,
    "F16": 0,
    "BF16": 0,
    "Q4_0": 4,
    "Q4_1": 4,
    "Q5_0": 5,
    "Q5_1": 5,
    "Q8_0": 8,
    "Q4_K": 4,
    "Q5_K": 5,
    "Q6_K": 8,
}
CONVERTED_FORMAT = 3  # bump when a converted directory's layout or REQUANT_BITS changes
# Beside the mlx-lm files: every Q6_K matrix's blocks as the file holds them, by module path. MLX has
# no group of 16, so the affine copy re-rounds them (8-bit codes, 9-10 bits a weight); the CPU's
# quantized kernel reads these instead (models/row_routes.py's use_q6k_blocks). mlx-lm reads only
# model*.safetensors.
Q6K_BLOCKS_FILE = "q6_k_blocks.safetensors"
# The same for every Q4_K matrix but the token embedding (a lookup: its affine copy serves), read
# as stored where the CPU's kernel tiles them (4.5 bits a weight where the affine copy holds 5).
Q4K_BLOCKS_FILE = "q4_k_blocks.safetensors"


def converted_dir(sha256: str) -> Path:
    """Where the conversion of the GGUF with this sha256 lives (it may not exist yet)."""
    return cache_dir() / "gguf" / f"{sha256[:32]}-v{CONVERTED_FORMAT}"


def reader_metadata(reader) -> dict:
    """A GGUFReader's metadata in mx.load's shapes: scalars and strings as Python values, string
    arrays as lists, numeric arrays as mx arrays (what gguf.py and gguf_tokenizer.py read)."""
    from gguf import GGUFValueType

    meta: dict[str, object] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        value = field.contents()
        if field.types and field.types[0] == GGUFValueType.ARRAY:
            if field.types[-1] == GGUFValueType.STRING:
                meta[key] = list(value)
            else:
                meta[key] = mx.array(np.asarray(value))
        else:
            meta[key] = value
    return meta


def requantize(values: np.ndarray, bits: int) -> dict[str, mx.array]:
    """Float values (rows, columns) → MLX affine triple (weight, scales, biases) at `bits`, group 32.

    Most GGUF block types put every group of 32 on an affine grid already (a scale and an offset
    per group, integer codes): that grid is recovered from the values and packed as it is, which
    is exact. `mx.quantize` (min/max rounding) takes the groups that lie on no such grid (Q6_K's
    16-value sub-blocks); re-quantizing a 4-bit grid that way would double its error.
    """
    array = mx.array(values)
    if not bits:
        return {"": array}
    codes, scales, biases, exact = affine_grid(values, bits)
    if not exact.all():
        fallback = [np.asarray(a) for a in mx.quantize(array, group_size=GROUP_SIZE, bits=bits)]
        approximate = ~exact.reshape(values.shape[0], -1)
        scales[approximate], biases[approximate] = fallback[1][approximate], fallback[2][approximate]
        packed = pack_codes(codes, bits).reshape(values.shape[0], -1, bits)
        packed[approximate] = fallback[0].reshape(values.shape[0], -1, bits)[approximate]
        weight = packed.reshape(values.shape[0], -1)
        del fallback
    else:
        weight = pack_codes(codes, bits)
    return {"": mx.array(weight), "scales": mx.array(scales), "biases": mx.array(biases)}


def affine_grid(
    values: np.ndarray, bits: int, max_divisor: int = 4, chunk: int = 1 << 20
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per group of 32: codes, scale and offset with value = offset + code × scale, and whether
    that reproduces the values (to 1e-6 of their size). The scale is the smallest gap between
    distinct values, or that gap divided by 2…max_divisor when codes skip levels."""
    rows = values.shape[0]
    groups = values.reshape(-1, GROUP_SIZE)
    codes = np.zeros(groups.shape, dtype=np.uint8)
    scales = np.zeros(len(groups), dtype=np.float32)
    lows = np.zeros(len(groups), dtype=np.float32)
    exact = np.zeros(len(groups), dtype=bool)
    for start in range(0, len(groups), chunk):  # bounded temporaries on a 150k × 1536 embedding
        part = slice(start, start + chunk)
        codes[part], scales[part], lows[part], exact[part] = _grid_chunk(
            groups[part].astype(np.float32), bits, max_divisor
        )
    return (
        codes.reshape(rows, -1),
        scales.reshape(rows, -1),
        lows.reshape(rows, -1),
        exact.reshape(rows, -1),
    )


def _grid_chunk(groups: np.ndarray, bits: int, max_divisor: int):
    low = groups.min(axis=1)
    size = np.maximum(np.abs(groups).max(axis=1), np.float32(1e-30))
    gaps = np.diff(np.sort(groups, axis=1), axis=1)
    gaps[gaps <= 1e-6 * size[:, None]] = np.inf
    step = gaps.min(axis=1)
    step[~np.isfinite(step)] = 1.0  # every value equal: code 0 throughout
    codes = np.zeros(groups.shape, dtype=np.uint8)
    scales = np.zeros(len(groups), dtype=np.float32)
    exact = np.zeros(len(groups), dtype=bool)
    todo = np.arange(len(groups))
    for divisor in range(1, max_divisor + 1):
        if not len(todo):
            break
        scale = (step[todo] / divisor).astype(np.float32)
        found = np.rint((groups[todo] - low[todo, None]) / scale[:, None])
        rebuilt = low[todo, None] + found * scale[:, None]
        fits = (np.abs(rebuilt - groups[todo]) <= 1e-6 * size[todo, None]).all(axis=1) & (
            found.max(axis=1) <= (1 << bits) - 1
        )
        done = todo[fits]
        codes[done] = found[fits].astype(np.uint8)
        scales[done] = scale[fits]
        exact[done] = True
        todo = todo[~fits]
    return codes, scales, low, exact


def pack_codes(codes: np.ndarray, bits: int, chunk: int = 4096) -> np.ndarray:
    """Unsigned codes (rows, columns) → MLX's packing: a little-endian bit stream in uint32 words."""
    codes = codes.astype(np.uint8)
    if bits == 8:
        return np.ascontiguousarray(codes).view(np.uint32)
    if bits == 4:
        return np.ascontiguousarray(codes[:, 0::2] | (codes[:, 1::2] << 4)).view(np.uint32)
    out = np.empty((codes.shape[0], codes.shape[1] * bits // 32), dtype=np.uint32)
    for start in range(0, codes.shape[0], chunk):
        block = codes[start : start + chunk]
        planes = np.unpackbits(block[..., None], axis=-1, bitorder="little")[..., :bits]
        out[start : start + chunk] = np.packbits(
            planes.reshape(block.shape[0], -1), axis=-1, bitorder="little"
        ).view(np.uint32)
    return out


def refuse_unknown_types(path: Path, types: dict[str, str]) -> None:
    """One error naming the first tensor whose type has no conversion."""
    foreign = {name: kind for name, kind in types.items() if kind not in REQUANT_BITS}
    if foreign:
        first, kind = next(iter(foreign.items()))
        kinds = sorted(set(foreign.values()))
        raise ModelFormatError(
            f"{path.name}: {len(foreign)} tensor(s) use {'/'.join(kinds)} (first: '{first}'), which "
            f"mlxswitch cannot load; supported GGUF types: {', '.join(REQUANT_BITS)}"
        )


def dequantized(tensor, rows: slice = slice(None)) -> np.ndarray:
    """Rows of one GGUF tensor as float32, (rows, columns) in row-major order, as llama.cpp computes
    them (a 1-D tensor: all of it)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    shape = tuple(int(d) for d in reversed(tensor.shape))  # gguf lists dims fastest-first
    data = np.asarray(tensor.data)
    if len(shape) == 2:
        data = data.reshape(shape[0], -1)[rows]
        shape = (data.shape[0], shape[1])
    if tensor.tensor_type == GGMLQuantizationType.F32:
        values = data.astype(np.float32)
    elif tensor.tensor_type == GGMLQuantizationType.F16:
        values = data.view(np.float16).astype(np.float32)
    else:
        values = dequantize(data, tensor.tensor_type)
    return values.reshape(shape)


def convert_tensors(
    path: Path, reader, progress: Progress | None = None, block_values: int = 1 << 23
) -> dict[str, mx.array]:
    """Every tensor of the file, converted by its type, under its GGUF name: one tensor, and a
    block of its rows, at a time (gguf's dequantization of a 150k-row embedding at once needs GBs)."""
    say = progress or (lambda message: None)
    out: dict[str, mx.array] = {}
    total = len(reader.tensors)
    for index, tensor in enumerate(reader.tensors):
        kind = tensor.tensor_type.name
        shape = tuple(int(d) for d in reversed(tensor.shape))
        # A 1-D tensor (norms, biases) or one whose width is no multiple of a group stays float.
        bits = REQUANT_BITS[kind] if len(shape) == 2 and shape[-1] % GROUP_SIZE == 0 else 0
        step = max(1, block_values // shape[-1]) if len(shape) == 2 else 1
        blocks = (
            (dequantized(tensor, slice(a, a + step)) for a in range(0, shape[0], step))
            if len(shape) == 2
            else iter([dequantized(tensor)])
        )
        parts: dict[str, list] = {}
        for values in blocks:
            for suffix, value in _converted(values, kind, bits).items():
                mx.eval(value)
                parts.setdefault(suffix, []).append(value)
        name = tensor.name.removesuffix(".weight")
        for suffix, pieces in parts.items():
            joined = pieces[0] if len(pieces) == 1 else mx.concatenate(pieces, axis=0)
            mx.eval(joined)
            out[f"{name}.{suffix}" if suffix else tensor.name] = joined
        say(f"converting {path.name} {_bar(index + 1, total)}")
    return out


def k_blocks(reader, kind: str = "Q6_K") -> dict[str, mx.array]:
    """Every `kind` (Q6_K or Q4_K) matrix of the file (whole 256-weight blocks a row) as its stored
    bytes, rows × bytes, under its GGUF name; Q4_K's token embedding left out."""
    found = {}
    for tensor in reader.tensors:
        shape = tuple(int(d) for d in reversed(tensor.shape))
        lookup = kind == "Q4_K" and tensor.name == "token_embd.weight"
        if tensor.tensor_type.name == kind and len(shape) == 2 and shape[-1] % Q6K_VALUES == 0 and not lookup:
            found[tensor.name] = mx.array(np.ascontiguousarray(np.asarray(tensor.data).reshape(shape[0], -1)))
    return found


def _converted(values: np.ndarray, kind: str, bits: int) -> dict[str, mx.array]:
    if bits == 0 and kind == "BF16":
        return {"": mx.array(values).astype(mx.bfloat16)}
    if bits == 0 and kind == "F16":
        return {"": mx.array(values).astype(mx.float16)}
    return requantize(values, bits)


def _bar(done: int, total: int, width: int = 24) -> str:
    filled = width * done // max(total, 1)
    return f"{'━' * filled}{'╺' * (width - filled)} {100 * done // max(total, 1)}% ({done}/{total} tensors)"


def write_converted(
    path: Path,
    sha256: str,
    model,
    config: dict,
    tokenizer,
    types: dict[str, str],
    blocks: dict[str, dict[str, mx.array]],
) -> Path:
    """Save a converted model as an mlx-lm directory at its cache place, whole or not at all, with
    its Q6_K and Q4_K blocks by module path (`blocks`: by file name) where it has any."""
    from mlx_lm.utils import save_config, save_model

    target = converted_dir(sha256)
    with atomic_dir(target) as staging:
        save_model(staging, model)
        for file, found in blocks.items():
            if found:
                mx.save_safetensors(str(staging / file), found)
        tokenizer.save_pretrained(str(staging))  # the wrapper forwards to the HF tokenizer
        config = dict(config)
        config["mlxswitch_gguf"] = {
            "source": path.name,
            "sha256": sha256,
            "format": CONVERTED_FORMAT,
            "types": dict(sorted(Counter(types.values()).items())),
            "requant_bits": {k: REQUANT_BITS[k] for k in sorted(set(types.values()))},
        }
        save_config(config, staging / "config.json")
    # An earlier format's conversion of the same file is read by no version that writes this one:
    # left behind, it held the Qwen pair's 2.1 GB a second time after the Q6_K bump.
    for earlier in range(1, CONVERTED_FORMAT):
        shutil.rmtree(target.with_name(f"{sha256[:32]}-v{earlier}"), ignore_errors=True)
    return target


def find_converted(sha256: str) -> Path | None:
    """The finished conversion of this file, if there is one."""
    folder = converted_dir(sha256)
    return folder if (folder / "config.json").exists() else None


def stat_key(path: Path) -> str:
    """Size and modification time: enough to reuse a recorded sha256 without re-reading the file."""
    stat = os.stat(path)
    return f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"


def known_sha256(path: Path) -> str:
    """The file's sha256, remembered in the cache by path, size and mtime (hashing 1 GB takes seconds)."""
    index_file = cache_dir() / "gguf" / "sha256.json"
    try:
        index = json.loads(index_file.read_text())
    except (OSError, ValueError):
        index = {}
    key = stat_key(path)
    if key in index:
        return index[key]
    sha = file_sha256(path)
    index[key] = sha
    try:
        index_file.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(index_file, "sha256 index") as handle:
            json.dump(index, handle)
    except (OSError, OutputError):  # a read-only cache only costs a re-hash next time
        pass
    return sha
