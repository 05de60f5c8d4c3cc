"""Attention and the gated MLP on the CPU's eager route (mlxswitch/models/cpu_blocks.py): the same
numbers as MLX's own, for every mask kind, grouped heads and a KV cache."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from mlxswitch.kernels.route import resolve_route
from mlxswitch.models.cpu_blocks import NumpyAttention, NumpyMLP
from mlxswitch.models.numpy_attention import numpy_attention
from mlxswitch.models.row_routes import use_fast_rows


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


@pytest.mark.parametrize(("length", "total"), [(40, 40), (300, 420), (128, 600)])
def test_a_long_causal_pass_taken_a_block_of_queries_at_a_time_equals_mlx(length, total):
    # past INT8_MAX_POSITIONS: one product a block of CAUSAL_BLOCK queries, over the keys it sees
    q, k, v = _qkv(length=length, total=total)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask="causal")
    got = numpy_attention(q, k, v, 0.25, "causal")
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
def test_prefills_steps_and_checks_run_the_numpy_block_with_mlx_logits(model_type, monkeypatch):
    from tinymodels import llama_config, make_model

    from mlxswitch.models import cpu_blocks

    taken = []
    block = cpu_blocks.numpy_block

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
        monkeypatch.setattr(cpu_blocks, "numpy_block", counted)
        cache = make_prompt_cache(model)
        logits[kernels] = [np.array(model(ids, cache=cache))]
        if kernels == "exact":
            assert taken == [True, True]  # a 40-token prefill (the many-row paths): NumPy's too
        logits[kernels] += [np.array(model(step, cache=cache)) for step in steps]
    assert taken == [True, True] * (1 + len(steps))  # then a step and a 3-row check
    for want, got in zip(logits["reference"], logits["exact"], strict=True):
        assert np.allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_cache_kept_in_numpy_gives_mlx_caches_bits_through_prefills_trims_and_restores():
    from mlx_lm.models.cache import KVCache, trim_prompt_cache
    from tinymodels import llama_config, make_model

    from mlxswitch.models.cpu_blocks import decoding_caches
    from mlxswitch.models.numpy_cache import EVERY_POSITION, NumpyKVCache

    resolve_route("auto", "cpu")
    model = make_model(llama_config(vocab_size=300), seed=5)
    nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    use_fast_rows(model)
    plain = make_prompt_cache(model)
    kept = decoding_caches(model, make_prompt_cache(model))
    assert all(type(c) is NumpyKVCache for c in kept) and all(type(c) is KVCache for c in plain)
    prompt = mx.array([list(range(3, 43))])  # a prefill: written to the NumPy copy too
    passes = [prompt] + [mx.array([[t]]) for t in range(7, 12)] + [mx.array([[9, 4, 77]])]
    for ids in passes:
        assert np.array_equal(np.array(model(ids, cache=kept)), np.array(model(ids, cache=plain)))
    assert kept[0].pending < kept[0].offset  # the steps' rows are held in NumPy only...
    for a, b in zip(kept, plain, strict=True):  # ...and MLX's arrays are brought up to date when read
        assert a.offset == b.offset
        for mine, theirs in zip(a.state[:2], b.state[:2], strict=True):
            assert np.array_equal(np.array(mine[:, :, : a.offset]), np.array(theirs[:, :, : b.offset]))
    # a rejected draft trimmed, a step, a second prefill chunk, then a step again
    for caches in (kept, plain):
        trim_prompt_cache(caches, 2)
    passes = [mx.array([[5]]), mx.array([list(range(50, 90))]), mx.array([[6]])]
    for ids in passes:
        assert np.array_equal(np.array(model(ids, cache=kept)), np.array(model(ids, cache=plain)))
        # every pass (a prefill's too) writes NumPy's copy only: MLX's arrays wait for a reader
        assert kept[0].pending < kept[0].offset
    # a packed pass's way: MLX's update right after steps kept in NumPy only
    rows = mx.array(np.random.default_rng(0).standard_normal((1, 2, 3, 16)).astype(np.float32))
    cache = NumpyKVCache()
    cache.append_rows(np.ones((1, 2, 2, 16), np.float32), np.zeros((1, 2, 2, 16), np.float32))
    keys, values = cache.update_and_fetch(rows, rows)
    assert cache.offset == 5 and cache.pending == EVERY_POSITION and cache.mirrored == 2
    assert np.array_equal(np.array(keys[:, :, :2]), np.ones((1, 2, 2, 16)))
    assert np.array_equal(np.array(values[:, :, 2:]), np.array(rows))
    again, _ = cache.append_rows(np.full((1, 2, 1, 16), 3, np.float32), np.zeros((1, 2, 1, 16), np.float32))
    assert np.array_equal(again[:, :, 2:5], np.array(rows)) and (again[:, :, 5] == 3).all()
    # a kept conversation's state restored into a fresh cache: its next step reads it
    restored = decoding_caches(model, make_prompt_cache(model))
    for mine, theirs in zip(restored, plain, strict=True):
        mine.state = theirs.state
    step = mx.array([[13]])
    assert np.array_equal(np.array(model(step, cache=restored)), np.array(model(step, cache=plain)))


def test_only_plain_caches_of_a_model_on_the_numpy_blocks_are_kept_in_numpy():
    from mlx_lm.models.cache import KVCache, RotatingKVCache
    from tinymodels import llama_config, make_model

    from mlxswitch.models.cpu_blocks import decoding_caches

    resolve_route("reference", "cpu")  # no NumPy blocks
    model = make_model(llama_config(vocab_size=300), seed=5)
    use_fast_rows(model)
    assert all(type(c) is KVCache for c in decoding_caches(model, make_prompt_cache(model)))
    resolve_route("auto", "cpu")
    model = make_model(llama_config(vocab_size=300), seed=5)
    use_fast_rows(model)
    rotating = [RotatingKVCache(max_size=64) for _ in model.layers]
    assert decoding_caches(model, rotating) is rotating


def test_a_cache_kept_in_numpy_counts_both_copies_in_its_bytes():
    from mlxswitch.models.numpy_cache import NumpyKVCache

    cache = NumpyKVCache()
    assert cache.nbytes == 0
    rows = np.ones((1, 2, 3, 8), dtype=np.float32)
    keys, values = cache.append_rows(rows, 2 * rows)
    assert keys.shape == values.shape == (1, 2, 3, 8) and cache.offset == 3
    # MLX's arrays, made when read, and the NumPy copy: 256 positions each (mlx-lm's growth step)
    assert cache.nbytes == 2 * (2 * 2 * 256 * 8 * 4)
    assert np.array_equal(np.array(cache.state[1][:, :, :3]), 2 * rows)


def test_a_prefill_chunk_kept_in_numpy_is_not_copied_into_mlx_arrays_until_read():
    from mlxswitch.models.numpy_cache import NumpyKVCache, arrays_to_evaluate

    cache = NumpyKVCache()
    rows = np.ones((1, 2, 3, 16), np.float32)
    cache.append_rows(rows, rows)  # a NumPy block's pass: NumPy holds the positions
    assert arrays_to_evaluate(cache) == [] and cache.pending < cache.offset
    keys = cache.state[0]  # a reader (the prompt cache): MLX's arrays brought up to date
    assert np.array_equal(np.array(keys[:, :, :3]), rows) and cache.pending > cache.offset
    more = mx.zeros((1, 2, 2, 16))
    cache.update_and_fetch(more, more)  # MLX's own write: lazy, evaluated after the chunk
    assert len(arrays_to_evaluate(cache)) == 2
