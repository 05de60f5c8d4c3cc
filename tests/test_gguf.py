"""The GGUF loader against an independent NumPy implementation of the same weights."""

from __future__ import annotations

import numpy as np
import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from mlxswitch.errors import ModelFormatError
from mlxswitch.gguf import load_gguf
from mlxswitch.loading import load_model
from mlxswitch.resources import embedded_gguf_path

CHAT_PROMPTS = ["What is the capital of France?", "Name three colours."]


@pytest.fixture(scope="module")
def smollm():
    return load_model("embedded")


def _unpack(weight: np.ndarray, bits: int) -> np.ndarray:
    """uint32 words → unsigned ints, lowest bits first (MLX's affine packing)."""
    per_word = 32 // bits
    shifts = np.arange(per_word, dtype=np.uint32) * bits
    values = (weight[..., None] >> shifts) & np.uint32((1 << bits) - 1)
    return values.reshape(*weight.shape[:-1], weight.shape[-1] * per_word)


def _dequantize(tensors: dict, name: str) -> np.ndarray:
    weight = np.asarray(tensors[f"{name}.weight"])
    if f"{name}.scales" not in tensors:
        return weight.astype(np.float32)
    scales = np.asarray(tensors[f"{name}.scales"].astype(mx.float32))
    biases = np.asarray(tensors[f"{name}.biases"].astype(mx.float32))
    bits = weight.shape[-1] * 32 // (scales.shape[-1] * 32)
    q = _unpack(weight, bits).astype(np.float32)
    q = q.reshape(*scales.shape, 32)
    return (q * scales[..., None] + biases[..., None]).reshape(weight.shape[0], -1)


class NumpyLlama:
    """Plain fp32 llama forward over the whole prefix (no cache), with interleaved RoPE."""

    def __init__(self, path):
        tensors, meta = mx.load(str(path), return_metadata=True)
        get = lambda key: meta[f"llama.{key}"].item()  # noqa: E731
        self.layers = get("block_count")
        self.heads, self.kv_heads = get("attention.head_count"), get("attention.head_count_kv")
        self.eps, self.theta = get("attention.layer_norm_rms_epsilon"), get("rope.freq_base")
        self.w = {}
        for name in {n.rsplit(".", 1)[0] for n in tensors}:
            self.w[name] = _dequantize(tensors, name)

    def _norm(self, x, weight):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * weight

    def _rope(self, x):  # x: (heads, T, d); rotate pairs (2i, 2i+1)
        d = x.shape[-1]
        pos = np.arange(x.shape[1])[:, None]
        freqs = self.theta ** (-np.arange(0, d, 2) / d)
        angle = pos * freqs[None, :]
        cos, sin = np.cos(angle), np.sin(angle)
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = even * cos - odd * sin
        out[..., 1::2] = even * sin + odd * cos
        return out

    def logits(self, ids: list[int]) -> np.ndarray:
        w = self.w
        x = w["token_embd"][ids]
        T = len(ids)
        mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)
        for i in range(self.layers):
            p = f"blk.{i}."
            h = self._norm(x, w[p + "attn_norm"])
            q = (h @ w[p + "attn_q"].T).reshape(T, self.heads, -1).transpose(1, 0, 2)
            k = (h @ w[p + "attn_k"].T).reshape(T, self.kv_heads, -1).transpose(1, 0, 2)
            v = (h @ w[p + "attn_v"].T).reshape(T, self.kv_heads, -1).transpose(1, 0, 2)
            q, k = self._rope(q), self._rope(k)
            group = self.heads // self.kv_heads
            k, v = np.repeat(k, group, axis=0), np.repeat(v, group, axis=0)
            scores = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1]) + mask
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            attn = (scores / scores.sum(-1, keepdims=True)) @ v
            x = x + attn.transpose(1, 0, 2).reshape(T, -1) @ w[p + "attn_output"].T
            h = self._norm(x, w[p + "ffn_norm"])
            gate = h @ w[p + "ffn_gate"].T
            x = x + ((gate / (1 + np.exp(-gate))) * (h @ w[p + "ffn_up"].T)) @ w[p + "ffn_down"].T
        return self._norm(x[-1], w["output_norm"]) @ w["token_embd"].T


def _entropy_bits(logits: np.ndarray) -> float:
    z = logits.astype(np.float64) - logits.max()
    p = np.exp(z) / np.exp(z).sum()
    return float(-(p[p > 0] * np.log2(p[p > 0])).sum())


def test_greedy_tokens_match_an_independent_numpy_reference(smollm):
    reference = NumpyLlama(embedded_gguf_path())
    for prompt in CHAT_PROMPTS:
        ids = smollm.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                   add_generation_prompt=True)
        cache = make_prompt_cache(smollm.model)
        ours, theirs = list(ids), list(ids)
        logits = smollm.model(mx.array(ids)[None], cache=cache)[0, -1]
        for _ in range(10):
            expected = reference.logits(theirs)
            got = np.asarray(logits.astype(mx.float32))
            assert int(got.argmax()) == int(expected.argmax())
            assert abs(_entropy_bits(got) - _entropy_bits(expected)) < 1e-2
            token = int(got.argmax())
            ours.append(token)
            theirs.append(token)
            logits = smollm.model(mx.array([token])[None], cache=cache)[0, -1]


def test_embedded_model_answers_paris_through_its_chat_template(smollm):
    from mlx_lm.generate import stream_generate

    ids = smollm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True)
    text = "".join(r.text for r in stream_generate(smollm.model, smollm.tokenizer, ids, max_tokens=12))
    assert "Paris" in text


def test_chat_template_and_tokenizer_come_from_the_metadata(smollm):
    tokenizer = smollm.tokenizer
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}],
                                             add_generation_prompt=True, tokenize=False)
    assert rendered.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    for text in ["Hello world 12345", "héllo 日本語 ✓", "def f(x):\n    return x ** 2\n"]:
        assert tokenizer.decode(tokenizer.encode(text)) == text
    # SmolLM splits digits one by one, and chat markers are single special tokens.
    assert len(tokenizer.encode("12345")) == 5
    assert tokenizer.encode("<|im_start|>") == [1]
    assert tokenizer.eos_token_ids == {2}
    assert smollm.config["rope_traditional"] is True
    assert smollm.model.model.embed_tokens.weight.dtype == mx.uint32  # Q8_0 stays quantized


def test_cpu_policy_computes_in_float32(smollm):
    attn = smollm.model.model.layers[0].self_attn.q_proj
    assert attn.scales.dtype == mx.float32 and attn.biases.dtype == mx.float32


def _write_tiny_gguf(path, arch: str, with_bias: bool):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from tinymodels import train_tokenizer

    tok = train_tokenizer(300)
    vocab = tok.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    import json

    merges = [" ".join(m) if isinstance(m, list) else m
              for m in json.loads(tok.to_str())["model"]["merges"]]
    V, H, F, L = len(tokens), 32, 64, 2
    mx.random.seed(3)
    arrays = {"token_embd.weight": mx.random.normal((V, H)) * 0.3,
              "output.weight": mx.random.normal((V, H)),
              "output_norm.weight": mx.ones((H,))}
    for i in range(L):
        p = f"blk.{i}."
        arrays.update({p + "attn_norm.weight": mx.ones((H,)), p + "ffn_norm.weight": mx.ones((H,)),
                       p + "attn_q.weight": mx.random.normal((H, H)) * 0.2,
                       p + "attn_k.weight": mx.random.normal((H // 2, H)) * 0.2,
                       p + "attn_v.weight": mx.random.normal((H // 2, H)) * 0.2,
                       p + "attn_output.weight": mx.random.normal((H, H)) * 0.2,
                       p + "ffn_gate.weight": mx.random.normal((F, H)) * 0.2,
                       p + "ffn_up.weight": mx.random.normal((F, H)) * 0.2,
                       p + "ffn_down.weight": mx.random.normal((H, F)) * 0.2})
        if with_bias:
            for name, n in (("attn_q", H), ("attn_k", H // 2), ("attn_v", H // 2)):
                arrays[p + f"{name}.bias"] = mx.random.normal((n,)) * 0.1
    meta = {
        "general.architecture": arch,
        f"{arch}.block_count": mx.array(L, dtype=mx.uint32),
        f"{arch}.embedding_length": mx.array(H, dtype=mx.uint32),
        f"{arch}.feed_forward_length": mx.array(F, dtype=mx.uint32),
        f"{arch}.attention.head_count": mx.array(4, dtype=mx.uint32),
        f"{arch}.attention.head_count_kv": mx.array(2, dtype=mx.uint32),
        f"{arch}.attention.layer_norm_rms_epsilon": mx.array(1e-5, dtype=mx.float32),
        f"{arch}.rope.freq_base": mx.array(10000.0, dtype=mx.float32),
        f"{arch}.context_length": mx.array(256, dtype=mx.uint32),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2" if arch == "qwen2" else "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.token_type": mx.array([3 if t.startswith("<|") else 1 for t in tokens],
                                              dtype=mx.int32),
        "tokenizer.ggml.eos_token_id": mx.array(vocab["<|im_end|>"], dtype=mx.uint32),
    }
    mx.save_gguf(str(path), arrays, meta)
    return arrays


@pytest.mark.parametrize("arch,with_bias", [("qwen2", True), ("llama", False)])
def test_tiny_gguf_matches_the_same_weights_in_mlx_lm(tmp_path, arch, with_bias):
    from mlx_lm.utils import _get_classes

    path = tmp_path / f"tiny-{arch}.gguf"
    arrays = _write_tiny_gguf(path, arch, with_bias)
    model, tokenizer, config = load_gguf(path, mx.float32)
    assert tokenizer.decode(tokenizer.encode("The capital of France")) == "The capital of France"
    # The same tensors placed by hand into mlx-lm's class with the rope layout we claim.
    model_class, args_class = _get_classes(config)
    direct = model_class(args_class.from_dict(config))
    names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
             "ffn_norm": "post_attention_layernorm"}
    weights = {"model.embed_tokens.weight": arrays["token_embd.weight"],
               "lm_head.weight": arrays["output.weight"], "model.norm.weight": arrays["output_norm.weight"]}
    for name, value in arrays.items():
        if name.startswith("blk."):
            _, layer, kind, leaf = name.split(".")
            weights[f"model.layers.{layer}.{names[kind]}.{leaf}"] = value
    direct.load_weights(list(weights.items()))
    ids = mx.array(tokenizer.encode("The quick brown fox"))[None]
    assert mx.allclose(model(ids), direct(ids), atol=1e-4).item()
    assert config["rope_traditional"] is (arch == "llama")


def test_unsupported_architecture_is_named(tmp_path):
    path = tmp_path / "odd.gguf"
    mx.save_gguf(str(path), {"x.weight": mx.zeros((2, 2))}, {"general.architecture": "mamba"})
    with pytest.raises(ModelFormatError, match="architecture 'mamba' is not supported"):
        load_gguf(path, mx.float32)


def test_garbage_file_is_a_format_error(tmp_path):
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"this is not a model" * 10)
    with pytest.raises(ModelFormatError, match="broken.gguf: cannot read as GGUF"):
        load_gguf(path, mx.float32)
    path.write_bytes(b"GGUF" + b"\x00" * 64)  # a valid but empty header
    with pytest.raises(ModelFormatError, match="lacks 'general.architecture'"):
        load_gguf(path, mx.float32)


def test_sentencepiece_tokenizer_is_refused(tmp_path):
    path = tmp_path / "spm.gguf"
    _write_tiny_gguf(path, "llama", False)
    tensors, meta = mx.load(str(path), return_metadata=True)
    meta["tokenizer.ggml.model"] = "llama"
    mx.save_gguf(str(path), tensors, meta)
    with pytest.raises(ModelFormatError, match="tokenizer model 'llama' is not supported"):
        load_gguf(path, mx.float32)
