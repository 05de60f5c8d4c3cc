"""The compiled panel kernel (mlxswitch/kernels/panel_cpu.py, panel_rows.c): equal to a float64
NumPy product at every row grouping and thread count, the same bits on 1 and 2 threads, exactly
W's size in memory, and a clean fall back to NumPy's BLAS where it cannot be built or checked."""

from __future__ import annotations

import numpy as np
import pytest

from mlxswitch.kernels import cbuild, panel_cpu
from mlxswitch.kernels.panel_cpu import PANEL, build_panel_kernel, check_kernel, panel_copy
from mlxswitch.kernels.route import resolve_route

KERNEL = build_panel_kernel().kernel
needs_kernel = pytest.mark.skipif(KERNEL is None, reason=f"no panel kernel: {build_panel_kernel().detail}")


def _weight(out_dims: int, in_dims: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((out_dims, in_dims)).astype(np.float32)


@needs_kernel
@pytest.mark.parametrize("shape", [(PANEL, 16), (3 * PANEL, 40), (2 * PANEL + 5, 33), (7, 21)])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 12, 13, 20])
def test_the_kernel_equals_numpy_at_every_row_grouping(shape, rows):
    weight = _weight(*shape)
    panels = panel_copy(lambda r0, r1: weight[r0:r1], *shape)
    xs = np.random.default_rng(rows).standard_normal((rows, shape[1])).astype(np.float32)
    want = xs.astype(np.float64) @ weight.T.astype(np.float64)
    one = KERNEL.times(xs, panels, 1)
    assert one.shape == (rows, shape[0]) and np.allclose(one, want, rtol=1e-5, atol=1e-5)
    # A panel is computed whole by one thread: the thread count changes no bit.
    assert np.array_equal(KERNEL.times(xs, panels, 2), one)


def test_panels_hold_exactly_w_and_are_built_a_block_at_a_time(monkeypatch):
    monkeypatch.setattr(panel_cpu, "BUILD_BLOCK", 1)  # one panel a block
    weight = _weight(2 * PANEL + 9, 5)
    asked = []
    panels = panel_copy(lambda r0, r1: asked.append((r0, r1)) or weight[r0:r1], *weight.shape)
    assert panels.nbytes == weight.nbytes
    assert asked == [(0, PANEL), (PANEL, 2 * PANEL), (2 * PANEL, 2 * PANEL + 9)]
    first = panels.data[: PANEL * 5].reshape(5, PANEL)
    assert np.array_equal(first, weight[:PANEL].T)  # a panel: W's columns of 64 outputs, in-major
    assert np.array_equal(panels.data[2 * PANEL * 5 :].reshape(5, 9), weight[2 * PANEL :].T)


@needs_kernel
def test_the_check_catches_a_kernel_that_is_wrong():
    assert check_kernel(KERNEL) is None

    class OffByOneRow:
        def times(self, xs, weight, threads=1):
            y = KERNEL.times(xs, weight, threads)
            y[-1] += 1e-2  # the last row of a group wrong
            return y

    assert "differed" in check_kernel(OffByOneRow())


def _rebuilt(monkeypatch, **patches):
    for name, value in patches.items():
        monkeypatch.setattr(panel_cpu, name, value)
    build_panel_kernel.cache_clear()
    return build_panel_kernel()


def test_without_a_compiler_the_resident_route_keeps_blas_and_says_why(monkeypatch):
    try:
        monkeypatch.setattr(cbuild.shutil, "which", lambda name: None)
        build = _rebuilt(monkeypatch)
        assert build.kernel is None and "no C compiler" in build.detail
        resolved = resolve_route("fp32", "cpu")
        assert resolved.resident_product == "numpy-blas"
        assert "no C compiler" in dict(resolved.describe())["resident_product"]
    finally:
        build_panel_kernel.cache_clear()


def test_a_kernel_without_its_functions_falls_back(monkeypatch, tmp_path):
    empty = tmp_path / "empty.c"
    empty.write_text("int nothing_here(void) { return 0; }\n")
    try:
        build = _rebuilt(monkeypatch, SOURCE=empty)
        assert build.kernel is None and "lacks a function" in build.detail
        assert resolve_route("fp32", "cpu").resident_product == "numpy-blas"
    finally:
        build_panel_kernel.cache_clear()


def test_a_source_that_does_not_compile_falls_back(monkeypatch, tmp_path):
    broken = tmp_path / "broken.c"
    broken.write_text("this is not C\n")
    try:
        build = _rebuilt(monkeypatch, SOURCE=broken)
        assert build.kernel is None and "failed" in build.detail
        assert resolve_route("fp32", "cpu").resident_product == "numpy-blas"
    finally:
        build_panel_kernel.cache_clear()


@needs_kernel
def test_a_model_on_the_panel_route_gives_the_blas_routes_logits():
    import mlx.core as mx
    import mlx.nn as nn
    from tinymodels import llama_config, make_model

    from mlxswitch.kernels.panel_cpu import PanelWeight
    from mlxswitch.models import row_routes
    from mlxswitch.models.rows import RowsQuantizedLinear

    ids = mx.array([[5, 17, 42, 7, 9, 11, 3]])
    logits = {}
    for setting in ("fp32", "blas"):
        resolve_route(setting, "cpu")
        model = make_model(llama_config(vocab_size=300, tie=True), seed=3)
        nn.quantize(model, group_size=32, bits=4)
        mx.eval(model.parameters())
        assert row_routes.use_fast_rows(model) == "resident-fp32"
        kept = [m.dense for _, m in model.named_modules() if type(m) is RowsQuantizedLinear]
        assert kept and all(isinstance(d, PanelWeight) == (setting == "fp32") for d in kept)
        logits[setting] = np.array(model(ids))
    assert np.allclose(logits["fp32"], logits["blas"], rtol=1e-4, atol=1e-4)
