"""GGUF tensor types against the `gguf` package's own dequantization (llama.cpp's reader), a tiny
qwen2 GGUF of K-quants against an independent NumPy forward, the conversion cache, and damage."""

from __future__ import annotations

import json
import os

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import dequantize, quantize
from tinymodels import train_tokenizer

from mlxswitch.errors import ModelFormatError, ModelNotFoundError
from mlxswitch.models.arrays import flat_parameters
from mlxswitch.models.gguf import needs_conversion
from mlxswitch.models.gguf_convert import REQUANT_BITS, converted_dir, pack_codes, requantize
from mlxswitch.models.loading import load_gguf_file
from mlxswitch.models.rows import Q6KLinear, TiledLinear

Q = GGMLQuantizationType
HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 256, 256, 2, 4, 2  # K-quant rows hold 256 values
# Types gguf's Python can quantize; K-quant blocks are made byte by byte (_k_quant_blocks).
PYTHON_QUANTIZED = (Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0)
K_QUANTS = (Q.Q4_K, Q.Q5_K, Q.Q6_K)
# An affine grid per 32 values: recovered exactly. Q6_K's 16-value sub-blocks are not one grid.
EXACT = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K"}


@pytest.fixture(scope="module")
def vocab():
    tok = train_tokenizer(300)
    tokens = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in json.loads(tok.to_str())["model"]["merges"]]
    return tokens, merges


def _k_quant_blocks(kind: Q, rows: int, columns: int, rng: np.random.Generator) -> np.ndarray:
    """Random blocks of a K-quant with sane scales: what llama.cpp could have written."""
    from gguf.constants import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[kind]
    data = rng.integers(0, 256, size=(rows, columns // block, size), dtype=np.uint8)
    if kind == Q.Q6_K:  # ql, qh, int8 scales, then d
        data[..., -2:] = np.frombuffer(np.float16(0.004).tobytes(), np.uint8)
    else:  # d and dmin first
        data[..., 0:2] = np.frombuffer(np.float16(0.02).tobytes(), np.uint8)
        data[..., 2:4] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    return data.reshape(rows, -1)


def _encode(values: np.ndarray, kind: Q, rng: np.random.Generator) -> np.ndarray:
    if kind in K_QUANTS:
        return _k_quant_blocks(kind, *values.shape, rng)
    if kind == Q.F32:
        return values.astype(np.float32)
    if kind == Q.F16:
        return values.astype(np.float16)
    return quantize(values.astype(np.float32), kind)


def write_qwen2_gguf(
    path, vocab, linear: Q, *, down: Q | None = None, output: Q | None = None, seed: int = 0
) -> None:
    """A 2-layer qwen2 GGUF (biased q/k/v, untied output) whose matrices are stored as `linear`."""
    tokens, merges = vocab
    rng = np.random.default_rng(seed)
    kv = HIDDEN // HEADS * KV_HEADS
    writer = GGUFWriter(str(path), "qwen2")
    writer.add_block_count(LAYERS)
    writer.add_context_length(512)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(15)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_token_types([3 if t.startswith("<|") else 1 for t in tokens])
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>"
        "assistant\n{% endif %}"
    )

    def matrix(name: str, rows: int, columns: int, kind: Q, scale: float = 0.08) -> None:
        values = (rng.standard_normal((rows, columns)) * scale).astype(np.float32)
        writer.add_tensor(name, _encode(values, kind, rng), raw_dtype=kind)

    def vector(name: str, size: int, around: float, scale: float) -> None:
        writer.add_tensor(name, (around + rng.standard_normal(size) * scale).astype(np.float32))

    matrix("token_embd.weight", len(tokens), HIDDEN, linear, scale=0.5)
    matrix("output.weight", len(tokens), HIDDEN, output or linear, scale=0.5)
    vector("output_norm.weight", HIDDEN, 1.0, 0.1)
    for i in range(LAYERS):
        p = f"blk.{i}."
        for name, rows, columns in (
            ("attn_q", HIDDEN, HIDDEN),
            ("attn_k", kv, HIDDEN),
            ("attn_v", kv, HIDDEN),
            ("attn_output", HIDDEN, HIDDEN),
            ("ffn_gate", FFN, HIDDEN),
            ("ffn_up", FFN, HIDDEN),
        ):
            matrix(p + name + ".weight", rows, columns, linear)
        matrix(p + "ffn_down.weight", HIDDEN, FFN, down or linear)
        for name, size in (("attn_q", HIDDEN), ("attn_k", kv), ("attn_v", kv)):
            vector(p + name + ".bias", size, 0.0, 0.1)
        vector(p + "attn_norm.weight", HIDDEN, 1.0, 0.1)
        vector(p + "ffn_norm.weight", HIDDEN, 1.0, 0.1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def gguf_floats(path) -> dict[str, np.ndarray]:
    """Every tensor as the gguf package dequantizes it, (rows, columns) float32."""
    out = {}
    for tensor in GGUFReader(str(path)).tensors:
        data = np.asarray(tensor.data)
        if tensor.tensor_type == Q.F32:
            values = data.astype(np.float32)
        elif tensor.tensor_type == Q.F16:
            values = data.view(np.float16).astype(np.float32)
        else:
            values = dequantize(data, tensor.tensor_type)
        out[tensor.name] = values.reshape(tuple(int(d) for d in reversed(tensor.shape)))
    return out


_MLX = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _module(model, gguf_name: str):
    parts = gguf_name.split(".")
    if parts[0] == "token_embd":
        return model.model.embed_tokens
    if parts[0] == "output":
        return model.lm_head
    layer = model.model.layers[int(parts[1])]
    for attr in _MLX[parts[2]].split("."):
        layer = getattr(layer, attr)
    return layer


# Linears a decoder block multiplies in one kernel call, which keep the affine copy (models/rows.py)
PACKED_GGUF_NAMES = ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up")


def _weight(module) -> np.ndarray:
    if isinstance(module, (Q6KLinear, TiledLinear)):  # Q6_K blocks as stored, or either as the kernel's tiles
        return np.asarray(module.stored_values())
    if hasattr(module, "scales"):
        wide = (module.scales.astype(mx.float32), module.biases.astype(mx.float32))
        return np.asarray(mx.dequantize(module.weight, *wide, group_size=module.group_size, bits=module.bits))
    return np.asarray(module.weight.astype(mx.float32))


@pytest.mark.parametrize("kind", PYTHON_QUANTIZED + K_QUANTS, ids=lambda k: k.name)
def test_every_supported_type_loads_as_gguf_dequantizes_it(tmp_path, vocab, kind):
    from mlxswitch.kernels.route import kernels_override

    path = tmp_path / f"tiny-{kind.name}.gguf"
    write_qwen2_gguf(path, vocab, kind)
    with kernels_override("exact"):  # the scales as converted (the default may hold them as fp16)
        loaded = load_gguf_file("tiny", path, "tiny")
    default = load_gguf_file("tiny", path, "tiny")
    truth = gguf_floats(path)
    stored = 0  # layers holding the file's Q6_K blocks as stored
    for name, values in truth.items():
        if values.ndim != 2:
            continue
        module = _module(loaded.model, name)
        if isinstance(module, Q6KLinear):  # read as stored where the quantized kernel is the route
            assert kind.name == "Q6_K" and name.split(".")[-2] not in PACKED_GGUF_NAMES
            assert np.array_equal(_weight(module), values), name
            assert np.array_equal(_weight(_module(default.model, name)), values), name
            stored += 1
            continue
        if kind.name in ("F32", "F16", "BF16"):
            assert not hasattr(module, "scales")
        else:
            # the codes' own width (a CPU load widens narrow codes to bytes: models/rows.py)
            assert (getattr(module, "code_bits", 0) or module.bits) == REQUANT_BITS[kind.name]
            assert module.group_size == 32
        got = _weight(module)
        if kind.name in EXACT:
            assert np.array_equal(got, values), name
        else:  # off the grid: within one 8-bit step (MLX moves the offset to keep 0 exact)
            step = np.asarray(module.scales).repeat(32, axis=1)
            assert (np.abs(got - values) <= 1.01 * np.abs(step)).all(), name
        # the default's W: the same, up to its scales and biases rounded to fp16's 11 bits
        held = _module(default.model, name)
        if hasattr(held, "scales"):
            codes_top = float((1 << (getattr(held, "code_bits", 0) or held.bits)) - 1)
            size = codes_top * np.abs(np.asarray(module.scales)) + np.abs(np.asarray(module.biases))
            assert (np.abs(_weight(held) - got) <= 2.0**-11 * size.repeat(32, axis=1) + 1e-12).all(), name
    if needs_conversion(path):  # else mx.load read it directly (the test below proves it exact)
        assert loaded.config["mlxswitch_gguf"]["types"][kind.name] > 0
    # o, down and the head: every Q6_K linear but those one kernel call multiplies together
    assert stored == (2 * LAYERS + 1 if kind.name == "Q6_K" else 0)


@pytest.mark.parametrize("kind", (Q.F32, Q.F16, Q.Q4_0, Q.Q4_1, Q.Q8_0), ids=lambda k: k.name)
def test_types_read_by_mx_load_match_gguf_exactly(tmp_path, vocab, kind):
    """The direct path (mx.load, no conversion) is taken only for types proven exact here."""
    path = tmp_path / f"direct-{kind.name}.gguf"
    write_qwen2_gguf(path, vocab, kind)
    assert not needs_conversion(path)
    tensors = mx.load(str(path))
    for name, values in gguf_floats(path).items():
        base = name.removesuffix(".weight")
        if f"{base}.scales" in tensors:
            # In float32, as the loader computes on a CPU (half-precision products would round).
            got = mx.dequantize(
                tensors[f"{base}.weight"],
                tensors[f"{base}.scales"].astype(mx.float32),
                tensors[f"{base}.biases"].astype(mx.float32),
                group_size=32,
                bits=tensors[f"{base}.weight"].shape[-1] * 32 // values.shape[-1],
            )
        else:
            got = tensors[name]
        assert np.array_equal(np.asarray(got.astype(mx.float32)).reshape(values.shape), values), name
    loaded = load_gguf_file("tiny", path, "tiny")
    assert "mlxswitch_gguf" not in loaded.config  # loaded directly, nothing cached


@pytest.mark.parametrize("bits", (4, 5, 6, 8))
def test_codes_are_packed_as_mlx_packs_them(bits):
    rng = np.random.default_rng(bits)
    codes = rng.integers(0, 1 << bits, size=(3, 64)).astype(np.uint8)
    codes[:, [0, 32]], codes[:, [1, 33]] = 0, (1 << bits) - 1  # mx.quantize keeps such a grid exactly
    values = codes.astype(np.float32) * 0.25 - 1.0
    weight = np.asarray(mx.quantize(mx.array(values), group_size=32, bits=bits)[0])
    flipped = (1 << bits) - 1 - codes  # MLX chose a negative scale: its codes count down
    assert np.array_equal(pack_codes(codes, bits), weight) or np.array_equal(
        pack_codes(flipped, bits), weight
    )
    out = requantize(values, bits)
    back = mx.dequantize(out[""], out["scales"], out["biases"], group_size=32, bits=bits)
    assert np.array_equal(np.asarray(back), values)


class NumpyQwen2:
    """Plain fp32 qwen2 over the whole prefix: biased q/k/v, NEOX RoPE, GQA, untied output."""

    def __init__(
        self,
        weights: dict[str, np.ndarray],
        theta: float = 10000.0,
        eps: float = 1e-6,
        layers: int = LAYERS,
        heads: int = HEADS,
        kv_heads: int = KV_HEADS,
    ):
        self.w, self.theta, self.eps = weights, theta, eps
        self.layers, self.heads, self.kv_heads = layers, heads, kv_heads

    def _norm(self, x, weight):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * weight

    def _rope(self, x):  # x: (heads, T, d); rotates the halves (i, i + d/2)
        d = x.shape[-1]
        angle = np.arange(x.shape[1])[:, None] * self.theta ** (-np.arange(0, d, 2) / d)[None, :]
        cos, sin = np.cos(angle), np.sin(angle)
        first, second = x[..., : d // 2], x[..., d // 2 :]
        return np.concatenate([first * cos - second * sin, first * sin + second * cos], axis=-1)

    def _project(self, h, prefix: str, name: str, heads: int):  # h: (T, hidden) → (heads, T, d)
        out = h @ self.w[prefix + name + ".weight"].T + self.w[prefix + name + ".bias"]
        return out.reshape(h.shape[0], heads, -1).transpose(1, 0, 2)

    def logits(self, ids: list[int]) -> np.ndarray:
        """Next-token logits after `ids`."""
        w, T = self.w, len(ids)
        x = w["token_embd.weight"][ids]
        mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)
        heads, kv_heads = self.heads, self.kv_heads
        for i in range(self.layers):
            p = f"blk.{i}."
            h = self._norm(x, w[p + "attn_norm.weight"])
            q = self._project(h, p, "attn_q", heads)
            k, v = self._project(h, p, "attn_k", kv_heads), self._project(h, p, "attn_v", kv_heads)
            q, k = self._rope(q), self._rope(k)
            k, v = np.repeat(k, heads // kv_heads, axis=0), np.repeat(v, heads // kv_heads, axis=0)
            scores = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1]) + mask
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            attn = (scores / scores.sum(-1, keepdims=True)) @ v
            x = x + attn.transpose(1, 0, 2).reshape(T, -1) @ w[p + "attn_output.weight"].T
            h = self._norm(x, w[p + "ffn_norm.weight"])
            gate = h @ w[p + "ffn_gate.weight"].T
            x = (
                x
                + ((gate / (1 + np.exp(-gate))) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
            )
        return self._norm(x[-1], w["output_norm.weight"]) @ w["output.weight"].T


@pytest.mark.parametrize("down, output", [(Q.Q5_K, Q.Q8_0), (Q.Q6_K, Q.Q6_K)], ids=["q5k-q8", "q6k"])
def test_a_k_quant_qwen2_decodes_as_an_independent_reference(tmp_path, vocab, down, output):
    """Greedy tokens equal a NumPy reference over gguf's dequantization. Q6_K down projections
    and head are read as stored on the CPU's kernel, their affine copies never loaded."""
    from mlxswitch.api import resolve_profile
    from mlxswitch.decoding.session import ChatSession, GenerationSettings
    from mlxswitch.decoding.tiers import single_model_ladder

    path = tmp_path / "tiny-q4km.gguf"
    write_qwen2_gguf(path, vocab, Q.Q4_K, down=down, output=output)
    loaded = load_gguf_file("tiny", path, "tiny")
    if down == Q.Q6_K:
        held = [n for n, m in loaded.model.named_modules() if isinstance(m, Q6KLinear)]
        assert sorted(held) == ["lm_head"] + [f"model.layers.{i}.mlp.down_proj" for i in range(LAYERS)]
        parameters = [n for n, _ in flat_parameters(loaded.model)]
        assert not any(".scales" in n and ("down_proj" in n or "lm_head" in n) for n in parameters)
    profile = resolve_profile(model=str(path))
    session = ChatSession(
        single_model_ladder(loaded, name="model"), profile.router, GenerationSettings(max_tokens=12)
    )
    summary = session.ask("The quick brown fox")
    reference = NumpyQwen2(gguf_floats(path))
    ids = list(
        loaded.tokenizer.apply_chat_template(
            [{"role": "user", "content": "The quick brown fox"}], add_generation_prompt=True
        )
    )
    expected = []
    for _ in range(12):
        token = int(np.argmax(reference.logits(ids)))
        if token in loaded.tokenizer.eos_token_ids:
            break
        expected.append(token)
        ids.append(token)
    assert [t.id for t in summary.tokens] == expected and len(expected) >= 4


def test_nested_gears_build_from_q6k_layers_read_as_stored(tmp_path, vocab):
    """`gears build` on a GGUF whose Q6_K layers are held as stored: their top gear is the file's
    W to within its planes' rounding."""
    from mlxswitch.models.gears import NestedLinear
    from mlxswitch.models.nesting import nest_model

    path = tmp_path / "tiny-q6k.gguf"
    write_qwen2_gguf(path, vocab, Q.Q4_K, down=Q.Q6_K, output=Q.Q6_K)
    loaded = load_gguf_file("tiny", path, "tiny")
    assert isinstance(loaded.model.lm_head, Q6KLinear)
    nest_model(loaded.model, (4, 4), 32)
    head = loaded.model.lm_head
    assert isinstance(head, NestedLinear)
    want = gguf_floats(path)["output.weight"]
    got = np.asarray(head.dequantized())
    assert np.abs(got - want).max() <= 0.02 * np.abs(want).max()


def test_the_benchs_fp32_arm_dequantizes_q6k_layers_held_as_stored(tmp_path, vocab):
    from mlxswitch.bench.runner import _dequantized_fp32

    path = tmp_path / "tiny-q6k.gguf"
    write_qwen2_gguf(path, vocab, Q.Q4_K, down=Q.Q6_K, output=Q.Q6_K)
    model = load_gguf_file("tiny", path, "tiny").model
    with _dequantized_fp32([model]):
        assert type(model.lm_head) is nn.Linear and model.lm_head.weight.dtype == mx.float32
        assert np.array_equal(np.asarray(model.lm_head.weight), gguf_floats(path)["output.weight"])
    assert isinstance(model.lm_head, Q6KLinear)


def test_a_conversion_removes_the_same_files_earlier_formats_and_keeps_others(tmp_path, vocab):
    from mlxswitch.models.gguf_convert import CONVERTED_FORMAT
    from mlxswitch.resources import file_sha256

    path = tmp_path / "bumped.gguf"
    write_qwen2_gguf(path, vocab, Q.Q4_K)
    folder = converted_dir(file_sha256(path))
    assert folder.name.endswith(f"-v{CONVERTED_FORMAT}") and CONVERTED_FORMAT > 1
    earlier = folder.with_name(folder.name.replace(f"-v{CONVERTED_FORMAT}", "-v1"))
    other = folder.with_name("0" * 32 + "-v1")  # another file's conversion
    for stale in (earlier, other):
        stale.mkdir(parents=True)
        (stale / "model.safetensors").write_bytes(b"old")
    load_gguf_file("bumped", path, "bumped")
    assert (folder / "config.json").exists() and not earlier.exists() and other.exists()


def test_conversion_is_cached_by_sha256_and_atomic(tmp_path, vocab, monkeypatch):
    from mlxswitch.models import gguf_convert
    from mlxswitch.resources import file_sha256

    path = tmp_path / "cached.gguf"
    write_qwen2_gguf(path, vocab, Q.Q4_K)
    folder = converted_dir(file_sha256(path))

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # a Ctrl-C half-way through writing the directory

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("mlx_lm.utils.save_config", crash)
        with pytest.raises(KeyboardInterrupt):
            load_gguf_file("cached", path, "cached")
    assert not folder.exists() and list(folder.parent.glob(f".{folder.name}*")) == []
    load_gguf_file("cached", path, "cached")
    assert (folder / "config.json").exists()
    calls = []
    monkeypatch.setattr(gguf_convert, "convert_tensors", lambda *a, **k: calls.append(a))
    again = load_gguf_file("cached", path, "cached")  # the cache answers: nothing converted
    assert calls == [] and again.config["mlxswitch_gguf"]["sha256"] == file_sha256(path)


def _layouts(model) -> dict[str, str]:
    return {n: m.quant.weights[0].layout for n, m in model.named_modules() if getattr(m, "quant", None)}


def test_a_converted_models_layout_is_kept_beside_it_and_read_back_with_the_same_bits(
    tmp_path, vocab, monkeypatch
):
    from mlxswitch.kernels import quant_cpu
    from mlxswitch.kernels.quant_cpu import quant_kernel
    from mlxswitch.models import layout_cache, rows
    from mlxswitch.resources import file_sha256

    kernel = quant_kernel()
    if kernel is None or not kernel.tiled:
        pytest.skip("this machine lays no weight out as tiles")
    monkeypatch.setattr(quant_cpu, "INT8_MIN_INPUTS", 0)  # this tiny model's rows on int8: tiled
    path = tmp_path / "laid.gguf"
    write_qwen2_gguf(path, vocab, Q.Q4_K, down=Q.Q6_K, output=Q.Q6_K)
    first = load_gguf_file("laid", path, "laid")
    folder = converted_dir(file_sha256(path))
    (kept,) = folder.glob(f"{layout_cache.PREFIX}*")
    assert {"q4_k-tiled", "q6_k-tiled"} <= set(_layouts(first.model).values())  # the Q4_K ones as stored
    ids = mx.array([[5, 17, 42, 7, 11]])
    want = np.array(first.model(ids))

    def refuse(*args, **kwargs):
        raise AssertionError("laid out again")

    with monkeypatch.context() as patch:  # the second load reads the layout: nothing packed
        patch.setattr(rows, "tiled_weight", refuse)
        patch.setattr(rows, "tiled_q6k_weight", refuse)
        patch.setattr(rows, "tiled_q4k_weight", refuse)
        again = load_gguf_file("laid", path, "laid")
    assert _layouts(again.model) == _layouts(first.model)
    assert np.array_equal(np.array(again.model(ids)), want)
    whole = kept.read_bytes()
    kept.write_bytes(whole[: len(whole) // 2])  # damaged (a copy cut short): laid out again, replaced
    assert np.array_equal(np.array(load_gguf_file("laid", path, "laid").model(ids)), want)
    assert kept.read_bytes() == whole
    # other keys' files (another version's): the two most recently used are kept; a file that
    # cannot be written is skipped whole
    older, oldest = (folder / f"{layout_cache.PREFIX}{k}{layout_cache.SUFFIX}" for k in ("0123", "4567"))
    kept.rename(older)
    oldest.write_bytes(b"another version's layout")
    os.utime(older, (1e9, 1e9))
    os.utime(oldest, (1e8, 1e8))
    with monkeypatch.context() as patch:
        patch.setattr(
            layout_cache.mx, "save_safetensors", lambda *a, **k: (_ for _ in ()).throw(OSError(28, "full"))
        )
        assert np.array_equal(np.array(load_gguf_file("laid", path, "laid").model(ids)), want)
    assert sorted(f.name for f in folder.glob("*laid-out-*")) == [older.name, oldest.name]
    assert np.array_equal(np.array(load_gguf_file("laid", path, "laid").model(ids)), want)
    assert sorted(f.name for f in folder.glob("*laid-out-*")) == sorted([older.name, kept.name])


def test_damaged_files_are_one_error(tmp_path, vocab):
    path = tmp_path / "damaged.gguf"
    write_qwen2_gguf(path, vocab, Q.Q4_K)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # truncated in the tensor data
    with pytest.raises(ModelFormatError, match="damaged.gguf: cannot read as GGUF"):
        load_gguf_file("damaged", path, "damaged")
    path.write_bytes(b"GGUF" + b"\xff" * 64)
    with pytest.raises(ModelFormatError, match="damaged.gguf"):
        load_gguf_file("damaged", path, "damaged")


def test_packaged_parts_missing_or_damaged_are_one_error(tmp_path, monkeypatch):
    from mlxswitch.models import packaged

    entry = packaged.PackagedGGUF(
        "tiny-packaged", "Tiny", ("tiny_part1", "tiny_part2"), 12, "0" * 64, "qwen-coder"
    )
    files = {}
    for i, name in enumerate(entry.parts):
        files[name] = tmp_path / f"part{i + 1}.bin"
        files[name].write_bytes(b"abcdef")
    monkeypatch.setattr(packaged, "part_file", lambda name: files.get(name))
    monkeypatch.setattr(packaged, "damaged_part", lambda entry: "tiny-part2")
    target = tmp_path / "cache" / "joined.gguf"
    with pytest.raises(
        ModelNotFoundError,
        match=r"model 'tiny-packaged': part tiny-part2 is damaged .*"
        r"reinstall with uv sync --reinstall --extra qwen-coder",
    ):
        packaged.join_parts(entry, target)
    assert not target.exists() and list(target.parent.iterdir()) == []
    del files["tiny_part2"]
    with pytest.raises(
        ModelNotFoundError,
        match=r"part tiny-part2 is not installed; install the parts "
        r"with uv sync --extra qwen-coder",
    ):
        packaged.join_parts(entry, target)


# The largest gap (logits) between the reference's top token and a token the engine takes there.
NEAR_TIE = 0.1


@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"])
def test_the_packaged_pair_decodes_as_an_independent_reference(tmp_path, name):
    """Opt-in: the real Qwen2.5-Coder GGUFs (uv sync --extra qwen-coder), joined, converted and
    decoded greedily by the engine, against NumPy over gguf's dequantization of the same file:
    each token its argmax or a near-tie in its logits."""
    from mlxswitch.decoding.session import ChatSession, GenerationSettings
    from mlxswitch.decoding.tiers import single_model_ladder
    from mlxswitch.models import packaged
    from mlxswitch.models.sources import model_source
    from mlxswitch.routing.router import RouterConfig

    entry = packaged.CATALOGUE[name]
    if not packaged.parts_present(entry):
        pytest.skip(f"the packaged {entry.title} is not installed ({entry.install_hint()})")
    joined = packaged.join_parts(entry, tmp_path / f"{name}.gguf")
    loaded = model_source(f"package:{name}").load()  # converts into the test's own user directory
    session = ChatSession(
        single_model_ladder(loaded, name="model"), RouterConfig(up=()), GenerationSettings(max_tokens=8)
    )
    question = "Write a Python function that reverses a string."
    summary = session.ask(question)
    reader = GGUFReader(str(joined))
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml")}
    reference = NumpyQwen2(
        gguf_floats(joined),
        theta=meta["qwen2.rope.freq_base"],
        eps=meta["qwen2.attention.layer_norm_rms_epsilon"],
        layers=meta["qwen2.block_count"],
        heads=meta["qwen2.attention.head_count"],
        kv_heads=meta["qwen2.attention.head_count_kv"],
    )
    ids = list(
        loaded.tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True
        )
    )
    # Along the engine's own tokens, each is the reference's argmax or a near-tie in its logits:
    # the default rounds activations to int8, which can flip a near-tie (the 0.5B's 4th token
    # here, "simple" 0.020 above "Python"), never a clear choice.
    assert len(summary.tokens) == 8
    for position, token in enumerate(t.id for t in summary.tokens):
        logits = reference.logits(ids)
        assert logits.max() - logits[token] <= NEAR_TIE, (position, token, int(np.argmax(logits)))
        ids.append(token)
