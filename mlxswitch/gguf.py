"""GGUF files (llama.cpp / Ollama / LM Studio) as mlx-lm models, tokenizer and chat template included.

mlx-lm can write GGUF but not read it back into a model with its tokenizer; `mx.load` reads the
tensors (Q4_0/Q4_1/Q8_0 arrive as MLX affine triples), the rest is rebuilt from the metadata here.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from .errors import ModelFormatError

# llama.cpp's tensor names → mlx-lm's, per layer and global.
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

# llama.cpp permutes q/k rows of `llama` checkpoints for its interleaved RoPE, so mlx-lm's
# traditional RoPE on the unpermuted rows is exact (measured: SmolLM2 matches an fp32 reference);
# qwen2 checkpoints are stored unpermuted (NEOX RoPE).
_ARCHITECTURES = {"llama": {"rope_traditional": True}, "qwen2": {"rope_traditional": False}}

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
                 r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
                r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Pre-tokenizer regexes by `tokenizer.ggml.pre`; each entry splits in order.
_PRE_TOKENIZERS = {
    "default": [_GPT2_SPLIT], "gpt2": [_GPT2_SPLIT],
    "smollm": [r"\p{N}", _GPT2_SPLIT], "starcoder": [r"\p{N}", _GPT2_SPLIT],
    "refact": [r"\p{N}", _GPT2_SPLIT],
    "llama-bpe": [_LLAMA3_SPLIT], "llama3": [_LLAMA3_SPLIT],
    "qwen2": [_QWEN2_SPLIT],
}
_CONTROL_TOKEN_TYPES = {3, 4}  # llama.cpp: 3 control, 4 user-defined


def load_gguf(path: Path, float_dtype: mx.Dtype | None) -> tuple[nn.Module, object, dict]:
    """Build an mlx-lm model, its tokenizer and an mlx-lm style config from a GGUF file."""
    tensors, meta = _read(path)
    arch = _scalar(meta, "general.architecture", path)
    if arch not in _ARCHITECTURES:
        raise ModelFormatError(
            f"{path.name}: architecture '{arch}' is not supported (supported: {', '.join(_ARCHITECTURES)})")
    tokenizer = build_tokenizer(meta, path)
    config = _config(meta, arch, tensors, path, vocab_size=len(meta["tokenizer.ggml.tokens"]))
    model = _build_model(config, _rename(tensors, path), float_dtype, path)
    return model, tokenizer, config


def _read(path: Path) -> tuple[dict, dict]:
    try:
        tensors, meta = mx.load(str(path), return_metadata=True)
    except Exception as exc:  # mlx raises plain ValueError/RuntimeError for any unreadable file
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelFormatError(f"{path.name}: cannot read as GGUF ({reason}); only F32/F16/Q4_0/"
                               "Q4_1/Q8_0 tensors are supported") from exc
    return tensors, meta


def _scalar(meta: dict, key: str, path: Path, default=None):
    if key not in meta:
        if default is not None:
            return default
        raise ModelFormatError(f"{path.name}: GGUF metadata lacks '{key}'")
    value = meta[key]
    return value.item() if isinstance(value, mx.array) else value


def _config(meta: dict, arch: str, tensors: dict, path: Path, vocab_size: int) -> dict:
    def get(key, default=None):
        return _scalar(meta, f"{arch}.{key}", path, default)

    heads = int(get("attention.head_count"))
    config = {
        "model_type": arch,
        "hidden_size": int(get("embedding_length")),
        "num_hidden_layers": int(get("block_count")),
        "intermediate_size": int(get("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "vocab_size": int(get("vocab_size", vocab_size)),
        "max_position_embeddings": int(get("context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in tensors,
        **_ARCHITECTURES[arch],
    }
    if arch == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in tensors
    bits = _bits(tensors.get("blk.0.attn_q.weight"), tensors.get("blk.0.attn_q.scales"))
    config["quantization_label"] = f"GGUF {bits}-bit" if bits else "GGUF float"
    return config


def _bits(weight: mx.array | None, scales: mx.array | None, group_size: int = 32) -> int | None:
    if weight is None or scales is None or weight.dtype != mx.uint32:
        return None
    columns = scales.shape[-1] * group_size
    return weight.shape[-1] * 32 // columns


def _rename(tensors: dict, path: Path) -> dict:
    renamed = {}
    for name, value in tensors.items():
        parts = name.split(".")
        if parts[0] == "blk":
            base = _LAYER_NAMES.get(parts[2])
            if base is None:
                raise ModelFormatError(f"{path.name}: unexpected tensor '{name}'")
            target = f"model.layers.{parts[1]}.{base}"
            suffix = parts[3:]
        elif parts[0] in _GLOBAL_NAMES:
            target, suffix = _GLOBAL_NAMES[parts[0]], parts[1:]
        elif parts[0] in ("rope_freqs",):
            continue  # recomputed from rope_theta
        else:
            raise ModelFormatError(f"{path.name}: unexpected tensor '{name}'")
        # `bias` is a linear bias; `biases` are quantization offsets (mlx's naming).
        renamed[".".join([target, *suffix])] = value
    return renamed


def _build_model(config: dict, weights: dict, float_dtype: mx.Dtype | None, path: Path) -> nn.Module:
    from mlx_lm.utils import _get_classes

    from .loading import load_checked_weights

    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))

    def quantization(module_path: str, module: nn.Module):
        scales = weights.get(f"{module_path}.scales")
        if scales is None:
            return False
        bits = _bits(weights[f"{module_path}.weight"], scales)
        if bits not in (4, 8):
            raise ModelFormatError(f"{path.name}: tensor '{module_path}' has an unsupported {bits}-bit layout")
        return {"group_size": 32, "bits": bits}

    nn.quantize(model, class_predicate=quantization)
    load_checked_weights(model, weights, float_dtype,
                         f"{path.name}: tensors do not fit the {config['model_type']} layout")
    return model


def build_tokenizer(meta: dict, path: Path):
    """The GGUF's byte-level BPE tokenizer and chat template as an mlx-lm TokenizerWrapper."""
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    kind = _scalar(meta, "tokenizer.ggml.model", path)
    if kind != "gpt2":
        raise ModelFormatError(f"{path.name}: tokenizer model '{kind}' is not supported (only byte-level BPE, 'gpt2')")
    pre = _scalar(meta, "tokenizer.ggml.pre", path, "default")
    if pre not in _PRE_TOKENIZERS:
        raise ModelFormatError(f"{path.name}: pre-tokenizer '{pre}' is not supported "
                               f"(supported: {', '.join(sorted(_PRE_TOKENIZERS))})")
    tokens = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    types = meta.get("tokenizer.ggml.token_type")
    types = types.tolist() if isinstance(types, mx.array) else list(types or [1] * len(tokens))

    backend = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                                   ignore_merges=False))
    splits = [pre_tokenizers.Split(Regex(rx), behavior="isolated") for rx in _PRE_TOKENIZERS[pre]]
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    specials = [AddedToken(tokens[i], special=True, normalized=False)
                for i, kind in enumerate(types) if kind in _CONTROL_TOKEN_TYPES]
    backend.add_special_tokens(specials)

    def token(key):
        index = meta.get(f"tokenizer.ggml.{key}_token_id")
        return None if index is None else tokens[int(index.item() if isinstance(index, mx.array) else index)]

    add_bos = meta.get("tokenizer.ggml.add_bos_token")
    add_bos = bool(add_bos.item() if isinstance(add_bos, mx.array) else add_bos)
    if add_bos and token("bos") is not None:
        from tokenizers import processors

        bos = token("bos")
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, tokens.index(bos))])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=token("bos"), eos_token=token("eos"),
        pad_token=token("padding"), unk_token=token("unknown"),
        chat_template=meta.get("tokenizer.chat_template"), clean_up_tokenization_spaces=False)
    return TokenizerWrapper(hf, detokenizer_class=BPEStreamingDetokenizer)
