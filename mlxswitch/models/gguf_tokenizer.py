"""A GGUF's byte-level BPE tokenizer and chat template, rebuilt from its metadata as llama.cpp reads them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import mlx.core as mx

from ..errors import ModelFormatError
from .gguf_reader import meta_value

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper

# Pre-tokenizer regexes by `tokenizer.ggml.pre`, as llama.cpp applies them: each splits in turn.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")  # Qwen2 splits digits one by one
_DIGITS_THEN_GPT2 = (r"\p{N}", _GPT2_SPLIT)
# name → (splits, ignore_merges, add_bos when the metadata does not say); llama 3 looks whole
# pieces up in the vocabulary before merging and prepends BOS, as in llama.cpp.
_PRE_TOKENIZERS = {
    "default": ((r"[\p{P}\$\+<=>\^~\|]+", _GPT2_SPLIT, r"\p{N}+", r"[0-9][0-9][0-9]"), False, False),
    "gpt-2": ((_GPT2_SPLIT,), False, False),
    "gpt2": ((_GPT2_SPLIT,), False, False),
    "smollm": (_DIGITS_THEN_GPT2, False, False),
    "starcoder": (_DIGITS_THEN_GPT2, False, False),
    "refact": (_DIGITS_THEN_GPT2, False, False),
    "llama-bpe": ((_LLAMA3_SPLIT,), True, True),
    "llama3": ((_LLAMA3_SPLIT,), True, True),
    "llama-v3": ((_LLAMA3_SPLIT,), True, True),
    "falcon3": ((_LLAMA3_SPLIT,), True, True),
    "smaug-bpe": ((_LLAMA3_SPLIT,), False, False),
    "qwen2": ((_QWEN2_SPLIT,), False, False),
    "deepseek-r1-qwen": ((_QWEN2_SPLIT,), False, False),
}
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types


def build_tokenizer(meta: dict, path: Path) -> TokenizerWrapper:
    """The GGUF's byte-level BPE tokenizer and chat template as an mlx-lm TokenizerWrapper."""
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
    )
    from transformers import PreTrainedTokenizerFast

    kind = meta_value(meta, "tokenizer.ggml.model", path)
    if kind != "gpt2":
        raise ModelFormatError(
            f"{path.name}: tokenizer model '{kind}' is not supported "
            "(only byte-level BPE, 'gpt2'; SentencePiece 'llama' is not)"
        )
    pre = meta_value(meta, "tokenizer.ggml.pre", path, "default")  # llama.cpp's fallback too
    if pre not in _PRE_TOKENIZERS:
        raise ModelFormatError(
            f"{path.name}: pre-tokenizer '{pre}' is not supported "
            f"(supported: {', '.join(sorted(_PRE_TOKENIZERS))})"
        )
    splits, ignore_merges, add_bos_default = _PRE_TOKENIZERS[pre]
    tokens = list(meta_value(meta, "tokenizer.ggml.tokens", path))
    merges = [tuple(m.split(" ", 1)) for m in meta_value(meta, "tokenizer.ggml.merges", path, [])]
    token_types = meta.get("tokenizer.ggml.token_type")
    types: list[int] = (
        token_types.tolist()  # type: ignore[assignment]  # mlx: any nesting; this array is 1-D
        if isinstance(token_types, mx.array)
        else [1] * len(tokens)
    )

    backend = Tokenizer(
        models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, ignore_merges=ignore_merges)
    )
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(rx), behavior="isolated") for rx in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    backend.decoder = decoders.ByteLevel()
    # Control tokens are special (matched whole, skippable); user-defined ones are plain text.
    backend.add_special_tokens(
        [AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == _CONTROL]
    )
    backend.add_tokens(
        [
            AddedToken(tokens[i], special=False, normalized=False)
            for i, t in enumerate(types)
            if t == _USER_DEFINED
        ]
    )

    ids = {
        key: meta_value(meta, f"tokenizer.ggml.{key}_token_id", path, None)
        for key in ("bos", "eos", "eot", "padding", "unknown")
    }
    ids = {key: index for key, index in ids.items() if index is not None and index < len(tokens)}
    text = {key: tokens[index] for key, index in ids.items()}
    if "bos" in ids and bool(meta_value(meta, "tokenizer.ggml.add_bos_token", path, add_bos_default)):
        backend.post_processor = processors.TemplateProcessing(
            single=f"{text['bos']} $A",
            pair=f"{text['bos']} $A $B",
            special_tokens=[(text["bos"], ids["bos"])],
        )
    hf = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=text.get("bos"),
        eos_token=text.get("eos"),
        pad_token=text.get("padding"),
        unk_token=text.get("unknown"),
        chat_template=meta_value(meta, "tokenizer.chat_template", path, None),
        clean_up_tokenization_spaces=False,
    )
    # End of turn ends generation too (llama 3 instruct: <|eot_id|>).
    return TokenizerWrapper(
        hf,
        detokenizer_class=BPEStreamingDetokenizer,
        eos_token_ids=[ids[key] for key in ("eos", "eot") if key in ids],
    )
