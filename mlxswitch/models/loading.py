"""One entry point for every model source: the embedded default, a GGUF file, an mlx-lm dir, a HF repo."""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelFormatError, ModelNotFoundError
from ..resources import EMBEDDED_MODEL_NAME, EMBEDDED_SOURCE, embedded_gguf_path
from .gear_files import load_geared_dir
from .gguf import load_gguf
from .rows import use_fast_rows
from .sources import hub_snapshot, is_embedded, looks_like_path
from .weights import LoadedModel, cast_floats, compute_dtype, read_json


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
    return _load_mlx_dir(source, hub_snapshot(source, download=True), source.split("/")[-1])


def _load_gguf_source(source: str, path: Path, name: str) -> LoadedModel:
    model, tokenizer, config = load_gguf(path, compute_dtype())
    use_fast_rows(model)
    return LoadedModel(source, name, model, tokenizer, config,
                       precision=str(config.get("quantization_label", "gguf")))


def _load_mlx_dir(source: str, path: Path, name: str) -> LoadedModel:
    from mlx_lm.utils import load as mlx_lm_load

    if not (path / "config.json").exists():
        raise ModelFormatError(f"model '{source}': {path} has no config.json (not an mlx-lm model directory)")
    config = read_json(path / "config.json")
    if "mlxswitch_gears" in config:
        return load_geared_dir(source, path, name)
    try:
        model, tokenizer, config = mlx_lm_load(str(path), return_config=True)
    except ValueError as exc:  # mlx-lm's word for an unknown model_type or missing weights
        raise ModelFormatError(f"model '{source}': {str(exc).splitlines()[0]}") from exc
    except FileNotFoundError as exc:
        raise ModelFormatError(f"model '{source}': {exc}") from exc
    cast_floats(model, compute_dtype())
    use_fast_rows(model)
    return LoadedModel(source, name, model, tokenizer, config, precision=_precision_label(config))


def _precision_label(config: dict) -> str:
    quant = config.get("quantization") or config.get("quantization_config") or {}
    if isinstance(quant, dict) and quant.get("bits"):
        return f"{quant['bits']}-bit"
    return str(config.get("torch_dtype") or config.get("dtype") or "float")


