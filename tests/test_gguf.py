"""The GGUF loader: the embedded SmolLM2 against an independent NumPy llama, tiny synthetic files
against the same weights in mlx-lm, and every refusal as a ModelFormatError naming the problem."""

from __future__ import annotations

import json
import struct

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache
from tinymodels import train_tokenizer

from mlxswitch.errors import ModelFormatError
from mlxswitch.models.gguf import load_gguf
from mlxswitch.models.loading import load_gguf_file
from mlxswitch.models.weights import model_classes
from mlxswitch.resources import embedded_gguf_path

CHAT_PROMPTS = ["What is the capital of France?", "Name three colours."]


@pytest.fixture(scope="module")
def smollm():
    """The embedded SmolLM2 as the CPU policy loads it: (model, tokenizer, config) in fp32."""
    return load_gguf(embedded_gguf_path(), mx.float32)


# -- the embedded SmolLM2 -----------------------------------------------------------------------


def test_chat_template_and_tokenizer_come_from_the_metadata(smollm):
    _, tokenizer, _ = smollm
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert rendered.startswith("<|im_start|>system\n")
    assert rendered.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    samples = ["Hello world 12345", "héllo 日本語 ✓ 🙂", "def f(x):\n    return x ** 2\n", "  a\n\n\tb  "]
    for text in samples:
        assert tokenizer.decode(tokenizer.encode(text)) == text
    # Ids of SmolLM2's own (Hugging Face) tokenizer: digits one by one, runs of spaces kept.
    assert tokenizer.encode("Hello world! 123") == [19556, 905, 17, 216, 33, 34, 35]
    assert tokenizer.encode("  multiple   spaces") == [216, 2701, 256, 5600]
    assert tokenizer.encode("Café déjà vu.") == [51, 1939, 2756, 32564, 90, 16739, 386, 101, 30]
    assert tokenizer.encode("<|im_start|>") == [1]  # chat markers are single special tokens
    assert tokenizer.eos_token_ids == {2}


def test_config_and_cpu_dtypes(smollm):
    model, _, config = smollm
    assert config["rope_traditional"] is True and config["tie_word_embeddings"] is True
    assert config["rope_theta"] == 100000.0 and config["rms_norm_eps"] == 1e-5
    assert config["max_position_embeddings"] == 8192 and config["eos_token_id"] == [2]
    assert config["gguf_file_type"] == "Q4_1"
    assert config["quantization"] == {
        "group_size": 32,
        "bits": 4,
        "mode": "affine",
        "model.embed_tokens": {"group_size": 32, "bits": 8},
    }
    embed, q_proj = model.model.embed_tokens, model.model.layers[0].self_attn.q_proj
    assert (embed.bits, q_proj.bits) == (8, 4)  # the Q8_0 embedding stays quantized
    # fp16 scales would make quantized matmul many times slower on CPU.
    assert q_proj.scales.dtype == mx.float32 and embed.biases.dtype == mx.float32
    assert model.model.norm.weight.dtype == mx.float32


def test_embedded_model_answers_paris_through_its_chat_template(smollm):
    from mlx_lm.generate import stream_generate

    model, tokenizer, _ = smollm
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True
    )
    text = ""
    for response in stream_generate(model, tokenizer, ids, max_tokens=12):
        text += response.text
        if "Paris" in text:
            break  # the rest of the sentence costs time and proves nothing
    assert "Paris" in text


def _unpack(words: np.ndarray, bits: int) -> np.ndarray:
    """uint32 words → unsigned ints, lowest bits first (little-endian within each word)."""
    shifts = np.arange(32 // bits, dtype=np.uint32) * bits
    values = (words[..., None] >> shifts) & np.uint32((1 << bits) - 1)
    return values.reshape(*words.shape[:-1], -1)


def _dequantize(tensors: dict, name: str) -> np.ndarray:
    """fp32 weight from an mx.load GGUF tensor: w = scale * q + bias per group of 32."""
    weight = np.asarray(tensors[f"{name}.weight"])
    if f"{name}.scales" not in tensors:
        return weight.astype(np.float32)
    scales = np.asarray(tensors[f"{name}.scales"].astype(mx.float32))
    biases = np.asarray(tensors[f"{name}.biases"].astype(mx.float32))
    bits = weight.shape[-1] * 32 // (scales.shape[-1] * 32)
    q = _unpack(weight, bits).astype(np.float32).reshape(*scales.shape, 32)
    return (q * scales[..., None] + biases[..., None]).reshape(weight.shape[0], -1)


class NumpyLlama:
    """Plain fp32 llama over the whole prefix (no cache), interleaved RoPE on the GGUF's q/k rows."""

    def __init__(self, path):
        tensors, meta = mx.load(str(path), return_metadata=True)
        get = lambda key: meta[f"llama.{key}"].item()
        self.layers = get("block_count")
        self.heads, self.kv_heads = get("attention.head_count"), get("attention.head_count_kv")
        self.eps, self.theta = get("attention.layer_norm_rms_epsilon"), get("rope.freq_base")
        self.w = {name: _dequantize(tensors, name) for name in {n.rsplit(".", 1)[0] for n in tensors}}
        self.head = np.ascontiguousarray(self.w["token_embd"].T)  # tied output head

    def _norm(self, x, weight):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * weight

    def _rope(self, x):  # x: (heads, T, d); rotates the pairs (2i, 2i+1)
        d = x.shape[-1]
        angle = np.arange(x.shape[1])[:, None] * self.theta ** (-np.arange(0, d, 2) / d)[None, :]
        cos, sin = np.cos(angle), np.sin(angle)
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = even * cos - odd * sin
        out[..., 1::2] = even * sin + odd * cos
        return out

    def logits(self, ids: list[int]) -> np.ndarray:
        """Next-token logits after `ids`, recomputing every position."""
        w, T = self.w, len(ids)
        x = w["token_embd"][ids]
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
        return self._norm(x[-1], w["output_norm"]) @ self.head


def _entropy_bits(logits: np.ndarray) -> float:
    z = logits.astype(np.float64) - logits.max()
    p = np.exp(z) / np.exp(z).sum()
    return float(-(p[p > 0] * np.log2(p[p > 0])).sum())


@pytest.fixture
def one_blas_thread():
    """Run NumPy's bundled OpenBLAS on one thread for the duration of a test, where it can."""
    # On a busy 2-core machine OpenBLAS's spinning worker threads made the reference many times slower.
    import ctypes
    from pathlib import Path

    setter = getter = None
    for library in (Path(np.__file__).parent.parent / "numpy.libs").glob("*openblas*"):
        lib = ctypes.CDLL(str(library))
        setter = getattr(lib, "scipy_openblas_set_num_threads64_", None)
        getter = getattr(lib, "scipy_openblas_get_num_threads64_", None)
    if setter is None or getter is None:
        yield
        return
    before = getter()
    setter(1)
    yield
    setter(before)


def test_greedy_tokens_match_an_independent_numpy_reference(smollm, one_blas_thread):
    model, tokenizer, _ = smollm
    reference = NumpyLlama(embedded_gguf_path())
    for prompt in CHAT_PROMPTS:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
        cache = make_prompt_cache(model)
        logits = model(mx.array(ids)[None], cache=cache)[0, -1]
        for _ in range(12):
            expected = reference.logits(ids)
            got = np.asarray(logits.astype(mx.float32))
            assert int(got.argmax()) == int(expected.argmax())
            assert abs(_entropy_bits(got) - _entropy_bits(expected)) < 1e-2
            ids.append(int(got.argmax()))
            logits = model(mx.array(ids[-1:])[None], cache=cache)[0, -1]


# -- tiny synthetic GGUF files ------------------------------------------------------------------

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 32, 64, 2, 4, 2
_MLX_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


@pytest.fixture(scope="module")
def tiny_vocab():
    """Tokens (by id) and merges of a locally trained byte-level BPE, as GGUF stores them."""
    tok = train_tokenizer(300)
    tokens = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in json.loads(tok.to_str())["model"]["merges"]]
    return tokens, merges


def _tiny_gguf(
    path,
    vocab,
    arch: str,
    *,
    bias: bool = False,
    pre: str = "gpt-2",
    dtype=mx.float32,
    extra: dict | None = None,
    meta: dict | None = None,
) -> dict:
    """Write a 2-layer GGUF with random weights; return its tensors by GGUF name."""
    tokens, merges = vocab
    mx.random.seed(3)
    rand = lambda *shape, scale=0.2: (mx.random.normal(shape) * scale).astype(dtype)
    arrays = {
        "token_embd.weight": rand(len(tokens), HIDDEN, scale=0.3),
        "output.weight": rand(len(tokens), HIDDEN, scale=1.0),
        "output_norm.weight": mx.ones((HIDDEN,), dtype=dtype),
    }
    kv = HIDDEN // HEADS * KV_HEADS
    for i in range(LAYERS):
        p = f"blk.{i}."
        arrays.update(
            {
                p + "attn_norm.weight": 1 + rand(HIDDEN, scale=0.1),
                p + "ffn_norm.weight": 1 + rand(HIDDEN, scale=0.1),
                p + "attn_q.weight": rand(HIDDEN, HIDDEN),
                p + "attn_k.weight": rand(kv, HIDDEN),
                p + "attn_v.weight": rand(kv, HIDDEN),
                p + "attn_output.weight": rand(HIDDEN, HIDDEN),
                p + "ffn_gate.weight": rand(FFN, HIDDEN),
                p + "ffn_up.weight": rand(FFN, HIDDEN),
                p + "ffn_down.weight": rand(HIDDEN, FFN),
            }
        )
        if bias:
            arrays.update(
                {p + "attn_q.bias": rand(HIDDEN), p + "attn_k.bias": rand(kv), p + "attn_v.bias": rand(kv)}
            )
    arrays.update(extra or {})
    u32 = lambda n: mx.array(n, dtype=mx.uint32)
    metadata = {
        "general.architecture": arch,
        f"{arch}.block_count": u32(LAYERS),
        f"{arch}.embedding_length": u32(HIDDEN),
        f"{arch}.feed_forward_length": u32(FFN),
        f"{arch}.attention.head_count": u32(HEADS),
        f"{arch}.attention.head_count_kv": u32(KV_HEADS),
        f"{arch}.context_length": u32(256),
        f"{arch}.attention.layer_norm_rms_epsilon": mx.array(1e-5, dtype=mx.float32),
        f"{arch}.rope.freq_base": mx.array(10000.0, dtype=mx.float32),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.token_type": mx.array(
            [3 if t.startswith("<|") else 1 for t in tokens], dtype=mx.int32
        ),
        "tokenizer.ggml.eos_token_id": u32(tokens.index("<|im_end|>")),
        **(meta or {}),
    }
    mx.save_gguf(str(path), arrays, metadata)
    return arrays


def _direct_model(config: dict, arrays: dict):
    """mlx-lm's class for `config` with the GGUF tensors placed by hand under mlx-lm's names."""
    model_class, args_class = model_classes(config, "test model")
    model = model_class(args_class.from_dict(config))
    weights = {}
    for name, value in arrays.items():
        parts = name.split(".")
        if parts[0] == "blk":
            weights[f"model.layers.{parts[1]}.{_MLX_NAMES[parts[2]]}.{parts[3]}"] = value
        elif parts[0] in _MLX_NAMES:
            weights[f"{_MLX_NAMES[parts[0]]}.{parts[1]}"] = value
    model.load_weights(list(weights.items()))
    return model


@pytest.mark.parametrize("arch,bias", [("qwen2", True), ("llama", False)])
def test_tiny_gguf_matches_the_same_weights_in_mlx_lm(tmp_path, tiny_vocab, arch, bias):
    path = tmp_path / f"tiny-{arch}.gguf"
    arrays = _tiny_gguf(path, tiny_vocab, arch, bias=bias, pre="qwen2" if arch == "qwen2" else "gpt-2")
    model, tokenizer, config = load_gguf(path, mx.float32)
    assert tokenizer.decode(tokenizer.encode("The capital of France")) == "The capital of France"
    # qwen2 GGUFs keep the NEOX layout; llama ones were permuted for the interleaved rope.
    assert config["rope_traditional"] is (arch == "llama")
    assert config["tie_word_embeddings"] is False and "quantization" not in config
    assert config["gguf_file_type"] == "unknown" and config["quantization_label"] == "GGUF unknown"
    ids = mx.array(tokenizer.encode("The quick brown fox jumps over the lazy dog"))[None]
    assert mx.allclose(model(ids), _direct_model(config, arrays)(ids), atol=1e-4).item()


def test_float_dtype_none_keeps_the_checkpoint_precision(tmp_path, tiny_vocab):
    path = tmp_path / "half.gguf"
    _tiny_gguf(path, tiny_vocab, "llama", dtype=mx.float16)
    model, _, _ = load_gguf(path, None)
    assert model.model.norm.weight.dtype == mx.float16
    assert model.model.layers[0].mlp.up_proj.weight.dtype == mx.float16
    model, _, _ = load_gguf(path, mx.float32)
    assert model.model.layers[0].mlp.up_proj.weight.dtype == mx.float32


def _llama3_rope_factors(
    head_dim: int, base: float, factor: float, low: float, high: float, original_context: int
) -> np.ndarray:
    """What llama.cpp's converter stores as rope_freqs for Llama 3.x (Meta's published formula)."""
    wavelengths = 2 * np.pi / base ** (-np.arange(0, head_dim, 2) / head_dim)
    smooth = (original_context / wavelengths - low) / (high - low)
    return np.where(
        wavelengths < original_context / high,
        1.0,
        np.where(wavelengths > original_context / low, factor, 1 / ((1 - smooth) / factor + smooth)),
    ).astype(np.float32)


def test_rope_freqs_tensor_scales_rope_like_mlx_lm_llama3(tmp_path, tiny_vocab):
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    factors = _llama3_rope_factors(HIDDEN // HEADS, 10000.0, 8.0, 1.0, 4.0, 64)
    assert len(set(factors.tolist())) == 3  # one pair each: unscaled, smoothed, fully scaled
    path = tmp_path / "llama3.gguf"
    arrays = _tiny_gguf(path, tiny_vocab, "llama", extra={"rope_freqs.weight": mx.array(factors)})
    model, tokenizer, config = load_gguf(path, mx.float32)
    ids = mx.array(tokenizer.encode("The capital of France is Paris. " * 6))[None]
    scaled = _direct_model({**config, "rope_scaling": scaling}, arrays)(ids)
    unscaled = _direct_model(config, arrays)(ids)
    assert mx.allclose(model(ids), scaled, atol=1e-4).item()
    assert not mx.allclose(model(ids), unscaled, atol=1e-2).item()  # the factors matter here
    # With a KV cache too (positions past the prompt use the same factors).
    cache = make_prompt_cache(model)
    model(ids[:, :-1], cache=cache)
    assert mx.allclose(model(ids[:, -1:], cache=cache)[0, -1], scaled[0, -1], atol=1e-4).item()


@pytest.mark.parametrize(
    "pre,pieces",
    [
        ("gpt-2", ["Hi", "Ġ", "Ġthere", "Ġ12345", "!", "Ċ", "Ċ", "ok"]),
        ("smollm", ["Hi", "Ġ", "Ġthere", "Ġ", "1", "2", "3", "4", "5", "!", "Ċ", "Ċ", "ok"]),
        ("llama-bpe", ["Hi", "Ġ", "Ġthere", "Ġ", "123", "45", "!ĊĊ", "ok"]),
        ("qwen2", ["Hi", "Ġ", "Ġthere", "Ġ", "1", "2", "3", "4", "5", "!ĊĊ", "ok"]),
        ("default", ["Hi", "Ġ", "Ġthere", "Ġ", "123", "45", "!", "Ċ", "Ċ", "ok"]),
    ],
)
def test_pre_tokenizer_follows_llama_cpp_per_type(tmp_path, tiny_vocab, pre, pieces):
    path = tmp_path / f"{pre}.gguf"
    _tiny_gguf(path, tiny_vocab, "llama", pre=pre)
    _, tokenizer, _ = load_gguf(path, mx.float32)
    split = tokenizer._tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str("Hi  there 12345!\n\nok")
    assert [piece for piece, _ in split] == pieces


def test_add_bos_token_prepends_bos(tmp_path, tiny_vocab):
    path = tmp_path / "bos.gguf"
    tokens = tiny_vocab[0]
    _tiny_gguf(
        path,
        tiny_vocab,
        "llama",
        meta={
            "tokenizer.ggml.bos_token_id": mx.array(tokens.index("<|im_start|>"), dtype=mx.uint32),
            "tokenizer.ggml.add_bos_token": mx.array(True),
        },
    )
    _, tokenizer, _ = load_gguf(path, mx.float32)
    ids = tokenizer.encode("Hello")
    assert ids[0] == tokens.index("<|im_start|>") and len(ids) > 1
    assert tokenizer.encode("Hello", add_special_tokens=False) == ids[1:]


# -- refusals -----------------------------------------------------------------------------------


def _raw_gguf(path, tensors: list[tuple[str, int, list[int], bytes]], strings: dict[str, str]) -> None:
    """A GGUF v3 file written byte by byte, for tensor types mx.save_gguf cannot write."""

    def text(s: str) -> bytes:
        return struct.pack("<Q", len(s.encode())) + s.encode()

    header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(strings))
    header += b"".join(text(k) + struct.pack("<I", 8) + text(v) for k, v in strings.items())
    offset, blobs = 0, b""
    for name, kind, dims, blob in tensors:
        header += text(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        header += struct.pack("<IQ", kind, offset)
        blob += b"\0" * (-len(blob) % 32)
        offset, blobs = offset + len(blob), blobs + blob
    path.write_bytes(header + b"\0" * (-len(header) % 32) + blobs)


def test_tensor_types_without_a_conversion_are_refused_by_name(tmp_path):
    path = tmp_path / "q2k.gguf"
    _raw_gguf(
        path,
        [("token_embd.weight", 0, [32, 2], b"\0" * 256), ("output.weight", 10, [256, 1], b"\0" * 84)],
        {"general.architecture": "llama"},
    )
    with pytest.raises(
        ModelFormatError,
        match=r"q2k.gguf: 1 tensor\(s\) use Q2_K \(first: 'output.weight'\), "
        r"which mlxswitch cannot load; supported GGUF types: F32, F16",
    ):
        load_gguf_file("q2k", path, "q2k")


def test_unsupported_architecture_is_named(tmp_path):
    path = tmp_path / "odd.gguf"
    mx.save_gguf(str(path), {"x.weight": mx.zeros((2, 2))}, {"general.architecture": "mamba"})
    with pytest.raises(ModelFormatError, match="odd.gguf: architecture 'mamba' is not supported"):
        load_gguf(path, mx.float32)


def test_garbage_and_truncated_files_are_format_errors(tmp_path):
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"this is not a model" * 10)
    with pytest.raises(ModelFormatError, match="broken.gguf: cannot read as GGUF"):
        load_gguf(path, mx.float32)
    path.write_bytes(b"")
    with pytest.raises(ModelFormatError, match="broken.gguf: cannot read as GGUF"):
        load_gguf(path, mx.float32)
    with open(embedded_gguf_path(), "rb") as handle:
        path.write_bytes(handle.read(3_000_000))  # an interrupted download
    with pytest.raises(ModelFormatError, match="broken.gguf: cannot read as GGUF .*past the end"):
        load_gguf(path, mx.float32)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))  # valid, but empty
    with pytest.raises(ModelFormatError, match="lacks 'general.architecture'"):
        load_gguf(path, mx.float32)


def test_sentencepiece_tokenizer_is_refused(tmp_path, tiny_vocab):
    path = tmp_path / "spm.gguf"
    _tiny_gguf(path, tiny_vocab, "llama", meta={"tokenizer.ggml.model": "llama"})
    with pytest.raises(ModelFormatError, match="spm.gguf: tokenizer model 'llama' is not supported"):
        load_gguf(path, mx.float32)


def test_unknown_pre_tokenizer_is_refused(tmp_path, tiny_vocab):
    path = tmp_path / "pre.gguf"
    _tiny_gguf(path, tiny_vocab, "llama", pre="chameleon")
    with pytest.raises(ModelFormatError, match="pre.gguf: pre-tokenizer 'chameleon' is not supported"):
        load_gguf(path, mx.float32)


def test_saved_gears_of_a_llama3_gguf_keep_its_rope_factors(tmp_path, tiny_vocab):
    from mlxswitch.models.gear_files import build_geared, load_geared_dir
    from mlxswitch.models.sources import load_model

    factors = _llama3_rope_factors(HIDDEN // HEADS, 10000.0, 8.0, 1.0, 4.0, 64)
    path = tmp_path / "llama3.gguf"
    _tiny_gguf(path, tiny_vocab, "llama", extra={"rope_freqs.weight": mx.array(factors)})
    out = tmp_path / "geared"
    build_geared(load_model(str(path)), out, plane_bits=(4, 4, 8), group_size=32)
    built = load_model(str(path))
    from mlxswitch.models.nesting import nest_model

    nest_model(built.model, (4, 4, 8), 32)
    again = load_geared_dir(str(out), out, "geared")
    ids = mx.array(again.tokenizer.encode("The capital of France is Paris. " * 6))[None]
    for gear in (4, 8, 16):
        built.model.gear_state.set(gear)
        again.model.gear_state.set(gear)
        assert mx.allclose(built.model(ids), again.model(ids), atol=1e-5).item()
