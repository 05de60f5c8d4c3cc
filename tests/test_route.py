"""The route (mlxswitch/kernels/route.py): decided once from the device, the kernels setting and
the BLAS threads, read by every dispatcher. CUDA and Metal are faked here (MLX's CPU build): the
route resolved for them, and the code paths it selects, minus the device."""

from __future__ import annotations

import json

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from mlxswitch.kernels import _common, nested, nested_cpu, route
from mlxswitch.kernels.route import (
    KERNELS_ENV,
    current_route,
    kernels_override,
    resolve_route,
    route_for,
)
from mlxswitch.models import row_routes, rows
from mlxswitch.models.weights import compute_dtype
from mlxswitch.routing.signals import read_time_signals, token_signals_numpy

FIELDS = [
    "backend",
    "metal",
    "kernels",
    "signals",
    "plain_linears",
    "quant_activations",
    "quant_scales",
    "resident_product",
    "nested",
    "pass_ops",
    "multi_row",
    "blas_threads",
    "compute_dtype",
]


def _fields(r):
    return (r.signals, r.plain_linears, r.nested, r.multi_row, r.compute_dtype)


def test_the_cpu_routes_are_what_each_setting_always_took():
    assert _fields(route_for("cpu", "auto")) == (
        "numpy",
        "resident-fp32",
        "reference",
        "numpy-blas",
        "float32",
    )
    assert _fields(route_for("cpu", "mx")) == ("mx-ops", "rows", "reference", "mx-dense", "float32")
    assert _fields(route_for("cpu", "reference")) == ("mx-ops", "rows", "reference", "reference", "float32")
    assert route_for("cpu").numpy_allowed and not route_for("cpu", "mx").numpy_allowed


def test_the_quantized_kernel_is_the_cpu_default_where_it_built():
    quant = route_for("cpu", "auto", quant_kernel=True, panel_kernel=False)
    assert _fields(quant) == ("numpy", "quant-kernel", "quant-kernel", "numpy-blas", "float32")
    assert quant.resident_product == "none"  # no fp32 copies at all
    # Other settings rule it out: fp32 keeps resident copies on the panel kernel, as before.
    fp32 = route_for("cpu", "fp32", quant_kernel=True, panel_kernel=True)
    assert (fp32.plain_linears, fp32.resident_product) == ("resident-fp32", "panel-kernel")
    for kernels in ("blas", "mx", "reference"):
        assert route_for("cpu", kernels, quant_kernel=True).plain_linears != "quant-kernel"
    assert route_for("metal", quant_kernel=True).plain_linears == "mlx-module"


def test_the_panel_kernel_is_taken_only_where_it_built_and_the_setting_allows():
    assert route_for("cpu", "auto", panel_kernel=True).resident_product == "panel-kernel"
    assert route_for("cpu", "auto", panel_kernel=False).resident_product == "numpy-blas"
    # "blas": the NumPy routes of "auto" with the kernel ruled out.
    blas = route_for("cpu", "blas", panel_kernel=True)
    assert blas.resident_product == "numpy-blas" and blas.numpy_allowed
    assert _fields(blas) == _fields(route_for("cpu", "auto"))
    for kernels in ("mx", "reference"):
        assert route_for("cpu", kernels, panel_kernel=True).resident_product == "none"
    assert route_for("metal", panel_kernel=True).resident_product == "none"


@pytest.mark.parametrize("kernels", ["auto", "mx", "reference"])
def test_a_gpu_keeps_mlx_own_modules_and_ops(kernels):
    cuda = route_for("cuda", kernels)
    assert _fields(cuda) == ("mx-ops", "mlx-module", "reference", "reference", None)
    assert cuda.on_gpu and not cuda.numpy_allowed and not cuda.metal
    metal = route_for("metal", kernels)
    ours = "reference" if kernels == "reference" else "metal-kernel"
    assert (metal.signals, metal.nested) == ("mx-ops" if ours == "reference" else ours, ours)
    assert (metal.plain_linears, metal.multi_row, metal.compute_dtype) == ("mlx-module", "reference", None)


def test_the_device_tests_pick_the_backend(monkeypatch):
    monkeypatch.setattr(route, "_default_is_gpu", lambda: False)
    assert route.detect_backend() == "cpu"
    monkeypatch.setattr(route, "_default_is_gpu", lambda: True)
    monkeypatch.setattr(route, "_metal_available", lambda: True)
    assert route.detect_backend() == "metal"
    monkeypatch.setattr(route, "_metal_available", lambda: False)
    assert route.detect_backend() == "cuda"
    assert resolve_route().backend == "cuda" and current_route().plain_linears == "mlx-module"


def test_the_setting_is_read_when_the_route_is_resolved_not_per_call(monkeypatch):
    monkeypatch.delenv(KERNELS_ENV, raising=False)
    assert resolve_route().kernels == "auto"
    monkeypatch.setenv(KERNELS_ENV, "reference")
    assert current_route().kernels == "auto" and not _common.force_reference()  # not re-read
    assert resolve_route().kernels == "reference" and _common.force_reference()
    monkeypatch.setenv(KERNELS_ENV, " MX ")
    assert resolve_route().kernels == "mx"
    monkeypatch.setenv(KERNELS_ENV, "fast-please")
    with pytest.raises(ValueError, match=KERNELS_ENV):
        resolve_route()


def test_kernels_override_restores_the_route(monkeypatch):
    monkeypatch.delenv(KERNELS_ENV, raising=False)
    before = resolve_route()
    with kernels_override("reference") as inside:
        assert current_route() is inside and inside.force_reference
        assert nested_cpu.cpu_route(200, 3) == "reference"
    assert current_route() is before


def test_blas_threads_live_in_the_route_and_survive_a_new_resolution(monkeypatch):
    monkeypatch.setattr(route, "_ROUTE", None)
    assert _common.blas_threads_setting() == _common.available_cores()  # every core by default
    assert _common.set_blas_threads(3) == 3
    assert current_route().blas_threads == 3 and _common.blas_threads_setting() == 3
    assert resolve_route("mx").blas_threads == 3
    assert _common.set_blas_threads(None) == _common.available_cores()
    with pytest.raises(ValueError):
        _common.set_blas_threads(0)
    threads = _common._openblas_threads()
    if threads is not None:
        get, _ = threads
        _common.set_blas_threads(2)
        with _common.blas_threads(_common.THREADED_MIN_ROWS):
            assert get() == 2
        _common.set_blas_threads(1)
        with _common.blas_threads(64):
            assert get() == 1


def test_record_and_describe_carry_every_field():
    r = route_for("cpu", blas_threads=2)
    assert list(r.record()) == FIELDS
    assert json.loads(json.dumps(r.record())) == r.record()
    lines = r.describe()
    assert [k for k, _ in lines] == FIELDS and all(isinstance(v, str) and v for _, v in lines)
    assert dict(lines)["kernels"] == f"auto ({KERNELS_ENV})"
    with pytest.raises(ValueError):
        route_for("rocm")


def test_doctor_prints_the_route_one_line_per_field():
    from mlxswitch.checks import doctor_report

    sections = dict(doctor_report().sections)
    assert sections["route"] == current_route().describe()


# -- CUDA's path, the device faked ---------------------------------------------------------------


def _quantized_model() -> nn.Module:
    model = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 16))
    nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    return model


def test_on_cuda_plain_quantized_linears_stay_mlx_modules():
    resolve_route("auto", "cuda")
    model = _quantized_model()
    assert row_routes.use_fast_rows(model) == "mlx-module"
    assert all(type(m) is nn.QuantizedLinear for m in model.layers)
    assert not row_routes.keeps_dense_weights(10)
    assert compute_dtype() is None  # the checkpoint's own dtype
    resolve_route("auto", "cpu")  # and on this CPU every one takes the quantized kernel: no copy
    model = _quantized_model()
    assert row_routes.use_fast_rows(model) == "quant-kernel"
    assert all(type(m) is rows.RowsQuantizedLinear and m.quant and m.dense is None for m in model.layers)
    assert compute_dtype() == mx.float32
    resolve_route("fp32", "cpu")  # or, asked for, resident fp32 copies
    model = _quantized_model()
    assert row_routes.use_fast_rows(model) == "resident-fp32"  # tiny: its fp32 copies fit
    assert all(type(m) is rows.RowsQuantizedLinear and m.dense is not None for m in model.layers)


def test_on_cuda_nested_gears_and_signals_take_mlx_ops(monkeypatch):
    resolve_route("auto", "cuda")
    seen = []
    for name in ("_blas_matmul", "dense_nested_matmul"):
        real = getattr(nested_cpu, name)
        monkeypatch.setattr(nested_cpu, name, lambda *a, real=real, **k: seen.append(a) or real(*a, **k))
    monkeypatch.setattr(nested, "dense_nested_matmul", nested_cpu.dense_nested_matmul)
    monkeypatch.setattr(nested, "metal_nested_matmul", lambda *a: seen.append(a))
    planes = nested.synthetic_planes(24, 128, (4, 4), 64)
    for n in (1, 3, 37):
        x = mx.random.normal((n, 128), key=mx.random.key(n))
        got = nested.nested_matmul(x, planes, (4, 4), 64, 2)
        want = nested.reference_nested_matmul(x, planes, (4, 4), 64, 2)
        assert np.array_equal(np.array(got), np.array(want))
    assert seen == []  # no NumPy, no dense route, no Metal kernel
    logits = mx.array(np.random.default_rng(0).normal(0, 3, 1000).astype(np.float32))
    lazy = read_time_signals(logits)
    assert lazy._signals is not None and lazy._logits is None  # in the lazy graph, mx ops
    assert np.allclose(lazy.values(), token_signals_numpy(logits), atol=1e-4)


def test_a_model_whose_fp32_copies_do_not_fit_keeps_its_planes_and_says_so(monkeypatch):
    resolve_route("fp32", "cpu")
    monkeypatch.setattr(row_routes, "available_memory_bytes", lambda: 1000)
    model = _quantized_model()
    assert row_routes.use_fast_rows(model) == "rows"
    assert all(type(m) is rows.RowsQuantizedLinear and m.dense is None for m in model.layers)
    assert row_routes.use_fast_rows(nn.Sequential(nn.Linear(4, 4))) == "none"


@pytest.mark.parametrize("kernels", ["exact", "fp32"])
def test_a_tied_quantized_head_takes_the_cpu_route_and_gives_the_same_logits(kernels):
    from tinymodels import llama_config, make_model

    resolve_route(kernels, "cpu")
    model = make_model(llama_config(vocab_size=300, tie=True), seed=3)
    nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    ids = mx.array([[5, 17, 42, 7]])
    want = np.array(model(ids))  # MLX's quantized matmul for the tied head
    assert row_routes.use_fast_rows(model) == {"exact": "quant-kernel", "fp32": "resident-fp32"}[kernels]
    embed = model.model.embed_tokens
    assert type(embed) is rows.RowsQuantizedEmbedding
    assert (embed.quant is not None) == (kernels == "exact") and (embed.dense is not None) == (
        kernels == "fp32"
    )
    assert np.allclose(np.array(model(ids)), want, rtol=1e-4, atol=1e-4)
    untied = make_model(llama_config(vocab_size=300), seed=3)
    nn.quantize(untied, group_size=32, bits=4)
    row_routes.use_fast_rows(untied)
    assert type(untied.model.embed_tokens) is nn.QuantizedEmbedding  # a lookup only: no copy
