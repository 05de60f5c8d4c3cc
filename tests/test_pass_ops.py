"""The compiled pass operations (kernels/pass_ops.c) against the NumPy blocks' own arithmetic."""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from mlxswitch.kernels import pass_ops
from mlxswitch.kernels.route import current_route, resolve_route, route_for
from mlxswitch.models import block_calls, cpu_blocks, numpy_attention

BUILD = pass_ops.build_pass_ops()
OPS = BUILD.ops
needs_ops = pytest.mark.skipif(OPS is None, reason=f"pass_ops did not build here: {BUILD.detail}")


@needs_ops
@pytest.mark.parametrize("rows, dims", [(1, 7), (1, 1536), (8, 896), (3, 8960), (2, 129)])
def test_rms_norm_gives_the_numpy_block_s_bits(rows, dims):
    rng = np.random.default_rng(dims)
    x = (rng.standard_normal((rows, dims)) * rng.uniform(0.1, 30)).astype(np.float32)
    x[0, dims // 3] *= 400  # a massive activation
    norm = nn.RMSNorm(dims, eps=1e-6)
    norm.weight = mx.array(rng.standard_normal(dims).astype(np.float32))
    assert np.array_equal(cpu_blocks._rms_norm(x, norm, OPS), cpu_blocks._rms_norm(x, norm))


@needs_ops
@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("dims", [64, 128])
def test_rope_gives_the_numpy_block_s_bits_at_every_offset_kind(traditional, dims):
    rng = np.random.default_rng(dims)
    rope = nn.RoPE(dims, traditional=traditional, base=1e6)
    rows = rng.standard_normal((2, 5, 4 * 128)).astype(np.float32)
    x = rows.reshape(2, 5, 4, 128).transpose(0, 2, 1, 3)  # a view, as the block's
    for offset in (0, 37, np.array([3, 250])):  # one offset, or one a sequence (a packed pass)
        got = cpu_blocks._rope(x, rope, offset, OPS)
        assert got.flags.c_contiguous and np.array_equal(got, cpu_blocks._rope(x, rope, offset))


@needs_ops
@pytest.mark.parametrize("length, total", [(1, 1), (1, 40), (8, 96), (3, 700)])
def test_attention_of_a_decoding_pass_equals_numpy_s_query_by_query(length, total):
    rng = np.random.default_rng(total)
    q = rng.standard_normal((1, 12, length, 128)).astype(np.float32)
    held = rng.standard_normal((2, 1, 2, total + 30, 128)).astype(np.float32)  # a cache's room
    k, v = held[0, :, :, :total], held[1, :, :, :total]
    scale = 128**-0.5
    want = numpy_attention.attention_rows(q, k, v, scale, "causal")
    got = numpy_attention.attention_rows(q, k, v, scale, "causal", OPS)
    assert np.allclose(got, want, rtol=1e-5, atol=1e-6)


@needs_ops
def test_attention_under_a_padded_batch_s_mask_sees_each_query_s_own_keys():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 4, 2, 32)).astype(np.float32)
    k, v = (rng.standard_normal((2, 2, 6, 32)).astype(np.float32) for _ in range(2))
    mask = np.zeros((2, 1, 2, 6), dtype=np.float32)
    mask[0, :, :, :2] = -np.inf  # the first sequence left-padded by two
    mask[:, :, 0, 5] = -np.inf  # causal: the first query does not see the last key
    want = numpy_attention.attention_rows(q, k, v, 0.2, mx.array(mask))
    got = numpy_attention.attention_rows(q, k, v, 0.2, mx.array(mask), OPS)
    assert np.allclose(got, want, rtol=1e-5, atol=1e-6)


@needs_ops
def test_silu_times_up_on_column_views_of_one_product():
    rng = np.random.default_rng(5)
    product = (rng.standard_normal((3, 2 * 8960)) * 8).astype(np.float32)
    product[0, :4] = [-120, -90, 90, 120]  # e^±x past fp32's range
    gate, up = product[:, :8960], product[:, 8960:]
    with np.errstate(over="ignore"):
        want = cpu_blocks._silu_times(gate, up)
    got = cpu_blocks._silu_times(gate, up, OPS)
    assert np.allclose(got, want, rtol=1e-5, atol=1e-6)


@needs_ops
def test_a_wrong_operation_is_caught_by_the_check(monkeypatch):
    assert pass_ops.check_ops(OPS) is None
    monkeypatch.setattr(pass_ops.PassOps, "silu_times", lambda self, gate, up: gate * up)
    assert pass_ops.check_ops(OPS) == "silu(gate)·up differed from float64"


@needs_ops
@pytest.mark.parametrize("width", [1, 17, 4133, 151936])
def test_token_signals_equal_float64_numpy_s_on_every_kind_of_row(width):
    from mlxswitch.kernels.signals_numpy import numpy_token_signals

    rng = np.random.default_rng(width)
    logits = (rng.standard_normal((6, width)) * 4).astype(np.float32)
    logits[1, ::2] = -np.inf  # masked tokens (the one left of width 1 too)
    logits[2, -1] = logits[2].max() + 30.0  # near certain: the others' e^d below fp32's least
    logits[3, 0] = np.nan  # broken
    logits[4] = -np.inf  # fully masked
    if width > 1:
        logits[5, [0, width - 1]] = logits[5].max() + 1.0  # a tie for the largest: margin 0
    got, want = OPS.token_signals(logits), numpy_token_signals(logits, np.float64)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-6)
    if width > 1:
        assert got[5, 2] == 0.0


@needs_ops
def test_wrong_token_signals_are_caught_by_the_check(monkeypatch):
    real = pass_ops.PassOps.token_signals
    monkeypatch.setattr(pass_ops.PassOps, "token_signals", lambda self, rows: real(self, rows) * 1.001)
    assert pass_ops.check_ops(OPS) == "the token signals differed from float64 NumPy's"


@needs_ops
def test_the_cpu_route_reads_token_signals_through_them_where_they_built(monkeypatch):
    from mlxswitch.routing import signals

    calls = []
    real = pass_ops.PassOps.token_signals
    monkeypatch.setattr(
        pass_ops.PassOps, "token_signals", lambda self, rows: calls.append(1) or real(self, rows)
    )
    logits = mx.array(np.random.default_rng(1).standard_normal(300).astype(np.float32))
    resolve_route("auto", "cpu")
    assert current_route().signals == "compiled"
    compiled = signals.read_time_signals(logits).values()
    resolve_route("blas", "cpu")  # the NumPy routes without the compiled operations
    assert current_route().signals == "numpy"
    numpy = signals.read_time_signals(logits).values()
    assert len(calls) == 1 and np.allclose(compiled, numpy, rtol=1e-5, atol=1e-6)


def test_the_route_takes_them_on_auto_only_and_says_why_not():
    assert route_for("cpu", "auto", pass_ops=True).pass_ops == "compiled"
    assert route_for("cpu", "auto", pass_ops=True).signals == "compiled"
    assert route_for("cpu", "exact", pass_ops=True).signals == "numpy"
    assert route_for("cpu", "auto").pass_ops == "numpy"  # did not build
    assert route_for("cpu", "exact", pass_ops=True).pass_ops == "numpy"  # the reference arithmetic
    assert route_for("metal", "auto", pass_ops=True).pass_ops == "none"
    described = dict(route_for("cpu", "auto", pass_ops=True).describe())
    assert described["pass_ops"].startswith("compiled C (pass_ops.c)") and "build: " in described["pass_ops"]


@needs_ops
def test_a_model_s_decoding_passes_take_them_and_keep_mlx_logits(monkeypatch):
    from mlx_lm.models.cache import make_prompt_cache
    from tinymodels import llama_config, make_model

    resolve_route("auto", "cpu")
    assert current_route().pass_ops == "compiled"
    model, reference = (make_model(llama_config(vocab_size=300), seed=9) for _ in range(2))
    mx.eval(model.parameters(), reference.parameters())
    cpu_blocks.use_numpy_blocks(model)
    taken = []
    attend = pass_ops.PassOps.attend

    def counted(self, *args):
        out = attend(self, *args)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(pass_ops.PassOps, "attend", counted)
    ours, theirs = make_prompt_cache(model), make_prompt_cache(reference)
    for ids in ([list(range(3, 20))], [[7]], [[9, 4, 77]]):  # a prefill (NumPy's), a step, a check
        got, want = model(mx.array(ids), cache=ours), reference(mx.array(ids), cache=theirs)
        assert np.allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-4)
    assert taken and all(taken)


def _tiny_on_tiles(model_type: str) -> nn.Module:
    """The tiny model these tests decode, 4-bit, on the CPU's routes (row_routes.use_fast_rows)."""
    from tinymodels import llama_config, make_model

    from mlxswitch.models.row_routes import use_fast_rows

    model = make_model(dict(llama_config(vocab_size=300), model_type=model_type), seed=6)
    nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    use_fast_rows(model)
    return model


def _one_calls_counted() -> tuple[list[bool], Callable]:
    """body_in_one_call, and a list of whether each of its calls took the pass (a first pass's
    reference, made inside its check, did not: False)."""
    taken: list[bool] = []

    def counted(*args):
        out = block_calls.body_in_one_call(*args)
        taken.append(out is not None)
        return out

    return taken, counted


@needs_ops
# qwen2: q, k and v with biases; threads: attention split among 1, 2 or 3 (its rows × key heads)
@pytest.mark.parametrize(("model_type", "threads"), [("llama", 2), ("qwen2", 2), ("qwen2", 1), ("qwen2", 3)])
def test_a_body_in_one_call_gives_the_bits_of_the_operations_one_by_one(model_type, threads, monkeypatch):
    from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

    from mlxswitch.kernels import quant_cpu
    from mlxswitch.kernels.quant_cpu import quant_kernel

    monkeypatch.setattr(quant_cpu, "INT8_MIN_INPUTS", 32)  # this tiny model's rows on int8: tiled
    monkeypatch.setattr(quant_cpu, "WIDE_MIN_INPUTS", 32)  # and its down projections' on int16
    resolve_route("auto", "cpu", blas_threads=threads)
    kernel = quant_kernel()
    if kernel is None or not kernel.tiled:
        pytest.skip("no quantized kernel with tiles here")
    model = _tiny_on_tiles(model_type)
    assert block_calls._block_plans(model.layers) is not None
    taken, counted = _one_calls_counted()
    outputs = {}
    for arm, body in (("body", counted), ("one by one", lambda *args: None)):
        monkeypatch.setattr(cpu_blocks, "body_in_one_call", body)
        cache = cpu_blocks.decoding_caches(model, make_prompt_cache(model))
        got = [np.array(model(mx.array([list(range(3, 40))]), cache=cache))]  # a prefill: NumPy's way
        for ids in ([8], [9, 4, 77], list(range(50, 63))):  # a step, a check, 13 rows
            got.append(np.array(model(mx.array([ids]), cache=cache)))
        trim_prompt_cache(cache, 5)  # a rejected draft, then a step after it
        got.append(np.array(model(mx.array([[6]]), cache=cache)))
        got += [np.array(a) for a in cache[-1].state]
        outputs[arm] = got
    # the body's call takes the 4 decoding passes (the prefill is 37 rows: NumPy's many-row way); the
    # first is checked against a reference pass made the operations' way (the second False, inside it)
    assert taken == [False, False, True, True, True, True]
    for mine, theirs in zip(outputs["body"], outputs["one by one"], strict=True):
        assert np.array_equal(mine, theirs)


@needs_ops
def test_a_geared_body_in_one_call_gives_each_gear_the_bits_of_its_planes_one_by_one(monkeypatch):
    # A nested gear's active planes are one product a plane in the same call, each plane's outputs
    # summed as the NumPy block sums them; each count of active planes has its own plans.
    from mlx_lm.models.cache import make_prompt_cache

    from mlxswitch.kernels import quant_cpu
    from mlxswitch.kernels.quant_cpu import quant_kernel
    from mlxswitch.models.nesting import nest_model

    monkeypatch.setattr(quant_cpu, "INT8_MIN_INPUTS", 96)  # 64-wide rows take int16, as SmolLM2's
    monkeypatch.setattr(quant_cpu, "WIDE_MIN_INPUTS", 32)
    resolve_route("auto", "cpu", blas_threads=2)
    kernel = quant_kernel()
    if kernel is None or not kernel.tiled:
        pytest.skip("no quantized kernel with tiles here")
    model = _tiny_on_tiles("qwen2")
    state = nest_model(model, (4, 4), 32)  # its linears marked again: int16 rows
    assert not model.layers[0].self_attn.q_proj.int8_inputs
    taken, counted = _one_calls_counted()
    outputs = {}
    for arm, body in (("body", counted), ("one by one", lambda *args: None)):
        monkeypatch.setattr(cpu_blocks, "body_in_one_call", body)
        cache = cpu_blocks.decoding_caches(model, make_prompt_cache(model))
        state.set(8)
        got = [np.array(model(mx.array([list(range(3, 40))]), cache=cache))]  # a prefill at gear 8
        for gear, ids in ((4, [8]), (8, [9, 4, 77]), (4, [5, 6]), (8, [7])):  # steps and checks by gear
            state.set(gear)
            got.append(np.array(model(mx.array([ids]), cache=cache)))
        outputs[arm] = got + [np.array(a) for a in cache[-1].state]
    # the first decoding pass of each plane count is checked inside (a reference pass: False)
    assert taken == [False, False, True, False, True, True, True]
    assert model.model.one_call_checked and model.model.one_call_checked_2
    assert set(model.layers[0].pass_plans) == {1, 2} and all(
        kept.plan is not None for kept in model.layers[0].pass_plans.values()
    )
    for mine, theirs in zip(outputs["body"], outputs["one by one"], strict=True):
        assert np.array_equal(mine, theirs)


@needs_ops
def test_a_body_whose_first_one_call_pass_differs_keeps_the_operations_one_by_one(monkeypatch, caplog):
    from mlx_lm.models.cache import make_prompt_cache
    from tinymodels import llama_config, make_model

    from mlxswitch.kernels import quant_cpu
    from mlxswitch.kernels.quant_cpu import quant_kernel
    from mlxswitch.models.row_routes import use_fast_rows

    monkeypatch.setattr(quant_cpu, "INT8_MIN_INPUTS", 32)
    monkeypatch.setattr(quant_cpu, "WIDE_MIN_INPUTS", 32)
    resolve_route("auto", "cpu")
    kernel = quant_kernel()
    if kernel is None or not kernel.tiled:
        pytest.skip("no quantized kernel with tiles here")
    outputs = {}
    blocks = pass_ops.PassOps.blocks
    for arm in ("planted", "one by one"):
        model = make_model(dict(llama_config(vocab_size=300), model_type="qwen2"), seed=6)
        nn.quantize(model, group_size=32, bits=4)
        mx.eval(model.parameters())
        use_fast_rows(model)
        if arm == "planted":  # a composition that goes wrong: one hidden value off

            def wrong(self, plans, h, *args):
                done = blocks(self, plans, h, *args)
                h[0, 0] += 1.0
                return done

            monkeypatch.setattr(pass_ops.PassOps, "blocks", wrong)
        else:
            monkeypatch.setattr(cpu_blocks, "body_in_one_call", lambda *args: None)
        cache = cpu_blocks.decoding_caches(model, make_prompt_cache(model))
        got = [np.array(model(mx.array([list(range(3, 40))]), cache=cache))]
        got += [np.array(model(mx.array([ids]), cache=cache)) for ids in ([8], [9, 4, 77], [5])]
        outputs[arm] = got + [np.array(a) for a in cache[-1].state]
        if arm == "planted":
            assert model.model.one_call_checked is False
            assert "differed from its operations one by one" in caplog.text
    for mine, theirs in zip(outputs["planted"], outputs["one by one"], strict=True):
        assert np.array_equal(mine, theirs)


@needs_ops
def test_a_packed_pass_in_one_call_gives_each_conversation_its_own_pass_s_bits(monkeypatch):
    from mlx_lm.models.cache import make_prompt_cache
    from tinymodels import llama_config, make_model

    from mlxswitch.kernels import quant_cpu
    from mlxswitch.kernels.quant_cpu import quant_kernel
    from mlxswitch.models.packed_cache import packed_caches
    from mlxswitch.models.row_routes import use_fast_rows

    monkeypatch.setattr(quant_cpu, "INT8_MIN_INPUTS", 32)  # this tiny model's rows on int8: tiled
    monkeypatch.setattr(quant_cpu, "WIDE_MIN_INPUTS", 32)  # and its down projections' on int16
    resolve_route("auto", "cpu")
    kernel = quant_kernel()
    if kernel is None or not kernel.tiled:
        pytest.skip("no quantized kernel with tiles here")
    model = make_model(dict(llama_config(vocab_size=300), model_type="qwen2"), seed=6)
    nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    use_fast_rows(model)
    taken: list[bool] = []

    def counted(*args):
        out = block_calls.body_in_one_call(*args)
        taken.append(out is not None)
        return out

    prompts = [list(range(3, 40)), list(range(60, 101)), list(range(120, 155))]  # prefills: NumPy's way
    rounds = [([8], [9, 4, 77], [5, 6]), ([11], [12], [13, 14, 15])]  # two packed passes

    def conversations():
        caches = [cpu_blocks.decoding_caches(model, make_prompt_cache(model)) for _ in prompts]
        for cache, ids in zip(caches, prompts, strict=True):
            model(mx.array([ids]), cache=cache)
        return caches

    outputs = {}
    for arm in ("packed in one call", "packed one by one", "alone"):
        one_call = counted if arm == "packed in one call" else (lambda *args: None)
        monkeypatch.setattr(cpu_blocks, "body_in_one_call", one_call)
        caches, got = conversations(), []
        for passes in rounds:
            if arm == "alone":  # each conversation's own pass (one sequence)
                for cache, ids in zip(caches, passes, strict=True):
                    got.append(np.array(model(mx.array([ids]), cache=cache)[0]))
                continue
            packed = packed_caches(caches, [len(ids) for ids in passes])
            logits = np.array(model(mx.array([[i] for ids in passes for i in ids]), cache=packed)[:, 0])
            ends = np.cumsum([len(ids) for ids in passes])  # R rows as R sequences of one
            got += np.split(logits, ends[:-1])
        got += [np.array(a) for cache in caches for a in cache[-1].state]
        outputs[arm] = got
    # the prefills (35-41 rows) go NumPy's many-row way; the first packed pass is checked against a
    # reference made the operations' way (the False inside it), the second is the call's own
    assert taken == [False, False, False, False, True, True]
    for arm in ("packed one by one", "alone"):
        for mine, theirs in zip(outputs["packed in one call"], outputs[arm], strict=True):
            assert np.array_equal(mine, theirs), arm
