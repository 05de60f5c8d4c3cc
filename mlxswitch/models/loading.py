"""Loading a model's files by format: a GGUF file (read directly or converted once), an mlx-lm dir."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlx.core as mx

from ..errors import ModelFormatError
from ..kernels.route import current_route
from .gear_files import load_geared_dir
from .gguf import convert_gguf, load_gguf, needs_conversion, use_rope_factors
from .gguf_convert import Q4K_BLOCKS_FILE, Q6K_BLOCKS_FILE
from .layout_cache import layout_file, restore_layout, save_layout
from .row_routes import use_fast_rows, use_k_blocks
from .tokenizer_cache import kept_tokenizer
from .weights import LoadedModel, cast_floats, compute_dtype, read_json

Progress = Callable[[str], None]


def load_gguf_file(source: str, path: Path, name: str, progress: Progress | None = None) -> LoadedModel:
    """A GGUF file: straight through `mx.load` when it reads every tensor exactly, else converted
    once into a cached mlx-lm directory (gguf_convert.py) and loaded from there."""
    if needs_conversion(path):
        return load_mlx_dir(source, convert_gguf(path, progress), name)
    model, tokenizer, config = load_gguf(path, compute_dtype())
    linears = use_fast_rows(model)
    return LoadedModel(
        source,
        name,
        model,
        tokenizer,
        config,
        precision=str(config.get("quantization_label", "gguf")),
        linears=linears,
    )


def load_mlx_dir(source: str, path: Path, name: str) -> LoadedModel:
    """An mlx-lm directory (nested gears saved by `gears build` included)."""
    from mlx_lm.utils import load_config
    from mlx_lm.utils import load_model as mlx_lm_load_model

    if not (path / "config.json").exists():
        raise ModelFormatError(f"model '{source}': {path} has no config.json (not an mlx-lm model directory)")
    config = read_json(path / "config.json")
    if "mlxswitch_gears" in config:
        return load_geared_dir(source, path, name)
    # mlx-lm's load, its two halves: the tokenizer on a second thread (where loads share them, one
    # already loaded from the same files is taken instead: the pair's second costs ~2.7 s) while
    # this one reads the weights and lays them out; neither needs the other, and much of either
    # runs without the GIL.
    with ThreadPoolExecutor(1, thread_name_prefix="mlxswitch-tokenizer") as pool:
        tokenizer_loaded = pool.submit(_tokenizer, path, load_config(path))  # eos ids as mlx-lm's
        with _format_errors(source):
            # Lazily where a converted GGUF's Q6_K or Q4_K blocks, or its layers as laid out here before
            # (layout_cache.py), replace some layers' affine weights: those are then never read;
            # every other parameter is evaluated below.
            laid_out = layout_file(path, config)
            kept = laid_out is not None and laid_out.exists()
            block_files = [path / f for f in (Q6K_BLOCKS_FILE, Q4K_BLOCKS_FILE) if (path / f).exists()]
            has_blocks = bool(block_files) and current_route().plain_linears == "quant-kernel"
            lazy = has_blocks or kept
            model, config = mlx_lm_load_model(path, lazy=lazy)
            # Cast before the laid-out layers come in (they hold their scales as laid out), and
            # lazily: the casts of the arrays they replace are never run.
            cast_floats(model, compute_dtype(), evaluate=not lazy)
            restored = kept and laid_out is not None and restore_layout(model, laid_out)
            if has_blocks and not restored:
                for blocks in block_files:
                    use_k_blocks(model, mx.load(str(blocks)))  # type: ignore[arg-type]  # safetensors: a dict
            mx.eval(model.parameters())
        if config.get("rope_freqs"):  # a converted llama 3.x GGUF: mlx-lm does not know the factors
            use_rope_factors(model, config, mx.array(config["rope_freqs"]), path)
        linears = use_fast_rows(model)
        if laid_out is not None and not restored:
            save_layout(model, laid_out)
        with _format_errors(source):
            tokenizer = tokenizer_loaded.result()
    return LoadedModel(
        source, name, model, tokenizer, config, precision=_precision_label(config), linears=linears
    )


@contextmanager
def _format_errors(source: str) -> Iterator[None]:
    """mlx-lm's errors for files it cannot load, as one line naming the model."""
    try:
        yield
    except ValueError as exc:  # mlx-lm's word for an unknown model_type or missing weights
        raise ModelFormatError(f"model '{source}': {str(exc).splitlines()[0]}") from exc
    except FileNotFoundError as exc:
        raise ModelFormatError(f"model '{source}': {exc}") from exc


def _precision_label(config: dict) -> str:
    converted = config.get("mlxswitch_gguf")
    if converted:
        kinds = "/".join(converted.get("types", {}))
        return f"GGUF {config.get('gguf_file_type', '')} ({kinds}) as MLX affine".replace("  ", " ")
    quant = config.get("quantization") or config.get("quantization_config") or {}
    if isinstance(quant, dict) and quant.get("bits"):
        return f"{quant['bits']}-bit"
    return str(config.get("torch_dtype") or config.get("dtype") or "float")


# The files that define a tokenizer (a chat template aside: a ladder renders with its first tier's).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
)
# Tokenizers by tokenizer_key while loads share them (shared_tokenizers); None: each load its own.
_SHARED: dict[str, Any] | None = None


@contextmanager
def shared_tokenizers() -> Iterator[None]:
    """Within it, models loaded from directories whose tokenizers are the same (tokenizer_key)
    share one tokenizer object, parsed once: a ladder's tiers (api.build_ladder). Outside, each
    load parses its own, so no caller's changes to a tokenizer reach another's."""
    global _SHARED
    outer = _SHARED
    _SHARED = {} if outer is None else outer
    try:
        yield
    finally:
        _SHARED = outer


def tokenizer_key(path: Path, config: dict) -> str:
    """A digest of the files that define the tokenizer of the mlx-lm directory at `path`, and of
    the end-of-sequence ids its config gives it: equal keys, the same tokenizer."""
    digest = hashlib.sha256(json.dumps(config.get("eos_token_id")).encode())
    for name in TOKENIZER_FILES:
        file = path / name
        if file.is_file():
            digest.update(name.encode() + b"\0" + hashlib.sha256(file.read_bytes()).digest())
    return digest.hexdigest()


def _tokenizer(path: Path, config: dict):
    """mlx-lm's tokenizer of the directory (as mlx_lm.load gives it), or, within
    shared_tokenizers, the one an earlier load there took from the same files (mlx-lm copies its
    detokenizer per caller)."""
    shared = _SHARED
    key = tokenizer_key(path, config)
    tokenizer = shared.get(key) if shared is not None else None
    if tokenizer is None:
        tokenizer = kept_tokenizer(path, config, key)
        if shared is not None:
            shared[key] = tokenizer
    return tokenizer
