"""Nested gears: error per gear, O(1) switching, save/load, shared-cache decoding vs naive references."""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten

from mlxswitch.decoding.answer import TokenEvent
from mlxswitch.decoding.session import ChatSession, GenerationSettings
from mlxswitch.decoding.tiers import gear_ladder
from mlxswitch.errors import UsageError
from mlxswitch.kernels.route import resolve_route
from mlxswitch.models.gear_files import gear_report, load_geared, save_geared
from mlxswitch.models.gears import GearState, NestedLinear
from mlxswitch.models.model_bytes import bytes_per_token, resident_bytes
from mlxswitch.models.nesting import honest_plane_bits, nest_model, plane_bits_for, source_bits
from mlxswitch.models.row_routes import use_fast_rows
from mlxswitch.models.sources import load_model
from mlxswitch.resources import embedded_gguf_path
from mlxswitch.routing.router import RouterConfig, derive_tiers

sys.path.insert(0, str(Path(__file__).parent))
from tinymodels import llama_config, make_model, save_model_dir, train_tokenizer


@pytest.fixture(autouse=True)
def exact_products():
    """These tests hold products to MLX's within fp32 rounding: the quantized kernel on fp32
    activations (the CPU default rounds them to int8, tested in tests/test_quant_kernel.py)."""
    resolve_route("exact")


GROUP = 64
PLANES = (4, 4, 8)
# Real SmolLM2 weights (Q4_1 GGUF, group 32, dequantized to fp32): an MLP and an attention matrix.
REAL_LAYERS = ("blk.3.ffn_gate", "blk.0.attn_q")


def rms(a: mx.array) -> float:
    return float(mx.sqrt(mx.mean(a * a)))


def _random_weight() -> mx.array:
    mx.random.seed(0)
    return mx.random.normal((512, 576)) * 0.05


@pytest.fixture(scope="module")
def gguf_tensors():
    return mx.load(str(embedded_gguf_path()))


def _real_weight(tensors: dict, prefix: str) -> mx.array:
    return mx.dequantize(
        tensors[f"{prefix}.weight"],
        tensors[f"{prefix}.scales"].astype(mx.float32),
        tensors[f"{prefix}.biases"].astype(mx.float32),
        group_size=32,
        bits=4,
    )


def _plain(weight: mx.array, bits: int) -> mx.array:
    return mx.dequantize(*mx.quantize(weight, group_size=GROUP, bits=bits), group_size=GROUP, bits=bits)


@pytest.fixture(scope="module", params=["random", *REAL_LAYERS])
def weight(request, gguf_tensors):
    # The real weights sit on a 4-bit grid of group 32; nesting at group 64 (and MLX's own
    # min/max grid) does not reproduce that grid, so every gear is a real approximation there.
    return _random_weight() if request.param == "random" else _real_weight(gguf_tensors, request.param)


@pytest.fixture(scope="module")
def nested(weight):
    """Planes as they are saved: scales and biases rounded to half precision."""
    return NestedLinear.from_weight(weight, PLANES, GROUP, GearState(PLANES))


def test_gear_4_is_plain_4_bit_quantization(weight):
    exact = NestedLinear.from_weight(weight, PLANES, GROUP, GearState(PLANES), scale_dtype=mx.float32)
    assert mx.array_equal(exact.dequantized(1), _plain(weight, 4)).item()


def test_gear_4_with_half_scales_is_plain_4_bit_with_half_scales(weight, nested):
    # Same packed integers as mx.quantize; the scales are what a half-precision checkpoint holds.
    q, scales, biases = mx.quantize(weight, group_size=GROUP, bits=4)
    assert mx.array_equal(nested.planes[0]["weight"], q).item()
    assert any(
        mx.array_equal(
            nested.dequantized(1),
            mx.dequantize(
                q,
                scales.astype(half).astype(mx.float32),
                biases.astype(half).astype(mx.float32),
                group_size=GROUP,
                bits=4,
            ),
        ).item()
        for half in (mx.float16, mx.bfloat16)
    )


def test_gear_8_error_within_1_5x_plain_8_bit(weight, nested):
    assert rms(nested.dequantized(2) - weight) <= 1.5 * rms(_plain(weight, 8) - weight)


def test_gear_16_error_below_bf16_rounding(weight, nested):
    bf16 = weight.astype(mx.bfloat16).astype(mx.float32)
    assert rms(nested.dequantized(3) - weight) < rms(bf16 - weight)


@pytest.mark.parametrize("scale", [1e-2, 1e-5])
def test_tiny_residuals_keep_their_precision(scale):
    # mx.quantize floors scales at 1e-7 and fp16 underflows below 6e-8: at weights of 1e-5 the
    # last plane's scales are ~1e-9. Lifting residuals and keeping bf16 where fp16 fails hold
    # gear 16 far below bf16 rounding at any magnitude.
    mx.random.seed(3)
    w = mx.random.normal((64, 256)) * scale
    layer = NestedLinear.from_weight(w, PLANES, GROUP, GearState(PLANES))
    bf16 = rms(w.astype(mx.bfloat16).astype(mx.float32) - w)
    assert rms(layer.dequantized(3) - w) < 0.1 * bf16


def test_forward_at_each_gear_is_the_planes_sum(nested, weight):
    x = mx.random.normal((3, weight.shape[1]))
    for gear, planes in ((4, 1), (8, 2), (16, 3)):
        nested.gear_state.set(gear)
        assert mx.allclose(nested(x), x @ nested.dequantized(planes).T, atol=1e-4).item()


def test_planes_on_the_kernel_are_laid_out_as_tiles_once_and_every_route_reads_their_values(
    monkeypatch, tmp_path
):
    # The first pass on integer rows lays each plane out as the kernel's tiles (the same values,
    # held once); each gear is then one integer product a plane, and a route without integer rows
    # (exact) multiplies the planes' values in mx. Saving refuses tiles, which it would misread.
    import numpy as np

    from mlxswitch.kernels import quant_cpu
    from mlxswitch.kernels.quant_weights import TILED

    kernel = quant_cpu.quant_kernel()
    if kernel is None or not kernel.tiled:
        pytest.skip("no quantized kernel with tiles here")
    monkeypatch.setattr(quant_cpu, "WIDE_MIN_INPUTS", 32)  # these 128-wide rows stand for SmolLM2's
    mx.random.seed(5)
    layer = NestedLinear.from_weight(mx.random.normal((64, 128)), (4, 4), 64, GearState((4, 4)))
    layer.int8_inputs = False  # int16 rows, as row_routes marks a layer too narrow for int8
    values = {count: np.array(layer.dequantized(count)) for count in (1, 2)}
    x = mx.random.normal((1, 40, 128))  # a prefill's rows
    rows = np.array(x)[0]
    resolve_route("auto", "cpu")
    for gear, count in ((4, 1), (8, 2)):
        layer.gear_state.set(gear)
        got = np.array(layer(x))[0]
        tiles = layer.tiled_planes.weights[:count]
        assert layer.planes_tiled and all(view.layout == TILED for view in tiles)
        products = [kernel.times(rows, view, 2, int8=True, wide=True) for view in tiles]
        assert np.array_equal(got, products[0] if count == 1 else products[0] + products[1])
        assert np.array_equal(np.array(layer.dequantized(count)), values[count])  # tiles, same values
        truth = rows.astype(np.float64) @ values[count].T.astype(np.float64)
        assert np.abs(got - truth).max() < 1e-3 * np.abs(truth).max()
    resolve_route("exact", "cpu")  # fp32 rows: the planes' values in mx
    exact = np.array(layer(x))[0].astype(np.float64)
    assert np.abs(exact - truth).max() < 1e-5 * np.abs(truth).max()
    model = nn.Sequential(layer)
    model.gear_state = layer.gear_state
    with pytest.raises(UsageError, match="tiles"):
        save_geared(model, {}, tmp_path / "out")
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_switching_gear_is_one_attribute_write(nested):
    arrays = [(k, id(v)) for k, v in tree_flatten(nested.parameters())]
    state = nested.gear_state
    state.set(16)
    gc.collect()  # nothing unrelated may be freed while we watch the memory
    before, memory = dict(vars(state)), mx.get_active_memory()
    for gear in (4, 8, 16, 4) * 25:
        state.set(gear)
    assert {k: v for k, v in vars(state).items() if before[k] != v} == {"active_planes": 1}
    assert [(k, id(v)) for k, v in tree_flatten(nested.parameters())] == arrays
    assert mx.get_active_memory() == memory  # no array was created
    assert "gear_state" not in nested and not any("gear" in k for k, _ in arrays)
    with pytest.raises(Exception, match="gear 12 is not built"):
        state.set(12)


def test_gear_names_and_plane_widths():
    assert GearState((4, 4, 8)).gears == (4, 8, 16)
    assert GearState((2, 2)).gears == (2, 4)
    assert plane_bits_for((4, 8, 16)) == (4, 4, 8)
    assert plane_bits_for((3, 7)) == (3, 4)
    with pytest.raises(Exception, match="each plane must be one of"):
        plane_bits_for((4, 11))


def test_from_linear_takes_float_and_quantized_layers():
    mx.random.seed(4)
    linear = nn.Linear(128, 32)
    nested = NestedLinear.from_linear(linear, (4, 4, 8), 64, scale_dtype=mx.float32)
    x = mx.random.normal((2, 128))
    assert mx.allclose(nested(x), linear(x), atol=1e-4).item()  # gear 16 with the bias
    quantized = nn.QuantizedLinear.from_linear(linear, group_size=32, bits=4)
    nested = NestedLinear.from_linear(quantized, (4, 4), 64, GearState((4, 4)))
    assert nested.planes[0]["scales"].dtype == mx.float32  # computes in the source's dtype
    # Gear 8 ≈ the 4-bit source (a re-quantization even at the same group: MLX's grid moves).
    assert rms(nested(x) - quantized(x)) < 0.01 * rms(quantized(x))


def test_source_bits_and_honest_planes(tmp_path):
    config = llama_config(64, hidden=64, layers=1, heads=2, kv_heads=1, intermediate=128)
    model = make_model(config, 1)
    assert source_bits(model) is None
    assert honest_plane_bits(None) == (4, 4, 8)
    nn.quantize(model, group_size=64, bits=4)
    assert source_bits(model) == 4
    # From a 4-bit source: one usable 4-bit gear and an 8 that reproduces the source, no more.
    assert honest_plane_bits(4) == (4, 4) and honest_plane_bits(8) == (4, 4)
    state = nest_model(model, honest_plane_bits(4), GROUP)
    assert state.source_bits == 4 and source_bits(model) == 4
    assert gear_report(model).honesty_note() == (
        "source is 4-bit: gears 8 only reproduce the source more exactly, they add no precision beyond 4 bits"
    )
    with pytest.raises(UsageError, match="already nested"):
        nest_model(model)
    # The record and the quantized embedding survive saving.
    again, saved = load_geared(save_geared(model, config, tmp_path / "q"), mx.float32)
    assert saved["mlxswitch_gears"]["source_bits"] == 4 and source_bits(again) == 4
    assert isinstance(again.model.embed_tokens, nn.QuantizedEmbedding)
    ids = mx.array([[3, 1, 4, 1, 5]])
    use_fast_rows(model)  # the blocks a load gives (the CPU's NumPy attention and MLP)
    assert mx.array_equal(model(ids), again(ids)).item()


@pytest.fixture(scope="module")
def tiny_geared(tmp_path_factory):
    tok = train_tokenizer(320)
    config = llama_config(tok.get_vocab_size(), hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128)
    root = tmp_path_factory.mktemp("geared")
    source = save_model_dir(root / "source", make_model(config, 5), config, tok)
    loaded = load_model(str(source))
    calls = []
    nest_model(loaded.model, PLANES, GROUP, progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (15, 15) and len(calls) == 15  # 2 × 7 linears + the untied head
    return loaded, root


def test_every_linear_is_nested_and_embedding_is_not(tiny_geared):
    loaded, _ = tiny_geared
    modules = dict(loaded.model.named_modules())
    assert not any(isinstance(m, (nn.Linear, nn.QuantizedLinear)) for m in modules.values())
    assert isinstance(modules["lm_head"], NestedLinear)  # untied head takes part
    assert isinstance(modules["model.embed_tokens"], nn.Embedding)
    assert all(
        m.gear_state is loaded.model.gear_state for m in modules.values() if isinstance(m, NestedLinear)
    )


def test_tied_head_uses_the_embedding():
    config = llama_config(96, hidden=64, layers=1, heads=2, kv_heads=1, intermediate=128, tie=True)
    model = make_model(config, 2)
    nest_model(model, PLANES, GROUP)
    names = {n for n, m in model.named_modules() if isinstance(m, NestedLinear)}
    assert len(names) == 7 and "lm_head" not in names
    # Tied: the head reads the whole embedding matrix on every token.
    embedding = model.model.embed_tokens.weight.nbytes
    assert bytes_per_token(model, 4) - _plane_bytes(model, 1) == embedding + _norm_bytes(model)


def _plane_bytes(model, planes: int) -> int:
    return sum(
        v.nbytes
        for k, v in tree_flatten(model.parameters())
        if ".planes." in k and int(k.split(".planes.")[1].split(".")[0]) < planes
    )


def _norm_bytes(model) -> int:
    return sum(v.nbytes for k, v in tree_flatten(model.parameters()) if "norm" in k)


def test_bytes_resident_and_per_token(tiny_geared):
    model = tiny_geared[0].model
    row = model.model.embed_tokens.weight.nbytes // model.model.embed_tokens.weight.shape[0]
    for gear, planes in ((4, 1), (8, 2), (16, 3)):
        # Untied: the active planes, the norms and one embedding row.
        assert bytes_per_token(model, gear) == _plane_bytes(model, planes) + _norm_bytes(model) + row
    assert bytes_per_token(model) == bytes_per_token(model, 16)
    embedding = model.model.embed_tokens.weight.nbytes
    assert resident_bytes(model) == _plane_bytes(model, 3) + _norm_bytes(model) + embedding
    report = gear_report(model)
    assert report.bytes_per_token[4] < report.bytes_per_token[8] < report.bytes_per_token[16]
    assert report.honesty_note() == "built from a float source: every gear is real precision"


SCHEDULE = [4, 4, 8, 16, 16, 4, 8, 16, 8, 4, 4, 16, 8, 8, 4, 16]
PROMPT = [1, 17, 33, 99, 150, 7]


def _decode_on_shared_cache(model, schedule):
    """Greedy tokens from ONE cache while the gear changes: the prompt at schedule[0], then each
    token is fed at the gear of the step that consumes it."""
    from mlx_lm.models.cache import make_prompt_cache

    cache, tokens, chunk = make_prompt_cache(model), [], PROMPT
    for gear in schedule:
        model.gear_state.set(gear)
        tokens.append(int(mx.argmax(model(mx.array(chunk)[None], cache=cache)[0, -1]).item()))
        chunk = tokens[-1:]
    return tokens


def _from_scratch(model, tokens, schedule, step):
    """Logits of token `step`, from nothing: a fresh cache, every earlier token at its recorded gear."""
    from mlx_lm.models.cache import make_prompt_cache

    cache, chunk = make_prompt_cache(model), PROMPT
    for t in range(step + 1):
        model.gear_state.set(schedule[t])
        logits = model(mx.array(chunk)[None], cache=cache)[0, -1]
        chunk = tokens[t : t + 1]
    return logits


def test_gear_switching_on_a_shared_cache_matches_the_from_scratch_reference(tiny_geared):
    model = tiny_geared[0].model
    tokens = _decode_on_shared_cache(model, SCHEDULE)
    assert len(set(tokens)) > 8
    reference = [
        int(mx.argmax(_from_scratch(model, tokens, SCHEDULE, t)).item()) for t in range(len(SCHEDULE))
    ]
    assert tokens == reference


def test_one_gear_on_a_cache_matches_the_whole_prefix_from_scratch(tiny_geared):
    # At a fixed gear, cached decoding gives the tokens of recomputing the whole prefix. With a
    # changing gear it cannot: the cache keeps K/V from the gears that made them (measured on this
    # random model: logits then differ from a whole-prefix-at-the-current-gear run by up to ~14
    # with gear 4 in the mix, ~0.9 with gears 8/16 only), which is the price of free switching.
    model = tiny_geared[0].model
    for gear in (4, 16):
        tokens = _decode_on_shared_cache(model, [gear] * 6)
        for t, token in enumerate(tokens):
            model.gear_state.set(gear)
            logits = model(mx.array(PROMPT + tokens[:t])[None])[0, -1]
            assert int(mx.argmax(logits).item()) == token


def _stepwise_tokens_at_gears(model, prompt_ids, gears):
    """One shared cache: the prompt prefilled at the top gear, then each id fed by the next step's gear."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    model.gear_state.set(model.gear_state.gears[-1])  # the prompt is prefilled at the top gear
    model(mx.array(prompt_ids[:-1])[None], cache=cache)
    last, out = prompt_ids[-1], []
    for gear in gears:
        model.gear_state.set(gear)
        token = int(mx.argmax(model(mx.array([last])[None], cache=cache)[0, -1]).item())
        out.append(token)
        last = token
    return out


def _run(loaded, gear_list, config, prompt="The quick brown fox"):
    session = ChatSession(gear_ladder(loaded, gear_list), config, GenerationSettings(max_tokens=24))
    events = [e for e in session.stream(prompt) if isinstance(e, TokenEvent)]
    return session, events, session.render([{"role": "user", "content": prompt}])


def test_engine_switching_matches_stepwise_reference(tiny_geared):
    loaded, _ = tiny_geared
    config = RouterConfig(up=(0.8, 1.6), down=(0.48, 1.12), window=2, min_run=2, vocab_size=loaded.vocab_size)
    session, events, prompt_ids = _run(loaded, [4, 8, 16], config)
    gears = [int(e.tier[1:]) for e in events]
    assert len(set(gears)) == 3, "thresholds must make the test visit every gear"
    assert [e.id for e in events] == _stepwise_tokens_at_gears(loaded.model, prompt_ids, gears)
    summary = session.last_summary
    derived = derive_tiers(summary.initial_entropy, [e.entropy for e in events], config, 3)
    assert derived[: len(events)] == [e.rung for e in events]


def test_engine_high_gears_match_the_whole_prefix_reference(tiny_geared):
    # Teacher-forced on the engine's own tokens: each one must be the argmax of the whole prefix
    # recomputed at its gear, except at near-ties (top-2 gap < 0.25 logits) where the cache's
    # precision mix (K/V kept from other gears) may legitimately decide.
    loaded, _ = tiny_geared
    config = RouterConfig(up=(1.5,), down=(1.0,), window=2, min_run=2, vocab_size=loaded.vocab_size)
    _, events, ids = _run(loaded, [8, 16], config)
    assert len({e.tier for e in events}) == 2
    checked = 0
    for event in events:
        loaded.model.gear_state.set(int(event.tier[1:]))
        logits = loaded.model(mx.array(ids)[None])[0, -1]
        top = mx.topk(logits, 2)
        if float(mx.max(top) - mx.min(top)) >= 0.25:
            assert event.id == int(mx.argmax(logits).item())
            checked += 1
        ids.append(event.id)
    assert checked >= 0.8 * len(events)


def test_save_and_load_round_trip_and_size(tiny_geared, monkeypatch):
    loaded, root = tiny_geared
    out = save_geared(loaded.model, loaded.config, root / "saved")
    spec = json.loads((out / "config.json").read_text())["mlxswitch_gears"]
    assert spec == {"plane_bits": [4, 4, 8], "group_size": GROUP, "source_bits": None, "embedding": None}
    monkeypatch.setattr(mx, "quantize", None)  # loading must not re-quantize
    again, config = load_geared(out, mx.float32)
    assert config["model_type"] == "llama"
    ids = mx.array([[1, 5, 9, 42, 7]])
    for gear in (4, 8, 16):
        loaded.model.gear_state.set(gear)
        again.gear_state.set(gear)
        assert mx.array_equal(loaded.model(ids), again(ids)).item()
    # Against a bf16 copy: 2 bytes per linear weight element plus the other tensors in bf16.
    linear_elements = sum(
        m.planes[0]["weight"].shape[0] * m.planes[0]["scales"].shape[1] * GROUP
        for _, m in loaded.model.named_modules()
        if isinstance(m, NestedLinear)
    )
    other = sum(v.size for k, v in tree_flatten(loaded.model.parameters()) if ".planes." not in k)
    saved = (out / "model.safetensors").stat().st_size
    assert saved <= 1.15 * 2 * (linear_elements + other)
    stored = mx.load(str(out / "model.safetensors"))
    assert {v.dtype for k, v in stored.items() if k.endswith(("scales", "biases"))} <= {
        mx.float16,
        mx.bfloat16,
    }


def test_quantized_source_is_reported_honestly():
    smol = load_model("embedded")
    assert source_bits(smol.model) == 4
    state = nest_model(smol.model, honest_plane_bits(4), GROUP)
    assert state.gears == (4, 8)
    assert "source is 4-bit: gears 8 only reproduce the source" in gear_report(smol.model).honesty_note()
    # Tied head: the top gear reads every resident byte (the whole embedding is the head).
    assert bytes_per_token(smol.model, 4) < bytes_per_token(smol.model, 8) == resident_bytes(smol.model)
