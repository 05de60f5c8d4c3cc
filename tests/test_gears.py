"""Nested gears: error per gear, O(1) switching, save/load, shared-cache decoding vs a naive reference."""

from __future__ import annotations

import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten

from mlxswitch.engine import ChatSession, GenerationSettings, TokenEvent
from mlxswitch.gears import (STORAGE_DTYPE, GearState, NestedLinear, bytes_per_token, gear_report,
                             load_geared_dir, nest_model, plane_bits_for, resident_bytes, save_geared)
from mlxswitch.ladder import gear_ladder
from mlxswitch.loading import load_model
from mlxswitch.resources import embedded_gguf_path
from mlxswitch.router import RouterConfig, derive_tiers

sys.path.insert(0, str(Path(__file__).parent))
from tinymodels import llama_config, make_model, save_model_dir, train_tokenizer  # noqa: E402

GROUP = 64


def rms(a: mx.array) -> float:
    return float(mx.sqrt(mx.mean(a * a)))


def _random_weight() -> mx.array:
    mx.random.seed(0)
    return mx.random.normal((512, 576)) * 0.05


def _real_weight() -> mx.array:
    # A SmolLM2 MLP weight from the embedded GGUF (Q4_1, group 32), dequantized to fp32.
    tensors = mx.load(str(embedded_gguf_path()))
    prefix = "blk.3.ffn_gate"
    return mx.dequantize(tensors[f"{prefix}.weight"], tensors[f"{prefix}.scales"].astype(mx.float32),
                         tensors[f"{prefix}.biases"].astype(mx.float32), group_size=32, bits=4)


def _plain(weight: mx.array, bits: int) -> mx.array:
    return mx.dequantize(*mx.quantize(weight, group_size=GROUP, bits=bits), group_size=GROUP, bits=bits)


@pytest.fixture(scope="module", params=["random", "real"])
def weight(request):
    return _random_weight() if request.param == "random" else _real_weight()


@pytest.fixture(scope="module")
def nested(weight):
    return NestedLinear.from_weight(weight, (4, 4, 8), GROUP, GearState((4, 4, 8)))


def test_gear_4_is_plain_4_bit_with_stored_scales(weight, nested):
    # A stock 4-bit MLX checkpoint stores its scales and biases in half precision too.
    q, scales, biases = mx.quantize(weight, group_size=GROUP, bits=4)
    plain = mx.dequantize(q, scales.astype(STORAGE_DTYPE).astype(mx.float32),
                          biases.astype(STORAGE_DTYPE).astype(mx.float32), group_size=GROUP, bits=4)
    assert mx.array_equal(nested.dequantized(1), plain).item()


def test_gear_8_error_within_1_5x_plain_8_bit(weight, nested):
    assert rms(nested.dequantized(2) - weight) <= 1.5 * rms(_plain(weight, 8) - weight)


def test_gear_16_error_below_bf16_rounding(weight, nested):
    bf16 = weight.astype(mx.bfloat16).astype(mx.float32)
    assert rms(nested.dequantized(3) - weight) < rms(bf16 - weight)


def test_forward_at_each_gear_is_the_planes_sum(nested, weight):
    x = mx.random.normal((3, weight.shape[1]))
    for gear, planes in ((4, 1), (8, 2), (16, 3)):
        nested.switch.set(gear)
        assert mx.allclose(nested(x), x @ nested.dequantized(planes).T, atol=1e-4).item()


def test_switching_gear_touches_no_array(nested):
    before = [id(v) for _, v in tree_flatten(nested.parameters())]
    nested.switch.set(4)
    nested.switch.set(16)
    assert [id(v) for _, v in tree_flatten(nested.parameters())] == before


def test_gear_names_and_plane_widths():
    assert GearState((4, 4, 8)).gears == (4, 8, 16)
    assert plane_bits_for((4, 8, 16)) == (4, 4, 8)
    assert plane_bits_for((3, 7)) == (3, 4)
    with pytest.raises(Exception, match="each plane must be one of"):
        plane_bits_for((4, 11))


@pytest.fixture(scope="module")
def tiny_geared(tmp_path_factory):
    tok = train_tokenizer(320)
    config = llama_config(tok.get_vocab_size(), hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128)
    root = tmp_path_factory.mktemp("geared")
    source = save_model_dir(root / "source", make_model(config, 5), config, tok)
    loaded = load_model(str(source))
    nest_model(loaded.model, (4, 4, 8), GROUP)
    return loaded, root


def test_every_linear_is_nested_and_embedding_is_not(tiny_geared):
    loaded, _ = tiny_geared
    modules = dict(loaded.model.named_modules())
    assert not any(isinstance(m, (nn.Linear, nn.QuantizedLinear)) for m in modules.values())
    assert isinstance(modules["lm_head"], NestedLinear)  # untied head takes part
    assert isinstance(modules["model.embed_tokens"], nn.Embedding)
    report = gear_report(loaded.model, None)
    assert report.bytes_per_token[4] < report.bytes_per_token[8] < report.bytes_per_token[16]
    assert report.bytes_per_token[16] <= resident_bytes(loaded.model)


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
    return session, events, session._render([{"role": "user", "content": prompt}])


def test_shared_cache_switching_matches_stepwise_reference(tiny_geared):
    loaded, _ = tiny_geared
    config = RouterConfig(up=(0.8, 1.6), down=(0.48, 1.12), window=2, min_run=2,
                          vocab_size=loaded.vocab_size)
    session, events, prompt_ids = _run(loaded, [4, 8, 16], config)
    gears = [int(e.tier[1:]) for e in events]
    assert len(set(gears)) == 3, "thresholds must make the test visit every gear"
    assert [e.id for e in events] == _stepwise_tokens_at_gears(loaded.model, prompt_ids, gears)
    summary = session.last_summary
    derived = derive_tiers(summary.initial_entropy, [e.entropy for e in events], config, 3)
    assert derived[: len(events)] == [e.rung for e in events]


def test_high_gears_match_the_from_scratch_reference(tiny_geared):
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


def test_save_and_load_round_trip_and_size(tiny_geared):
    loaded, root = tiny_geared
    out = root / "saved"
    save_geared(loaded, out, (4, 4, 8), GROUP, None)
    again = load_geared_dir(str(out), out, "saved")
    ids = mx.array([[1, 5, 9, 42, 7]])
    for gear in (4, 8, 16):
        loaded.model.gear_state.set(gear)
        again.model.gear_state.set(gear)
        assert mx.allclose(loaded.model(ids), again.model(ids), atol=1e-5).item()
    # Against a bf16 copy: 2 bytes per linear weight element plus the other tensors in bf16.
    linear_elements = sum(m.planes[0]["weight"].shape[0] * m.planes[0]["scales"].shape[1] * GROUP
                          for _, m in loaded.model.named_modules() if isinstance(m, NestedLinear))
    other = sum(v.size for k, v in tree_flatten(loaded.model.parameters()) if "planes" not in k)
    saved = (out / "model.safetensors").stat().st_size
    assert saved <= 1.15 * 2 * (linear_elements + other)
    assert again.tokenizer.encode("hello there") == loaded.tokenizer.encode("hello there")


def test_quantized_source_is_reported_honestly():
    smol = load_model("embedded")
    state = nest_model(smol.model, (4, 4, 8), GROUP)
    report = gear_report(smol.model, 4)
    assert "source is 4-bit: gears 8, 16 only reproduce the source" in report.honesty_note()
    # Gear 16 reproduces the Q4_1 source closely even though its grid (group 32) differs.
    layer = smol.model.model.layers[0].mlp.gate_proj
    state.set(16)
    assert isinstance(layer, NestedLinear)
    assert bytes_per_token(smol.model, 4) < bytes_per_token(smol.model, 16)
