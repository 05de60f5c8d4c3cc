"""The fast routes change no token and no tier: greedy output and routing with and without
MLXSWITCH_KERNELS=reference (the multi-row matmul route, and signals read by NumPy on a CPU), and
with the quantized kernel on fp32 activations ("exact") or NumPy's BLAS ("blas")."""

from __future__ import annotations

import pytest

from mlxswitch.api import open_chat, resolve_profile
from mlxswitch.decoding.session import GenerationSettings
from mlxswitch.kernels.route import resolve_route
from mlxswitch.models.rows import RowsQuantizedLinear

PROMPTS = ["What is the capital of France?", "Count: one two three"]


def _answers(profile, monkeypatch, setting: str, max_tokens: int, prompts=PROMPTS) -> list[list[int]]:
    monkeypatch.setenv("MLXSWITCH_KERNELS", setting)
    resolve_route()  # the variable is read when the route is resolved (conftest restores it)
    session = open_chat(profile, settings=GenerationSettings(max_tokens=max_tokens))
    out = []
    for prompt in prompts:
        session.reset()
        out.append([(e.id, e.tier) for e in session.ask(prompt).tokens])
    return out


@pytest.mark.parametrize("kind", ["pair", "gears"])
def test_tiny_ladders_give_the_same_tokens_on_every_route(tiny_pair, monkeypatch, kind):
    small, large = map(str, tiny_pair)
    if kind == "pair":
        profile = resolve_profile(small=small, large=large, tau="1.5", tau_down="1.0", window=2, min_run=2)
    else:
        profile = resolve_profile(model=large, gears="4,8", tau="1.5", window=2, min_run=2)
    # "exact": the quantized kernel on fp32 activations (the default rounds them to int8, a
    # different arithmetic: bench/bench_int8_accuracy.py measures what that changes)
    fast = _answers(profile, monkeypatch, "exact", 16)
    assert fast == _answers(profile, monkeypatch, "blas", 16)
    assert fast == _answers(profile, monkeypatch, "reference", 16)
    assert fast == _answers(profile, monkeypatch, "mx", 16)
    assert len({tier for answer in fast for _, tier in answer}) == 2  # both tiers decided something


def test_the_embedded_gears_give_the_same_tokens_on_every_route(monkeypatch):
    profile = resolve_profile("embedded")
    # "exact", not the default's int8 activations: on this 135M model at 4 bits their rounding
    # moves the router's signal by a few percent (0.94 against 0.99 at the third token), enough
    # to cross the threshold; what int8 changes is measured by bench/bench_int8_accuracy.py.
    fast = _answers(profile, monkeypatch, "exact", 12, PROMPTS[:1])
    assert fast == _answers(profile, monkeypatch, "reference", 12, PROMPTS[:1])
    assert all(len(a) > 3 for a in fast)


def test_plain_quantized_models_take_the_multi_row_route():
    from mlxswitch.models.sources import load_model

    model = load_model("embedded").model
    layers = [m for _, m in model.named_modules() if isinstance(m, RowsQuantizedLinear)]
    assert len(layers) == 30 * 7  # every attention and MLP projection of SmolLM2's 30 layers
