"""What every loader shares: the loaded-model record, the compute dtype, checked weight loading."""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.utils import MODEL_REMAPPING

from ..errors import ModelFormatError
from ..kernels.route import current_route
from .arrays import flat_parameters


@dataclass
class LoadedModel:
    """A model ready to decode: the mlx-lm module, its tokenizer and its config."""

    source: str
    name: str
    model: nn.Module
    tokenizer: Any  # mlx_lm.tokenizer_utils.TokenizerWrapper
    config: dict = field(default_factory=dict)
    precision: str = ""
    linears: str = ""  # the route its plain quantized linears took (row_routes.use_fast_rows), "" unknown

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
    """The float dtype to compute in: the route's (float32 on CPU, None: the checkpoint's on a GPU)."""
    return current_route().mx_compute_dtype()


def cast_floats(model: nn.Module, dtype: mx.Dtype | None, evaluate: bool = True) -> None:
    """Cast every floating parameter (quantization scales and biases included) to dtype; lazily
    where not `evaluate` (a cast of a parameter replaced before evaluation is then never run)."""
    if dtype is None:
        return
    casted = [
        (k, v.astype(dtype))
        for k, v in flat_parameters(model)
        if mx.issubdtype(v.dtype, mx.floating) and v.dtype != dtype
    ]
    if casted:
        model.load_weights(casted, strict=False)
        if evaluate:
            mx.eval(model.parameters())


def model_classes(config: dict, what: str) -> tuple[type[Any], type[Any]]:
    """mlx-lm's Model and ModelArgs classes for a config's model_type; ModelFormatError naming `what`."""
    # mlx-lm's own lookup is private (utils._get_classes); its model modules and remapping are public.
    model_type = str(config.get("model_type", ""))
    model_type = MODEL_REMAPPING.get(model_type, model_type)
    try:
        module = importlib.import_module(f"mlx_lm.models.{model_type}")
    except ImportError:
        raise ModelFormatError(f"{what}: model type '{model_type}' is not supported by mlx-lm") from None
    return module.Model, module.ModelArgs


def load_checked_weights(model: nn.Module, weights: dict, float_dtype: mx.Dtype | None, what: str) -> None:
    """Load `weights` strictly (floats cast to float_dtype) and evaluate; a mismatch names `what`."""
    if float_dtype is not None:
        weights = {
            k: v.astype(float_dtype) if mx.issubdtype(v.dtype, mx.floating) else v for k, v in weights.items()
        }
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        raise ModelFormatError(f"{what} ({str(exc).splitlines()[0][:160]})") from exc
    mx.eval(model.parameters())
    model.eval()


def read_json(path: Path) -> dict:
    """A JSON file as a dict; ModelFormatError naming the file when it cannot be read."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ModelFormatError(f"{path}: unreadable ({exc})") from exc
