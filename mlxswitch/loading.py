"""One entry point for every model source: the embedded default, a GGUF file, an mlx-lm dir, a HF repo."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from .errors import ModelFormatError, ModelNotFoundError
from .resources import EMBEDDED_MODEL_NAME, EMBEDDED_SOURCE, embedded_gguf_path

EMBEDDED_ALIASES = {"embedded", EMBEDDED_SOURCE}
# What mlx-lm itself fetches for a model; we ask the hub for exactly these.
_HUB_PATTERNS = ["*.json", "model*.safetensors", "*.py", "tokenizer.model", "*.tiktoken",
                 "tiktoken.model", "*.txt", "*.jsonl", "*.jinja"]


@dataclass
class LoadedModel:
    """A model ready to decode: the mlx-lm module, its tokenizer and its config."""

    source: str
    name: str
    model: nn.Module
    tokenizer: Any  # mlx_lm.tokenizer_utils.TokenizerWrapper
    config: dict = field(default_factory=dict)
    precision: str = ""

    @property
    def context_length(self) -> int:
        """Longest sequence the model was trained for (4096 when the config does not say)."""
        for key in ("max_position_embeddings", "context_length", "max_seq_len"):
            if self.config.get(key):
                return int(self.config[key])
        return 4096

    @property
    def vocab_size(self) -> int:
        """Size of the model's output distribution."""
        return int(self.config.get("vocab_size") or len(self.tokenizer.get_vocab()))


def compute_dtype() -> mx.Dtype | None:
    """The float dtype to compute in: float32 on CPU, None (keep the checkpoint's) on a GPU."""
    # On MLX's CPU backend bf16 is 2x slower with wrong reductions, and fp16 quantization
    # scales make quantized_matmul ~30x slower; fp32 is the fast, correct choice there.
    return mx.float32 if mx.default_device() == mx.cpu else None


def cast_floats(model: nn.Module, dtype: mx.Dtype | None) -> None:
    """Cast every floating parameter (quantization scales and biases included) to dtype."""
    if dtype is None:
        return
    casted = [(k, v.astype(dtype)) for k, v in tree_flatten(model.parameters())
              if mx.issubdtype(v.dtype, mx.floating) and v.dtype != dtype]
    if casted:
        model.load_weights(casted, strict=False)
        mx.eval(model.parameters())


def load_checked_weights(model: nn.Module, weights: dict, float_dtype: mx.Dtype | None,
                         what: str) -> None:
    """Load `weights` strictly (floats cast to float_dtype) and evaluate; a mismatch names `what`."""
    if float_dtype is not None:
        weights = {k: v.astype(float_dtype) if mx.issubdtype(v.dtype, mx.floating) else v
                   for k, v in weights.items()}
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        raise ModelFormatError(f"{what} ({str(exc).splitlines()[0][:160]})") from exc
    mx.eval(model.parameters())
    model.eval()


def is_embedded(source: str) -> bool:
    """Whether `source` names the embedded default model."""
    return source.strip().lower() in EMBEDDED_ALIASES


def looks_like_path(source: str) -> bool:
    """Whether `source` is meant as a file system path rather than a hub repo id."""
    return (source.startswith(("/", ".", "~")) or source.lower().endswith(".gguf")
            or source.count("/") != 1 or Path(source).expanduser().exists())


def load_model(source: str) -> LoadedModel:
    """Load a model from the embedded default, a .gguf file, an mlx-lm dir or a HF repo id."""
    source = source.strip()
    if is_embedded(source):
        return _load_gguf_source(EMBEDDED_SOURCE, embedded_gguf_path(), EMBEDDED_MODEL_NAME)
    if looks_like_path(source):
        path = Path(source).expanduser()
        if not path.exists():
            raise ModelNotFoundError(f"model '{source}': no such file or directory")
        if path.is_file():
            if path.suffix.lower() != ".gguf":
                raise ModelFormatError(
                    f"model '{source}': a model file must be .gguf; otherwise give an mlx-lm directory")
            return _load_gguf_source(source, path, path.stem)
        return _load_mlx_dir(source, path, path.name)
    return _load_mlx_dir(source, resolve_hub_repo(source), source.split("/")[-1])


def resolve_hub_repo(repo_id: str) -> Path:
    """Local snapshot path of a Hugging Face repo: from the cache, else downloaded."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=_HUB_PATTERNS, local_files_only=True))
    except Exception:  # not cached (or incomplete): try the network below
        pass
    try:
        return Path(snapshot_download(repo_id, allow_patterns=_HUB_PATTERNS))
    except Exception as exc:  # offline, DNS, 404, gated: all end the same way for the user
        reason = _short_reason(exc)
        raise ModelNotFoundError(
            f"model '{repo_id}' is neither cached locally nor reachable on Hugging Face ({reason})"
        ) from exc


def _short_reason(exc: Exception) -> str:
    name = type(exc).__name__
    if name in ("RepositoryNotFoundError", "GatedRepoError"):
        return "no such repository, or it is private/gated"
    if name in ("OfflineModeIsEnabled",) or "offline" in str(exc).lower():
        return "offline mode"
    first_line = (str(exc).strip().splitlines() or [name])[0]
    return f"{name}: {first_line[:120]}"


def _load_gguf_source(source: str, path: Path, name: str) -> LoadedModel:
    from .gguf import load_gguf

    model, tokenizer, config = load_gguf(path, compute_dtype())
    return LoadedModel(source, name, model, tokenizer, config,
                       precision=str(config.get("quantization_label", "gguf")))


def _load_mlx_dir(source: str, path: Path, name: str) -> LoadedModel:
    from mlx_lm.utils import load as mlx_lm_load

    if not (path / "config.json").exists():
        raise ModelFormatError(f"model '{source}': {path} has no config.json (not an mlx-lm model directory)")
    config = _read_json(path / "config.json")
    if "mlxswitch_gears" in config:
        from .gears import load_geared_dir

        return load_geared_dir(source, path, name)
    try:
        model, tokenizer, config = mlx_lm_load(str(path), return_config=True)
    except ValueError as exc:  # mlx-lm's word for an unknown model_type or missing weights
        raise ModelFormatError(f"model '{source}': {str(exc).splitlines()[0]}") from exc
    except FileNotFoundError as exc:
        raise ModelFormatError(f"model '{source}': {exc}") from exc
    cast_floats(model, compute_dtype())
    return LoadedModel(source, name, model, tokenizer, config, precision=_precision_label(config))


def _precision_label(config: dict) -> str:
    quant = config.get("quantization") or config.get("quantization_config") or {}
    if isinstance(quant, dict) and quant.get("bits"):
        return f"{quant['bits']}-bit"
    return str(config.get("torch_dtype") or config.get("dtype") or "float")


def _read_json(path: Path) -> dict:
    import json

    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelFormatError(f"{path}: unreadable config ({exc})") from exc
