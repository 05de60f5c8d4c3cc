"""GGUF files (llama.cpp / Ollama / LM Studio) as mlx-lm models, tokenizer and chat template included.

`mx.load` reads the tensors (Q4_0/Q4_1/Q8_0 arrive as MLX affine triples, group size 32); the
model config and the byte-level BPE tokenizer are rebuilt here from the metadata.
"""

from __future__ import annotations

import math
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import mlx.nn as nn

from ..errors import ModelFormatError
from .weights import load_checked_weights, model_classes

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper

GROUP_SIZE = 32  # every GGUF block format that mx.load maps onto MLX quantization has 32 values



@dataclass(frozen=True)
class GGMLType:
    """A ggml tensor type: whether we load it, and what an element costs once loaded."""

    name: str
    native: bool = False  # mx.load hands it over faithfully
    float_bytes: int = 0  # a float type: bytes per element as mx.load returns it
    quant_bits: int = 0  # a 32-value block type: bits per weight (plus a scale and bias per block)


# One table for the loader and the memory estimate. mx.load silently dequantizes some types
# (the K-quants) to float16 at 4-8x their size, so those are refused by name, read from the header.
# It reads BF16 as float16 (2 bytes).
GGML_TYPES = {
    0: GGMLType("F32", True, float_bytes=4), 1: GGMLType("F16", True, float_bytes=2),
    2: GGMLType("Q4_0", True, quant_bits=4), 3: GGMLType("Q4_1", True, quant_bits=4),
    8: GGMLType("Q8_0", True, quant_bits=8), 30: GGMLType("BF16", True, float_bytes=2),
    **{k: GGMLType(name) for k, name in {
        6: "Q5_0", 7: "Q5_1", 9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K",
        15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL",
        21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64",
        28: "F64", 29: "IQ1_M"}.items()},
}
_BF16 = 30


def ggml_type(kind: int) -> GGMLType:
    """The table entry of a ggml type id (an unknown id: a foreign type named by its number)."""
    return GGML_TYPES.get(kind, GGMLType(f"type {kind}"))


# `general.file_type` (llama.cpp's ftype) names, for display.
_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
               11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
               17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}

# llama.cpp's tensor names → mlx-lm's, per layer and global.
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_ROPE_FREQS = "rope_freqs.weight"

# llama.cpp permutes the q/k rows of `llama` checkpoints for its interleaved RoPE, so mlx-lm's
# traditional RoPE on the rows as stored is exact (measured: SmolLM2 matches an independent fp32
# reference token for token; rope_traditional=False matches none). qwen2 is stored unpermuted (NEOX).
_ARCHITECTURES = {"llama": {"rope_traditional": True}, "qwen2": {"rope_traditional": False}}

# Pre-tokenizer regexes by `tokenizer.ggml.pre`, as llama.cpp applies them: each splits in turn.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")  # Qwen2 splits digits one by one
_DIGITS_THEN_GPT2 = (r"\p{N}", _GPT2_SPLIT)
# name → (splits, ignore_merges, add_bos when the metadata does not say); llama 3 looks whole
# pieces up in the vocabulary before merging and prepends BOS, as in llama.cpp.
_PRE_TOKENIZERS = {
    "default": ((r"[\p{P}\$\+<=>\^~\|]+", _GPT2_SPLIT, r"\p{N}+", r"[0-9][0-9][0-9]"), False, False),
    "gpt-2": ((_GPT2_SPLIT,), False, False), "gpt2": ((_GPT2_SPLIT,), False, False),
    "smollm": (_DIGITS_THEN_GPT2, False, False), "starcoder": (_DIGITS_THEN_GPT2, False, False),
    "refact": (_DIGITS_THEN_GPT2, False, False),
    "llama-bpe": ((_LLAMA3_SPLIT,), True, True), "llama3": ((_LLAMA3_SPLIT,), True, True),
    "llama-v3": ((_LLAMA3_SPLIT,), True, True), "falcon3": ((_LLAMA3_SPLIT,), True, True),
    "smaug-bpe": ((_LLAMA3_SPLIT,), False, False),
    "qwen2": ((_QWEN2_SPLIT,), False, False), "deepseek-r1-qwen": ((_QWEN2_SPLIT,), False, False),
}
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types


def load_gguf(path: Path, float_dtype: mx.Dtype | None) -> tuple[nn.Module, TokenizerWrapper, dict]:
    """Build an mlx-lm model, its tokenizer and an mlx-lm style config from a GGUF file.

    float_dtype: every floating tensor (quantization scales and norms included) is cast to it;
    None keeps the checkpoint's precision, i.e. the float dtype holding most of its values.
    """
    path = Path(path)
    tensors, meta = _read(path)
    arch = _meta(meta, "general.architecture", path)
    if arch not in _ARCHITECTURES:
        raise ModelFormatError(f"{path.name}: architecture '{arch}' is not supported "
                               f"(supported: {', '.join(_ARCHITECTURES)})")
    _check_tensor_types(path, tensors)
    tokenizer = build_tokenizer(meta, path)
    rope_factors = tensors.pop(_ROPE_FREQS, None)
    weights = _rename(tensors, path)
    config = _config(meta, arch, weights, path, rope_factors)
    model = _build_model(config, weights, float_dtype or _dominant_float_dtype(weights), path)
    if rope_factors is not None:
        use_rope_factors(model, config, rope_factors, path)
    config["eos_token_id"] = sorted(tokenizer.eos_token_ids)
    return model, tokenizer, config


def _read(path: Path) -> tuple[dict, dict]:
    try:
        return mx.load(str(path), return_metadata=True)
    except Exception as exc:  # mlx raises plain RuntimeError/ValueError for any unreadable file
        _refuse_foreign_types(path, _header_types_or_none(path))  # names the type, if that is why
        reason = (str(exc).splitlines() or [type(exc).__name__])[0].removeprefix("[load_gguf] ")
        raise ModelFormatError(f"{path.name}: cannot read as GGUF ({reason})") from exc


def _meta(meta: dict, key: str, path: Path, default: Any = ...) -> Any:
    """A metadata value as a Python scalar, str or list; a missing required key names the file."""
    if key not in meta:
        if default is ...:
            raise ModelFormatError(f"{path.name}: GGUF metadata lacks '{key}'")
        return default
    value = meta[key]
    if isinstance(value, mx.array):
        if value.size != 1:
            raise ModelFormatError(f"{path.name}: metadata '{key}' has one value per layer; "
                                   "only uniform layers are supported")
        return value.item()
    return value


_METADATA_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                     10: "<Q", 11: "<q", 12: "<d"}
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

        def string() -> str:
            return handle.read(unpack("<Q")).decode("utf-8")

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


def _header_types_or_none(path: Path) -> dict[str, int] | None:
    try:
        return tensor_types(path)
    except (OSError, ValueError, struct.error, UnicodeDecodeError):
        return None


def _refuse_foreign_types(path: Path, types: dict[str, int] | None) -> None:
    foreign = {name: kind for name, kind in (types or {}).items() if not ggml_type(kind).native}
    if foreign:
        first, kind = next(iter(foreign.items()))
        kinds = sorted({ggml_type(k).name for k in foreign.values()})
        raise ModelFormatError(
            f"{path.name}: {len(foreign)} tensor(s) use {'/'.join(kinds)} (first: '{first}', "
            f"{ggml_type(kind).name}); only F32/F16/BF16/Q4_0/Q4_1/Q8_0 GGUF "
            "tensors are supported — pick a Q4_0, Q8_0 or F16 file")


def _check_tensor_types(path: Path, tensors: dict) -> None:
    types = _header_types_or_none(path)
    if types is None:
        raise ModelFormatError(f"{path.name}: unreadable GGUF header")
    _refuse_foreign_types(path, types)
    for name, kind in types.items():
        # mx.load reads BF16 as float16, whose range ends at 65504.
        if kind == _BF16 and not mx.all(mx.isfinite(tensors[name])).item():
            raise ModelFormatError(f"{path.name}: BF16 tensor '{name}' holds values beyond the "
                                   "float16 range that mx.load reads it into")


def _config(meta: dict, arch: str, weights: dict, path: Path, rope_factors: mx.array | None) -> dict:
    def get(key, default=...):
        return _meta(meta, f"{arch}.{key}", path, default)

    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", hidden // heads))
    if int(get("rope.dimension_count", head_dim)) != head_dim:
        raise ModelFormatError(f"{path.name}: partial rotary embeddings are not supported")
    config = {
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": int(get("block_count")),
        "intermediate_size": int(get("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "rms_norm_eps": _decimal(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": _decimal(get("rope.freq_base", 10000.0)),
        "vocab_size": int(get("vocab_size", len(_meta(meta, "tokenizer.ggml.tokens", path)))),
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
        config["rope_freqs"] = [float(f) for f in rope_factors.astype(mx.float32).tolist()]
    file_type = _meta(meta, "general.file_type", path, None)
    config["gguf_file_type"] = ("unknown" if file_type is None
                                else _FILE_TYPES.get(file_type, f"type {file_type}"))
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
    return {"quantization": {"group_size": GROUP_SIZE, "bits": common, "mode": "affine", **overrides},
            "quantization_label": f"GGUF {file_type} ({common}-bit)"}


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
    sizes = Counter()
    for value in tensors.values():
        if mx.issubdtype(value.dtype, mx.floating):
            sizes[value.dtype] += value.size
    return sizes.most_common(1)[0][0] if sizes else mx.float32


def _build_model(config: dict, weights: dict, float_dtype: mx.Dtype, path: Path) -> nn.Module:
    model_class, args_class = model_classes(config, path.name)
    model = model_class(args_class.from_dict(config))
    bits = _layer_bits(weights)
    nn.quantize(model, class_predicate=lambda name, _: name in bits and
                {"group_size": GROUP_SIZE, "bits": bits[name]})
    load_checked_weights(model, weights, float_dtype,
                         f"{path.name}: tensors do not fit the {config['model_type']} layout")
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
        return mx.fast.rope(x, self.dims, traditional=self.traditional, base=None, scale=1.0,
                            offset=offset, freqs=self._freqs)


def use_rope_factors(model: nn.Module, config: dict, factors: mx.array, path: Path) -> None:
    """Give every attention layer the GGUF's per-pair RoPE frequency factors (llama 3.x)."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if factors.shape != (head_dim // 2,):
        raise ModelFormatError(f"{path.name}: rope_freqs has shape {factors.shape}, "
                               f"expected ({head_dim // 2},)")
    factors = factors.astype(mx.float32)
    for layer in model.model.layers:
        layer.self_attn.rope = _FactorRoPE(head_dim, config["rope_theta"], config["rope_traditional"],
                                           factors)


def build_tokenizer(meta: dict, path: Path) -> TokenizerWrapper:
    """The GGUF's byte-level BPE tokenizer and chat template as an mlx-lm TokenizerWrapper."""
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    kind = _meta(meta, "tokenizer.ggml.model", path)
    if kind != "gpt2":
        raise ModelFormatError(f"{path.name}: tokenizer model '{kind}' is not supported "
                               "(only byte-level BPE, 'gpt2'; SentencePiece 'llama' is not)")
    pre = _meta(meta, "tokenizer.ggml.pre", path, "default")  # llama.cpp's fallback too
    if pre not in _PRE_TOKENIZERS:
        raise ModelFormatError(f"{path.name}: pre-tokenizer '{pre}' is not supported "
                               f"(supported: {', '.join(sorted(_PRE_TOKENIZERS))})")
    splits, ignore_merges, add_bos_default = _PRE_TOKENIZERS[pre]
    tokens = list(_meta(meta, "tokenizer.ggml.tokens", path))
    merges = [tuple(m.split(" ", 1)) for m in _meta(meta, "tokenizer.ggml.merges", path, [])]
    types = meta.get("tokenizer.ggml.token_type")
    types = types.tolist() if isinstance(types, mx.array) else [1] * len(tokens)

    backend = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                                   ignore_merges=ignore_merges))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(rx), behavior="isolated") for rx in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    # Control tokens are special (matched whole, skippable); user-defined ones are plain text.
    backend.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                for i, t in enumerate(types) if t == _CONTROL])
    backend.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                        for i, t in enumerate(types) if t == _USER_DEFINED])

    ids = {key: _meta(meta, f"tokenizer.ggml.{key}_token_id", path, None)
           for key in ("bos", "eos", "eot", "padding", "unknown")}
    ids = {key: index for key, index in ids.items() if index is not None and index < len(tokens)}
    text = {key: tokens[index] for key, index in ids.items()}
    if "bos" in ids and bool(_meta(meta, "tokenizer.ggml.add_bos_token", path, add_bos_default)):
        backend.post_processor = processors.TemplateProcessing(
            single=f"{text['bos']} $A", pair=f"{text['bos']} $A $B",
            special_tokens=[(text["bos"], ids["bos"])])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=text.get("bos"), eos_token=text.get("eos"),
        pad_token=text.get("padding"), unk_token=text.get("unknown"),
        chat_template=_meta(meta, "tokenizer.chat_template", path, None),
        clean_up_tokenization_spaces=False)
    # End of turn ends generation too (llama 3 instruct: <|eot_id|>).
    return TokenizerWrapper(hf, detokenizer_class=BPEStreamingDetokenizer,
                            eos_token_ids=[ids[key] for key in ("eos", "eot") if key in ids])
