"""Attention and the gated MLP on the CPU's eager route (mlxswitch/models/cpu_blocks.py): the same
numbers as MLX's own, for every mask kind, grouped heads and a KV cache."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from mlxswitch.kernels.route import resolve_route
from mlxswitch.models.cpu_blocks import NumpyAttention, NumpyMLP, numpy_attention
from mlxswitch.models.rows import use_fast_rows


def _qkv(heads=6, kv_heads=2, length=5, total=9, dim=16, seed=0):
    keys = mx.random.split(mx.random.key(seed), 3)
    q = mx.random.normal((2, heads, length, dim), key=keys[0])
    k = mx.random.normal((2, kv_heads, total, dim), key=keys[1])
    v = mx.random.normal((2, kv_heads, total, dim), key=keys[2])
    return q, k, v


@pytest.mark.parametrize("kind", ["none", "causal", "bool", "additive", "per-head"])
def test_numpy_attention_equals_mlx_for_every_mask_kind(kind):
    q, k, v = _qkv()
    length, total = q.shape[2], k.shape[2]
    allowed = mx.array(np.arange(total)[None, :] <= np.arange(total - length, total)[:, None])
    mask = {
        "none": None,
        "causal": "causal",
        "bool": allowed,
        "additive": mx.where(allowed, 0.0, -1e9).astype(mx.float32)[None, None],
        "per-head": mx.broadcast_to(allowed, (2, 6, length, total)),
    }[kind]
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)
    got = numpy_attention(q, k, v, 0.25, mask)
    assert got is not None and np.allclose(np.array(got), np.array(want), atol=1e-5)


def test_an_unknown_mask_kind_is_left_to_mlx():
    q, k, v = _qkv()
    assert numpy_attention(q, k, v, 0.25, "sliding") is None


@pytest.mark.parametrize("tie", [True, False])
def test_a_model_on_the_numpy_blocks_gives_mlx_logits_with_a_cache(tie):
    from tinymodels import llama_config, make_model

    ids, step = mx.array([[5, 17, 42, 7, 99, 3, 11]]), mx.array([[8]])
    logits = {}
    for kernels in ("reference", "exact"):  # exact: fp32 activations in the quantized kernel
        resolve_route(kernels, "cpu")
        model = make_model(llama_config(vocab_size=300, tie=tie), seed=5)
        nn.quantize(model, group_size=32, bits=4)
        mx.eval(model.parameters())
        use_fast_rows(model)
        layer = model.model.layers[0]
        assert isinstance(layer.self_attn, NumpyAttention) == (kernels == "exact")
        assert isinstance(layer.mlp, NumpyMLP) == (kernels == "exact")
        cache = make_prompt_cache(model)
        logits[kernels] = [np.array(model(ids, cache=cache))] + [
            np.array(model(step, cache=cache)) for _ in range(3)
        ]
    for want, got in zip(logits["reference"], logits["exact"], strict=True):
        assert np.allclose(got, want, rtol=1e-4, atol=1e-4)


def test_under_compile_the_blocks_fall_back_to_mlx():
    from tinymodels import llama_config, make_model

    resolve_route("auto", "cpu")
    model = make_model(llama_config(vocab_size=300), seed=2)
    use_fast_rows(model)
    ids = mx.array([[5, 17, 42]])
    want = np.array(model(ids))
    got = np.array(mx.compile(lambda x: model(x))(ids))  # evaluation refused inside: MLX's code
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("dims", [16, 12])  # all of a head's dims, or the first part
def test_rope_in_numpy_equals_mlx(traditional, dims):
    from mlxswitch.models.cpu_blocks import _rope

    rope = nn.RoPE(dims, traditional=traditional, base=10000.0, scale=0.5)
    x = np.random.default_rng(1).standard_normal((3, 2, 4, 16)).astype(np.float32)
    for offset in (0, 37, mx.array([0, 5, 90])):  # one per sequence, as a packed pass gives
        want = np.array(rope(mx.array(x), offset=offset))
        got = _rope(x, rope, np.array(offset) if isinstance(offset, mx.array) else offset)
        assert np.allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])  # qwen2: biased q, k, v projections
def test_decoding_passes_run_the_numpy_block_with_mlx_logits(model_type, monkeypatch):
    from tinymodels import llama_config, make_model

    from mlxswitch.models import cpu_blocks

    taken = []
    block = cpu_blocks.decoding_block

    def counted(*args):
        out = block(*args)
        taken.append(out is not None)
        return out

    ids, steps = mx.array([list(range(3, 43))]), [mx.array([[8]]), mx.array([[9, 4, 77]])]
    logits = {}
    for kernels in ("reference", "exact"):
        resolve_route(kernels, "cpu")
        config = dict(llama_config(vocab_size=300), model_type=model_type)
        model = make_model(config, seed=5)
        nn.quantize(model, group_size=32, bits=4)
        mx.eval(model.parameters())
        use_fast_rows(model)
        monkeypatch.setattr(cpu_blocks, "decoding_block", counted)
        cache = make_prompt_cache(model)
        logits[kernels] = [np.array(model(ids, cache=cache))]
        if kernels == "exact":
            assert taken == [False, False]  # a 40-token prefill: mlx-lm's blocks
        logits[kernels] += [np.array(model(step, cache=cache)) for step in steps]
    assert taken == [False, False] + [True, True] * len(steps)  # a step and a 3-row check: NumPy's
    for want, got in zip(logits["reference"], logits["exact"], strict=True):
        assert np.allclose(got, want, rtol=1e-4, atol=1e-4)
