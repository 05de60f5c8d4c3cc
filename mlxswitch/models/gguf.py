"""GGUF files (llama.cpp / Ollama / LM Studio) as mlx-lm models, tokenizer and chat template included.

Two ways in. A file whose every tensor `mx.load` reads exactly (F32/F16, and Q4_0/Q4_1/Q8_0,
which arrive as MLX affine triples, group size 32) loads directly. Any other file (K-quants,
Q5_0/Q5_1, BF16) is converted once by gguf_convert.py into a cached mlx-lm directory. The model config
is rebuilt here from the metadata, the tokenizer in gguf_tokenizer.py, and the header (tensor
types, read without loading) in gguf_reader.py.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import mlx.nn as nn

from ..errors import ModelFormatError
from .gguf_convert import (
    Q4K_BLOCKS_FILE,
    Q6K_BLOCKS_FILE,
    Progress,
    convert_tensors,
    find_converted,
    k_blocks,
    known_sha256,
    reader_metadata,
    refuse_unknown_types,
    write_converted,
)
from .gguf_reader import GROUP_SIZE, ggml_type, header_types_or_none, meta_value
from .gguf_tokenizer import build_tokenizer
from .weights import load_checked_weights, model_classes

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper

# `general.file_type` (llama.cpp's ftype) names, for display.
_FILE_TYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    32: "BF16",
}

# llama.cpp's tensor names → mlx-lm's, per layer and global.
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_ROPE_FREQS = "rope_freqs.weight"

# llama.cpp permutes the q/k rows of `llama` checkpoints for its interleaved RoPE, so mlx-lm's
# traditional RoPE on the rows as stored is exact (measured: SmolLM2 matches an independent fp32
# reference token for token; rope_traditional=False matches none). qwen2 is stored unpermuted (NEOX).
_ARCHITECTURES = {"llama": {"rope_traditional": True}, "qwen2": {"rope_traditional": False}}


def load_gguf(path: Path, float_dtype: mx.Dtype | None) -> tuple[nn.Module, TokenizerWrapper, dict]:
    """Build an mlx-lm model, its tokenizer and an mlx-lm style config from a GGUF file whose
    tensors `mx.load` reads exactly (see `needs_conversion`).

    float_dtype: every floating tensor (quantization scales and norms included) is cast to it;
    None keeps the checkpoint's precision, i.e. the float dtype holding most of its values.
    """
    path = Path(path)
    tensors, meta = _read(path)
    _check_tensor_types(path, tensors)
    return _assemble(path, meta, tensors, float_dtype)


def _assemble(
    path: Path, meta: dict, tensors: dict, float_dtype: mx.Dtype | None
) -> tuple[nn.Module, TokenizerWrapper, dict]:
    """Model, tokenizer and config from GGUF metadata and tensors under their GGUF names."""
    arch = meta_value(meta, "general.architecture", path)
    if arch not in _ARCHITECTURES:
        raise ModelFormatError(
            f"{path.name}: architecture '{arch}' is not supported (supported: {', '.join(_ARCHITECTURES)})"
        )
    tokenizer = build_tokenizer(meta, path)
    rope_factors = tensors.pop(_ROPE_FREQS, None)
    weights = _rename(tensors, path)
    config = _config(meta, arch, weights, path, rope_factors)
    model = _build_model(config, weights, float_dtype or _dominant_float_dtype(weights), path)
    if rope_factors is not None:
        use_rope_factors(model, config, rope_factors, path)
    config["eos_token_id"] = sorted(tokenizer.eos_token_ids)
    return model, tokenizer, config


def needs_conversion(path: Path) -> bool:
    """Whether a GGUF holds a tensor type that `mx.load` does not read exactly (K-quants, Q5_x)."""
    types = header_types_or_none(Path(path))
    if types is None:
        raise ModelFormatError(f"{Path(path).name}: not a GGUF file (unreadable header)")
    return any(not ggml_type(kind).native for kind in types.values())


def convert_gguf(path: Path, progress: Progress | None = None, sha256: str | None = None) -> Path:
    """The mlx-lm directory converted from this GGUF, made once (keyed by its sha256) and cached;
    `sha256` when the caller verified it already."""
    path = Path(path)
    types = {name: ggml_type(kind).name for name, kind in (header_types_or_none(path) or {}).items()}
    refuse_unknown_types(path, types)
    sha256 = sha256 or known_sha256(path)
    found = find_converted(sha256)
    if found is not None:
        return found
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # gguf raises ValueError/struct errors/IndexError for a damaged file
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:160]
        raise ModelFormatError(f"{path.name}: cannot read as GGUF ({reason})") from exc
    meta = reader_metadata(reader)
    tensors = convert_tensors(path, reader, progress)
    model, tokenizer, config = _assemble(path, meta, tensors, None)
    del tensors
    blocks = {}
    for file, kind in ((Q6K_BLOCKS_FILE, "Q6_K"), (Q4K_BLOCKS_FILE, "Q4_K")):
        named = _rename(k_blocks(reader, kind), path)
        blocks[file] = {name.removesuffix(".weight"): value for name, value in named.items()}
    return write_converted(path, sha256, model, config, tokenizer, types, blocks)


def _read(path: Path) -> tuple[dict, dict]:
    try:
        # mlx types the result as a union over formats; return_metadata=True gives (arrays, metadata).
        return mx.load(str(path), return_metadata=True)  # type: ignore[return-value]
    except Exception as exc:  # mlx raises plain RuntimeError/ValueError for any unreadable file
        reason = (str(exc).splitlines() or [type(exc).__name__])[0].removeprefix("[load_gguf] ")
        raise ModelFormatError(f"{path.name}: cannot read as GGUF ({reason})") from exc


def _check_tensor_types(path: Path, tensors: dict) -> None:
    if needs_conversion(path):  # mx.load would decode such a tensor wrongly, or not at all
        raise ModelFormatError(f"{path.name}: holds tensor types that load only through convert_gguf")


def _config(meta: dict, arch: str, weights: dict, path: Path, rope_factors: mx.array | None) -> dict:
    def get(key, default=...):
        return meta_value(meta, f"{arch}.{key}", path, default)

    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", hidden // heads))
    if int(get("rope.dimension_count", head_dim)) != head_dim:
        raise ModelFormatError(f"{path.name}: partial rotary embeddings are not supported")
    config: dict[str, Any] = {
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": int(get("block_count")),
        "intermediate_size": int(get("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "rms_norm_eps": _decimal(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": _decimal(get("rope.freq_base", 10000.0)),
        "vocab_size": int(get("vocab_size", len(meta_value(meta, "tokenizer.ggml.tokens", path)))),
        "max_position_embeddings": int(get("context_length", 4096)),
        "tie_word_embeddings": "lm_head.weight" not in weights,
        **_ARCHITECTURES[arch],
    }
    if arch == "llama":
        config["attention_bias"] = "model.layers.0.self_attn.q_proj.bias" in weights
        if head_dim != hidden // heads:
            config["head_dim"] = head_dim
    elif head_dim != hidden // heads:
        raise ModelFormatError(f"{path.name}: {arch} with head size {head_dim} ≠ hidden/heads")
    scaling = get("rope.scaling.type", "none")
    if scaling == "linear":
        config["rope_scaling"] = {"type": "linear", "factor": _decimal(get("rope.scaling.factor"))}
    elif scaling != "none":
        raise ModelFormatError(f"{path.name}: RoPE scaling '{scaling}' is not supported")
    if rope_factors is not None:
        # Not mlx-lm's: whoever rebuilds this model from the config must re-apply them.
        factors: list[float] = rope_factors.astype(mx.float32).tolist()  # type: ignore[assignment]  # 1-D
        config["rope_freqs"] = [float(f) for f in factors]
    file_type = meta_value(meta, "general.file_type", path, None)
    config["gguf_file_type"] = (
        "unknown" if file_type is None else _FILE_TYPES.get(file_type, f"type {file_type}")
    )
    config.update(_quantization_info(weights, config["gguf_file_type"]))
    return config


def _decimal(value: float) -> float:
    # GGUF stores these as float32: 1e-5 arrives as 9.999999747e-06; keep float32's 7 digits.
    return float(f"{value:.7g}")


def _quantization_info(weights: dict, file_type: str) -> dict:
    """mlx-lm's `quantization` entry (defaults plus per-module overrides) and a display label."""
    bits = _layer_bits(weights)
    if not bits:
        return {"quantization_label": f"GGUF {file_type}"}
    common = Counter(bits.values()).most_common(1)[0][0]
    overrides = {name: {"group_size": GROUP_SIZE, "bits": b} for name, b in bits.items() if b != common}
    return {
        "quantization": {"group_size": GROUP_SIZE, "bits": common, "mode": "affine", **overrides},
        "quantization_label": f"GGUF {file_type} ({common}-bit)",
    }


def _rename(tensors: dict, path: Path) -> dict:
    renamed = {}
    for name, value in tensors.items():
        parts = name.split(".")
        if parts[0] == "blk" and len(parts) >= 4 and parts[2] in _LAYER_NAMES:
            target, suffix = f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}", parts[3:]
        elif parts[0] in _GLOBAL_NAMES:
            target, suffix = _GLOBAL_NAMES[parts[0]], parts[1:]
        else:
            raise ModelFormatError(f"{path.name}: unexpected tensor '{name}'")
        # The suffix keeps mlx's names apart: `bias` is a linear bias, `biases` quantization offsets.
        renamed[".".join([target, *suffix])] = value
    return renamed


def _layer_bits(weights: dict) -> dict[str, int]:
    """Bits of every quantized module, from its packed width against its scales' width."""
    bits = {}
    for name, scales in weights.items():
        if name.endswith(".scales"):
            module = name.removesuffix(".scales")
            columns = scales.shape[-1] * GROUP_SIZE
            bits[module] = weights[f"{module}.weight"].shape[-1] * 32 // columns
    return bits


def _dominant_float_dtype(tensors: dict) -> mx.Dtype:
    # A quantized GGUF keeps norms in F32 but scales in F16; mixing them would run every
    # activation in fp32, so "the checkpoint's precision" is the dtype holding most values.
    sizes: Counter[mx.Dtype] = Counter()
    for value in tensors.values():
        if mx.issubdtype(value.dtype, mx.floating):
            sizes[value.dtype] += value.size
    return sizes.most_common(1)[0][0] if sizes else mx.float32


def _build_model(config: dict, weights: dict, float_dtype: mx.Dtype, path: Path) -> nn.Module:
    model_class, args_class = model_classes(config, path.name)
    model = model_class(args_class.from_dict(config))
    bits = _layer_bits(weights)
    nn.quantize(
        model, class_predicate=lambda name, _: name in bits and {"group_size": GROUP_SIZE, "bits": bits[name]}
    )
    load_checked_weights(
        model, weights, float_dtype, f"{path.name}: tensors do not fit the {config['model_type']} layout"
    )
    return model


class _FactorRoPE(nn.Module):
    """RoPE whose per-pair frequencies are divided by the GGUF's `rope_freqs` (llama 3.x scaling)."""

    def __init__(self, dims: int, base: float, traditional: bool, factors: mx.array):
        super().__init__()
        self.dims, self.traditional = dims, traditional
        # mx.fast.rope takes wavelength-like periods base^(2i/d); a factor stretches the period.
        self._freqs = base ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims) * factors

    def __call__(self, x: mx.array, offset: int = 0) -> mx.array:
        """Rotate x (..., L, dims) starting at position `offset`."""
        return mx.fast.rope(
            x, self.dims, traditional=self.traditional, base=None, scale=1.0, offset=offset, freqs=self._freqs
        )


def use_rope_factors(model: nn.Module, config: dict, factors: mx.array, path: Path) -> None:
    """Give every attention layer the GGUF's per-pair RoPE frequency factors (llama 3.x)."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if factors.shape != (head_dim // 2,):
        raise ModelFormatError(
            f"{path.name}: rope_freqs has shape {factors.shape}, expected ({head_dim // 2},)"
        )
    factors = factors.astype(mx.float32)
    for layer in model.model.layers:
        layer.self_attn.rope = _FactorRoPE(
            head_dim, config["rope_theta"], config["rope_traditional"], factors
        )
