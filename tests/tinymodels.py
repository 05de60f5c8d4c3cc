"""Tiny random-weight mlx-lm models with a locally trained BPE tokenizer, saved as mlx-lm dirs."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CORPUS = [
    "The capital of France is Paris. The capital of Italy is Rome.",
    "What is the capital of Germany? Berlin is the capital of Germany.",
    "Entropy measures how unsure a model is about the next token.",
    "A small model answers easy questions; a large model answers hard ones.",
    "One two three four five six seven eight nine ten eleven twelve.",
    "The quick brown fox jumps over the lazy dog while the cat sleeps.",
    "Hello, how are you today? I am fine, thank you for asking!",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
] * 8


def train_tokenizer(vocab_size: int = 320, corpus: list[str] | None = None) -> Tokenizer:
    """A byte-level BPE tokenizer trained on a small corpus, with chat special tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus or CORPUS, trainer=trainer)
    return tok


def llama_config(
    vocab_size: int,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    tie: bool = False,
) -> dict:
    """An mlx-lm llama config.json for a tiny model."""
    return {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": intermediate,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-5,
        "vocab_size": vocab_size,
        "rope_theta": 10000.0,
        "tie_word_embeddings": tie,
        "max_position_embeddings": 512,
        "eos_token_id": 2,
    }


def make_model(config: dict, seed: int) -> nn.Module:
    """Instantiate mlx-lm's model class for `config` with seeded random fp32 weights."""
    from mlxswitch.models.weights import model_classes

    model_class, args_class = model_classes(config, "test model")
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    # A wide output head spreads the logits so entropies vary (0-4 bits) from token to token;
    # default inits give near-uniform distributions and degenerate repeats.
    params = [
        (k, mx.random.normal(v.shape, scale=1.0 if "lm_head" in k else 0.2))
        for k, v in tree_flatten(model.parameters())
        if not k.endswith("norm.weight")
    ]
    model.load_weights(params, strict=False)
    mx.eval(model.parameters())
    return model


def save_model_dir(out: Path, model: nn.Module, config: dict, tokenizer: Tokenizer) -> Path:
    """Write an mlx-lm model directory (config, safetensors, tokenizer files)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "chat_template": CHAT_TEMPLATE,
                "model_max_length": config.get("max_position_embeddings", 512),
            }
        )
    )
    return out


def make_pair_dirs(root: Path, seed: int = 0, vocab_size: int = 320) -> tuple[Path, Path]:
    """A small and a large tiny llama sharing one tokenizer, saved under root/small and root/large."""
    tok = train_tokenizer(vocab_size)
    vocab = tok.get_vocab_size()
    small_cfg = llama_config(vocab, hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64)
    large_cfg = llama_config(vocab, hidden=64, layers=3, heads=4, kv_heads=2, intermediate=128)
    small = save_model_dir(root / "small", make_model(small_cfg, seed), small_cfg, tok)
    large = save_model_dir(root / "large", make_model(large_cfg, seed + 1), large_cfg, tok)
    return small, large
