"""A converted model's weights as this machine's kernel lays them out (rows.py, row_routes.py:
tiles, Q6_K blocks), kept beside the converted directory so that a later load reads them as laid
out instead of laying them out again: the pair's layout took ~1.7 s of a cold start, twice that
beside the tokenizer's parse (the GIL), where reading the same bytes laid out costs what reading
them as stored did.

The file is keyed by everything the layout depends on: the sources that decide and make it (the C
kernel, its flags and what the build can do on this CPU, the Python that lays out) and the route's
choices (scale width, activations, the code widths taken on int8). A new key writes a new file, and
the directory keeps the two most recently used; a file that cannot be written is skipped (the next
load lays out again), never half-written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..kernels import quant_cpu, quant_tiles, quant_weights
from ..kernels.quant_cpu import quant_kernel
from ..kernels.quant_weights import Q4K_TILED, Q6K, Q6K_TILED, TILED, QuantViews, QuantWeight
from ..kernels.route import current_route
from . import row_routes, rows
from .rows import Q4KLinear, Q6KLinear, TiledLinear

PREFIX = "laid-out-"
SUFFIX = ".safetensors"
# Files kept per directory, the most recently used: two versions (or two machines' builds) that
# take turns on one cache keep theirs, instead of laying out and writing ~1.5 GB at every load.
KEEP = 2
# Attributes a laid-out layer carries beside its arrays (rows.py's keep_quantized, take_blocks).
_FIELDS = ("bits", "code_bits", "group_size", "scales_narrowed", "in_dims")
RowsLaidOut = (TiledLinear, Q6KLinear)  # Q4KLinear is a TiledLinear
_CLASSES = {TILED: TiledLinear, Q4K_TILED: Q4KLinear, Q6K_TILED: Q6KLinear, Q6K: Q6KLinear}


def layout_file(path: Path, config: dict) -> Path | None:
    """Where this machine keeps the laid-out weights of the converted GGUF directory `path`, or
    None: not a directory we converted, or a route that lays nothing out (no kernel, no tiles)."""
    route = current_route()
    if (
        "mlxswitch_gguf" not in config
        or route.plain_linears != "quant-kernel"
        or route.quant_activations != "int8"
    ):
        return None  # asked before the kernel: a route without it builds none here
    kernel = quant_kernel()
    if kernel is None or not kernel.tiled:
        return None
    digest = hashlib.sha256()
    for source in (quant_cpu.SOURCE, Path(quant_cpu.__file__), Path(quant_tiles.__file__)):
        digest.update(source.read_bytes())
    for source in (
        Path(quant_weights.__file__),
        Path(rows.__file__),
        Path(row_routes.__file__),
        Path(__file__),
    ):
        digest.update(source.read_bytes())
    choices = [
        kernel.flags,
        kernel.layout_traits,
        route.quant_scales,
        route.quant_activations,
        quant_cpu.INT8_CODE_BITS,
    ]
    digest.update(json.dumps(choices, default=list).encode())
    return path / f"{PREFIX}{digest.hexdigest()[:20]}{SUFFIX}"


def restore_layout(model: nn.Module, file: Path) -> bool:
    """Give every layer `file` lists its laid-out arrays and attributes, before the model's other
    parameters are evaluated (the arrays they replace are then never read). False, with the file
    removed and the model untouched, where it cannot be read whole (damaged, another model's)."""
    modules = dict(model.named_modules())
    with contextlib.suppress(OSError):  # marked as used (a read-only cache: it is only kept longer)
        os.utime(file)
    try:
        arrays, metadata = mx.load(str(file), return_metadata=True)
        assert isinstance(arrays, dict) and isinstance(metadata, dict), "a safetensors file"
        layers = json.loads(metadata["layers"])
        if not set(layers) <= modules.keys():
            raise ValueError("layers this model does not have")
        mx.eval(list(arrays.values()))  # read in one evaluation, not one per view below
    except (OSError, RuntimeError, ValueError, KeyError):
        with contextlib.suppress(OSError):
            file.unlink()
        return False
    for name, fields in layers.items():
        module = modules[name]
        module.__class__ = _CLASSES[fields["layout"]]
        for key in _FIELDS:
            setattr(module, key, fields[key])
        if fields["layout"] == TILED:
            module.weight, module.scales, module.biases = (
                arrays[f"{name}.{p}"] for p in ("weight", "scales", "biases")
            )
            view = QuantWeight.from_tiles(
                module.weight, module.scales, module.biases, module.group_size, module.bits, module.code_bits
            )
        else:
            module.weight = arrays[f"{name}.weight"]
            for key in ("scales", "biases"):
                module.pop(key, None)
            q4k = fields["layout"] == Q4K_TILED
            blocks_view = QuantWeight.from_q4k_tiles if q4k else QuantWeight.from_q6k
            view = blocks_view(module.weight, module.in_dims)
        module.quant = QuantViews((dataclasses.replace(view, layout=fields["layout"]),))
    return True


def save_layout(model: nn.Module, file: Path) -> bool:
    """Write the model's laid-out layers (tiles, Q6_K blocks) to `file`, whole or not at all, and
    keep the directory's KEEP most recently used; False where there was none or it could not."""
    arrays: dict[str, mx.array] = {}
    layers: dict[str, dict] = {}
    for name, module in model.named_modules():
        view = module.quant.weights[0] if isinstance(module, RowsLaidOut) and module.quant else None
        if view is None or view.layout not in _CLASSES:
            continue
        names = ("weight", "scales", "biases") if view.layout == TILED else ("weight",)
        arrays.update({f"{name}.{p}": module[p] for p in names})
        layers[name] = {"layout": view.layout} | {key: getattr(module, key, 0) for key in _FIELDS}
    if not layers:
        return False
    temporary = file.with_name(f".{file.stem}.{os.getpid()}.partial{SUFFIX}")
    try:
        mx.save_safetensors(str(temporary), arrays, metadata={"layers": json.dumps(layers)})
        os.replace(temporary, file)
    except (OSError, RuntimeError, ValueError):  # a full disk, a read-only cache: lay out next time
        temporary.unlink(missing_ok=True)
        return False
    with contextlib.suppress(OSError):  # another process's clean-up at the same time
        kept = sorted(file.parent.glob(f"{PREFIX}*{SUFFIX}"), key=lambda f: f.stat().st_mtime, reverse=True)
        for other in kept[KEEP:]:
            other.unlink(missing_ok=True)
    return True
