"""Nested-gear matmul: reference, CPU multi-row routes, dispatcher, and the fused Metal kernel.

The Metal kernel cannot run on Linux. Its exact generated source (as MLX assembles it, printed
while an export traces a launch) is compiled with g++ against a small emulation of the Metal
built-ins it uses (lock-step SIMD groups of 32 lanes, simd_sum, fp16/bf16) and run on random
planes; planted bugs, edited into that source, must each be caught.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from emulation import NO_GXX, NO_SOURCE, needs_gxx

from mlxswitch.kernels import kernel_self_check, nested, nested_cpu
from mlxswitch.kernels._common import KERNELS_ENV, force_reference, relative_max_error
from mlxswitch.kernels.route import resolve_route


@pytest.fixture(autouse=True)
def exact_products():
    """These tests hold products to MLX's within fp32 rounding: the quantized kernel on fp32
    activations (the CPU default rounds them to int8, tested in tests/test_quant_kernel.py)."""
    resolve_route("exact")


F32, F16, BF16 = mx.float32, mx.float16, mx.bfloat16
# Max |got − truth| / max |truth| against the fp32 truth: fp32 is summation order, halves one
# output rounding. The reference itself, in bf16, sums rounded per-plane products (≈ 3e-2).
TOL = {F32: 1e-5, F16: 2e-3, BF16: 1e-2}
REF_TOL = {F32: 1e-5, F16: 5e-3, BF16: 5e-2}


def _case(plane_bits, group_size=64, out_dims=24, in_dims=128, rows=3, dtype=F32, bias=True, seed=0):
    planes = nested.synthetic_planes(out_dims, in_dims, plane_bits, group_size, dtype, seed)
    key = mx.random.key(seed + 7)
    x = mx.random.normal((rows, in_dims), key=key).astype(dtype)
    b = mx.random.normal((out_dims,), key=mx.random.key(seed + 8)).astype(dtype) if bias else None
    return x, planes, b


def _err(got, want) -> float:
    return relative_max_error(got, want)


# -- reference ----------------------------------------------------------------------------------


@pytest.mark.parametrize("plane_bits", [(4,), (4, 4), (4, 4, 8), (2, 2), (3, 5, 6)])
def test_reference_is_the_sum_of_dequantized_planes_in_float64(plane_bits):
    x, planes, b = _case(plane_bits, out_dims=13)
    for active in range(1, len(plane_bits) + 1):
        weight = sum(
            np.array(
                mx.dequantize(p["weight"], p["scales"], p["biases"], group_size=64, bits=bits),
                dtype=np.float64,
            )
            for p, bits in zip(planes[:active], plane_bits, strict=False)
        )
        want = np.array(x, dtype=np.float64) @ weight.T + np.array(b, dtype=np.float64)
        got = nested.reference_nested_matmul(x, planes, plane_bits, 64, active, b)
        assert np.allclose(np.array(got), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        nested.reference_nested_matmul(x, planes, plane_bits, 64, len(plane_bits) + 1)


# -- CPU multi-row routes -------------------------------------------------------------------------


@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("plane_bits", [(4,), (8,), (4, 4), (8, 4), (4, 4, 8)])
def test_the_numpy_route_matches_the_truth_for_every_group_size_and_batch_shape(plane_bits, group_size):
    # The NumPy route reorders each group's columns (even, then odd) in x and the weight alike.
    x, planes, b = _case(plane_bits, group_size, out_dims=40, in_dims=256, rows=6)
    x = x.reshape(2, 3, 256)
    for active in range(1, len(plane_bits) + 1):
        want = nested.fp32_truth(x, planes, plane_bits, group_size, active, b)
        got = nested_cpu.dense_nested_matmul(x, planes, plane_bits, group_size, active, b, use_numpy=True)
        assert got.shape == (2, 3, 40)
        assert _err(got, want) < TOL[F32], active


@pytest.mark.parametrize("plane_bits", [(4,), (4, 4), (4, 4, 8), (2, 2)])
def test_cpu_routes_match_reference_over_rows(plane_bits):
    # Every row count 1..300 (out 40, in 128: cheap), the active plane count cycling with it.
    x_all, planes, b = _case(plane_bits, out_dims=40, rows=300)
    for rows in range(1, 301):
        x, active = x_all[:rows], 1 + rows % len(plane_bits)
        want = nested.reference_nested_matmul(x, planes, plane_bits, 64, active, b)
        routes = [nested.nested_matmul(x, planes, plane_bits, 64, active, b)]
        routes += [
            nested_cpu.dense_nested_matmul(x, planes, plane_bits, 64, active, b, use_numpy)
            for use_numpy in (True, False)
        ]
        for got in routes:
            assert got.shape == want.shape and got.dtype == want.dtype
            assert _err(got, want) < TOL[F32], (rows, active)


@pytest.mark.parametrize(
    "x_dtype,scale_dtype", [(F16, F16), (BF16, BF16), (F32, F16), (F16, BF16), (BF16, F32)]
)
def test_cpu_routes_keep_the_reference_dtype_and_are_at_least_as_accurate(x_dtype, scale_dtype):
    x, planes, _ = _case((4, 4, 8), out_dims=40, rows=37, dtype=scale_dtype)
    x = x.astype(x_dtype)
    b = mx.random.normal((40,), key=mx.random.key(3)).astype(x_dtype)
    want = nested.reference_nested_matmul(x, planes, (4, 4, 8), 64, 3, b)
    truth = nested.fp32_truth(x, planes, (4, 4, 8), 64, 3, b)
    out_dtype = want.dtype
    assert nested_cpu.result_dtype(x, planes, b) == out_dtype
    assert _err(want, truth) < REF_TOL[out_dtype]
    for use_numpy in (True, False):
        got = nested_cpu.dense_nested_matmul(x, planes, (4, 4, 8), 64, 3, b, use_numpy)
        assert got.dtype == out_dtype
        assert _err(got, truth) < TOL[out_dtype]  # fp32 inside, one rounding at the end
        assert _err(got, want) < REF_TOL[out_dtype]


def test_dense_routes_in_row_blocks(monkeypatch):
    # Big layers are dequantized DEQUANT_BLOCK weights at a time: 40 rows × 128 in blocks of 8.
    monkeypatch.setattr(nested_cpu, "DEQUANT_BLOCK", 8 * 128)
    assert nested_cpu._row_blocks(40, 128) == [(0, 8), (8, 16), (16, 24), (24, 32), (32, 40)]
    assert nested_cpu._row_blocks(13, 128)[-1] == (8, 13)
    x, planes, b = _case((4, 4, 8), out_dims=44, rows=37)
    want = nested.reference_nested_matmul(x, planes, (4, 4, 8), 64, 3, b)
    for use_numpy in (True, False):
        got = nested_cpu.dense_nested_matmul(x, planes, (4, 4, 8), 64, 3, b, use_numpy)
        assert _err(got, want) < TOL[F32]


def test_leading_dimensions_and_no_bias():
    x, planes, _ = _case((4, 4), out_dims=24, rows=2 * 19, bias=False)
    x = x.reshape(2, 19, 128)
    want = nested.reference_nested_matmul(x, planes, (4, 4), 64, 2)
    for got in (
        nested.nested_matmul(x, planes, (4, 4), 64, 2),
        nested_cpu.dense_nested_matmul(x, planes, (4, 4), 64, 2, use_numpy=False),
    ):
        assert got.shape == (2, 19, 24) and _err(got, want) < TOL[F32]


def test_dispatcher_takes_the_blas_route_from_the_rule(monkeypatch):
    resolve_route("fp32", "cpu")  # the rule applies where the quantized kernel is not in use
    seen = []
    real = nested_cpu._blas_matmul
    monkeypatch.setattr(nested_cpu, "_blas_matmul", lambda *a: seen.append(a[0].shape) or real(*a))
    x, planes, b = _case((4, 4), out_dims=24, rows=37)
    for rows in (1, nested_cpu.BLAS_MIN_ROWS - 1, nested_cpu.BLAS_MIN_ROWS, 37):
        nested.nested_matmul(x[:rows], planes, (4, 4), 64, 2, b)
    assert seen == [(nested_cpu.BLAS_MIN_ROWS, 128), (37, 128)]


def test_blas_runs_on_one_thread_and_restores_the_setting():
    from mlxswitch.kernels._common import _openblas_threads, single_threaded_blas

    threads = _openblas_threads()
    if threads is None:
        pytest.skip("NumPy does not use a loaded OpenBLAS here")
    get, set_ = threads
    before = get()
    with single_threaded_blas():
        assert get() == 1
    assert get() == before


def test_the_rule():
    assert nested_cpu.cpu_route(1, 3) == "reference"
    assert nested_cpu.cpu_route(nested_cpu.BLAS_MIN_ROWS - 1, 2) == "reference"
    assert nested_cpu.cpu_route(nested_cpu.BLAS_MIN_ROWS, 1) == "blas"
    assert nested_cpu.cpu_route(300, 3) == "blas"
    assert "NumPy BLAS" in nested_cpu.describe_cpu_rule()


def test_blas_route_falls_back_to_mlx_under_transforms():
    # mx.compile (and vmap, export) refuse evaluation: the route must stay in MLX there.
    x, planes, b = _case((4, 4, 8), out_dims=24, rows=37)

    def forward(x):
        return nested.nested_matmul(x, planes, (4, 4, 8), 64, 3, b)

    want = nested.reference_nested_matmul(x, planes, (4, 4, 8), 64, 3, b)
    assert _err(mx.compile(forward)(x), want) < TOL[F32]


def test_env_override_forces_every_reference_path(monkeypatch):
    x, planes, b = _case((4, 4, 8), out_dims=24, rows=200)
    monkeypatch.setenv(KERNELS_ENV, "reference")
    resolve_route(backend="metal")  # as if Metal were there and in use (the route reads the variable)
    assert force_reference()
    calls = []
    monkeypatch.setattr(nested_cpu, "dense_weight", lambda *a: calls.append(a))
    monkeypatch.setattr(nested, "metal_nested_matmul", lambda *a: calls.append(a))
    for rows in (1, 4, 200):
        got = nested.nested_matmul(x[:rows], planes, (4, 4, 8), 64, 3, b)
        want = nested.reference_nested_matmul(x[:rows], planes, (4, 4, 8), 64, 3, b)
        assert np.array_equal(np.array(got), np.array(want))
    resolve_route(backend="cpu")
    assert nested_cpu.cpu_route(200, 3) == "reference"
    assert "reference" in nested_cpu.describe_cpu_rule()
    got = nested.quantized_matmul_rows(
        x, planes[0]["weight"], planes[0]["scales"], planes[0]["biases"], 64, 4
    )
    assert calls == []
    # "mx": no NumPy, MLX's dense matmul only where it pays (2 planes from 8 rows, 3 from 4)
    monkeypatch.setenv(KERNELS_ENV, "mx")
    resolve_route()
    assert [nested_cpu.cpu_route(r, a) for r, a in ((200, 1), (7, 2), (8, 2), (4, 3), (9, 5))] == [
        "reference",
        "reference",
        "dense",
        "dense",
        "dense",
    ]
    monkeypatch.setenv(KERNELS_ENV, "fast-please")
    with pytest.raises(ValueError, match=KERNELS_ENV):
        resolve_route()


@pytest.mark.parametrize("rows", [1, 37])
@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_matmul_rows_matches_quantized_linear(rows, bits):
    layer = nn.QuantizedLinear(128, 40, bias=True, group_size=64, bits=bits)
    x = mx.random.normal((rows, 128), key=mx.random.key(rows))
    got = nested.quantized_matmul_rows(
        x, layer.weight, layer.scales, layer.biases, layer.group_size, layer.bits, layer.bias
    )
    assert _err(got, layer(x)) < TOL[F32]


def test_quantized_matmul_rows_passes_other_modes_to_mlx():
    w = mx.random.normal((40, 128), key=mx.random.key(1))
    q, scales = mx.quantize(w, group_size=32, bits=4, mode="mxfp4")
    x = mx.random.normal((37, 128), key=mx.random.key(2))
    want = mx.quantized_matmul(x, q, scales, None, transpose=True, group_size=32, bits=4, mode="mxfp4")
    got = nested.quantized_matmul_rows(x, q, scales, None, 32, 4, mode="mxfp4")
    assert np.array_equal(np.array(got), np.array(want))


# -- dispatcher around the Metal kernel (its logic, with a stand-in kernel) ------------------------


def _fake_metal(mode: str, calls: list):
    def run(x, planes, plane_bits, group_size, active, bias=None):
        calls.append(x.shape)
        if mode == "raise":
            raise RuntimeError("Unable to build metal library from source")
        y = nested.reference_nested_matmul(x, planes, plane_bits, group_size, active, bias)
        return y * 1.01 if mode == "wrong" else y * 1.0

    return run


@pytest.mark.parametrize("mode", ["right", "wrong", "raise"])
def test_dispatcher_checks_the_kernel_once_per_class_then_keeps_or_drops_it(monkeypatch, mode):
    calls = []
    resolve_route(backend="metal")  # a Mac's route: the stand-in kernel below takes the place of Metal
    monkeypatch.setattr(nested, "_CHECKED", {})
    monkeypatch.setattr(nested, "metal_nested_matmul", _fake_metal(mode, calls))
    x, planes, b = _case((4, 4, 8), out_dims=24, rows=8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = nested.nested_matmul(x[:1], planes, (4, 4, 8), 64, 3, b)
    assert [w.category for w in caught] == ([] if mode == "right" else [RuntimeWarning])
    assert list(nested._CHECKED.values()) == [mode == "right"]
    # the first-use check ran the kernel once on its own small case (3 rows, 384 + 64 inputs)
    assert calls == [(3, 448)] + ([(1, 128)] if mode == "right" else [])
    want = nested.reference_nested_matmul(x[:1], planes, (4, 4, 8), 64, 3, b)
    assert _err(first, want) < TOL[F32]
    calls.clear()
    nested.nested_matmul(x[:2], planes, (4, 4, 8), 64, 3, b)  # same class: no second check
    nested.nested_matmul(x, planes, (4, 4, 8), 64, 3, b)  # 8 rows: MLX's qmm, not the mat-vec
    nested.nested_matmul(x[:1], planes, (4, 4, 8), 64, 1, b)  # one plane: nothing to fuse
    assert calls == ([(2, 128)] if mode == "right" else [])
    assert len(nested._CHECKED) == 1
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        nested.nested_matmul(x[:1].astype(F16), planes, (4, 4, 8), 64, 3, b)  # new dtype: checked
    assert len(nested._CHECKED) == 2


def test_first_use_check_runs_under_compile(monkeypatch):
    # The check builds its own case, never the caller's tracers: it can run inside mx.compile.
    calls = []
    resolve_route(backend="metal")  # a Mac's route: the stand-in kernel below takes the place of Metal
    monkeypatch.setattr(nested, "_CHECKED", {})
    monkeypatch.setattr(nested, "metal_nested_matmul", _fake_metal("right", calls))
    x, planes, b = _case((4, 4), out_dims=24, rows=1)

    def forward(x):
        return nested.nested_matmul(x, planes, (4, 4), 64, 2, b)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = mx.compile(forward)(x)
    assert list(nested._CHECKED.values()) == [True] and calls == [(3, 448), (1, 128)]
    assert _err(got, nested.reference_nested_matmul(x, planes, (4, 4), 64, 2, b)) < TOL[F32]


# -- kernel source and self-check ---------------------------------------------------------------


def test_kernel_source_variants_and_names():
    for n in (1, 2, 3):
        for has_bias in (False, True):
            header, body = nested.kernel_source(n, has_bias)
            assert "nested_plane_accumulate" in header
            assert body.count("nested_plane_accumulate<") == n
            assert f"BITS{n - 1}" in body and f"BITS{n}" not in body
            assert ("bias[row]" in body) == has_bias and "/*" not in body
            assert nested.make_kernel(n, has_bias) is not None  # builds on every backend
    names = {nested.kernel_name(n, b) for n in (1, 2, 3) for b in (False, True)}
    assert len(names) == 6 and all(nested.KERNEL_VERSION in n for n in names)


def test_self_check_reports_routes_and_kernel():
    checks = {c.name: c for c in kernel_self_check()}
    cpu = checks["nested_matmul_dense"]
    assert cpu.status.startswith("ok (max err")
    assert "rule: dense fp32 + NumPy BLAS from" in cpu.status
    metal = checks[f"{nested.KERNEL_PREFIX}_{nested.KERNEL_VERSION}"]
    if not mx.metal.is_available():
        assert metal.status == "unavailable: no Metal backend"
        assert not nested.kernel_available()
        with pytest.raises(RuntimeError):
            nested.metal_nested_matmul(*_case((4, 4))[:2], (4, 4), 64, 2)
    else:
        assert metal.status.startswith("ok")


@pytest.mark.skipif(not mx.metal.is_available(), reason="needs Metal")
def test_metal_kernel_matches_reference():
    for plane_bits in ((4, 4), (4, 4, 8), (2, 2), (3, 5, 6), (8, 8), (6,)):
        for group_size in nested.SUPPORTED_GROUP_SIZES:
            for dtype in (F32, F16, BF16):
                for rows, out_dims in ((1, 13), (4, 64)):
                    err = nested.check_kernel_case(
                        nested.metal_nested_matmul,
                        plane_bits,
                        group_size,
                        dtype,
                        dtype,
                        dtype,
                        out_dims=out_dims,
                        rows=rows,
                    )
                    assert err < TOL[dtype], (plane_bits, group_size, dtype, rows)


# -- the Metal kernel's exact source, emulated on the CPU ----------------------------------------

# Metal built-ins the kernel uses, for g++. The 32 lanes of a SIMD group are 32 threads that meet
# at every simd_sum (so a lane skipping one would deadlock, not pass); SIMD groups run one after
# another, which is faithful because the kernel shares nothing between them.
_PRELUDE = r"""
#include <barrier>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

typedef unsigned int uint;
typedef unsigned long ulong;
struct uint3 { uint x, y, z; };
struct float16_t {
  _Float16 v;
  float16_t() = default;
  float16_t(float f) : v(static_cast<_Float16>(f)) {}
  operator float() const { return static_cast<float>(v); }
};
struct bfloat16_t {
  uint16_t bits;
  bfloat16_t() = default;
  bfloat16_t(float f) {  // round to nearest even
    uint32_t u;
    std::memcpy(&u, &f, 4);
    bits = f != f ? uint16_t(0x7fc0) : uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  operator float() const {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

namespace emu {
std::barrier<>* sync;
float slots[32];
thread_local uint lane_id;
}  // namespace emu

namespace metal {
template <class T> T min(T a, T b) { return a < b ? a : b; }
}  // namespace metal

inline float simd_sum(float v) {
  emu::slots[emu::lane_id] = v;
  emu::sync->arrive_and_wait();
  float total = 0.0f;
  for (uint l = 0; l < 32; ++l) total += emu::slots[l];
  emu::sync->arrive_and_wait();
  return total;
}

// Address spaces vanish.
#define device
#define constant
#define thread
"""

_MAIN = r"""
#undef device
#undef constant
#undef thread

static std::vector<uint64_t> load(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) { std::fprintf(stderr, "missing %s\n", path.c_str()); std::exit(2); }
  std::fseek(f, 0, SEEK_END);
  long size = std::ftell(f);
  std::fseek(f, 0, SEEK_SET);
  std::vector<uint64_t> data((size + 7) / 8 + 1, 0);
  if (std::fread(data.data(), 1, size, f) != size_t(size)) std::exit(2);
  std::fclose(f);
  return data;
}

static std::vector<int> load_shape(const std::string& path) {
  std::vector<int> shape;
  FILE* f = std::fopen(path.c_str(), "r");
  int v;
  while (std::fscanf(f, "%d", &v) == 1) shape.push_back(v);
  std::fclose(f);
  return shape;
}

template <class F> void run_grid(uint gx, uint gy, uint gz, uint tx, F kernel) {
  std::barrier<> sync(32);
  emu::sync = &sync;
  std::vector<std::thread> lanes;
  for (uint lane = 0; lane < 32; ++lane) {
    lanes.emplace_back([=, &kernel] {
      emu::lane_id = lane;
      for (uint z = 0; z < gz; ++z)
        for (uint y = 0; y < gy; ++y)
          for (uint x0 = 0; x0 < gx; x0 += 32)
            kernel(uint3{x0 + lane, y, z}, uint3{tx, 1, 1}, (x0 % tx) / 32, lane);
    });
  }
  for (auto& t : lanes) t.join();
}

int main(int argc, char** argv) {
  // argv: variant, folder, grid x y z, threadgroup x, output bytes
  const int variant = std::atoi(argv[1]);
  const std::string dir = argv[2];
  const uint gx = std::atoi(argv[3]), gy = std::atoi(argv[4]), gz = std::atoi(argv[5]);
  const uint tx = std::atoi(argv[6]);
  const size_t out_bytes = std::strtoull(argv[7], nullptr, 10);
  std::vector<uint64_t> out(out_bytes / 8 + 1, 0);
  switch (variant) {
CASES
    default:
      return 3;
  }
  FILE* f = std::fopen((dir + "/out.bin").c_str(), "wb");
  std::fwrite(out.data(), 1, out_bytes, f);
  std::fclose(f);
  return 0;
}
"""

_ATTRIBUTES = {
    "thread_position_in_grid": "tpig",
    "threads_per_threadgroup": "tptg",
    "simdgroup_index_in_threadgroup": "simd",
    "thread_index_in_simdgroup": "lane",
}

# (plane bits, group size, x dtype, scales dtype, bias dtype or None)
_WIDTHS = [
    ((b,), gs, F32, F32, F32 if (i + j) % 2 else None)
    for i, b in enumerate(nested.SUPPORTED_BITS)
    for j, gs in enumerate(nested.SUPPORTED_GROUP_SIZES)
]
_MIXES = [
    (bits, gs, F32, F32, F32 if j % 2 else None)
    for bits in ((4, 4), (4, 4, 8), (2, 2), (3, 5, 6))
    for j, gs in enumerate(nested.SUPPORTED_GROUP_SIZES)
]
_DTYPES = [
    ((4, 4, 8), 64, F16, F16, F16),
    ((4, 4, 8), 64, BF16, BF16, BF16),
    ((2, 2), 32, F16, F16, None),
    ((3, 5, 6), 128, BF16, BF16, None),
    ((4, 4), 64, F32, F16, None),
    ((4, 4, 8), 128, BF16, F16, F32),
    ((8, 8), 32, F16, F32, BF16),
]
CONFIGS = _WIDTHS + _MIXES + _DTYPES
# (out_dims, in_dims, rows) for group size gs: more chunks than lanes and a partial last block;
# fewer chunks than lanes and one exact block; three rows of x.
SHAPES = ((13, lambda gs: 384 + gs, 1), (8, lambda gs: gs, 2), (21, lambda gs: 4 * gs, 3))

BUG_CONFIG = ((4, 4, 8), 64, F32, F32, F32)
BUGS = {
    "wrong shift": ("(codes >> (j * BITS))", "(codes >> (j * BITS + 1))"),
    "high word never read": ("if (shift + 8u * uint(BITS) > 32u)", "if (false)"),
    "wrong group index": ("chunk * 8u / uint(GROUP_SIZE)", "chunk / uint(GROUP_SIZE)"),
    "last plane skipped": (
        "nested_plane_accumulate<BITS2, GROUP_SIZE, RESULTS>(w2, scales2, biases2, xs, xsum, "
        "row0, out_dims, in_dims, chunk, acc);",
        "",
    ),
    "bias not added": ("total += float(bias[row]);", ""),
    "zero points dropped": (" + float(biases[g]) * xsum", ""),
    "lanes skip chunks": ("chunk += 32u", "chunk += 64u"),
    "one row per SIMD group": ("metal::min(row0 + uint(r), out_dims - 1u)", "row0"),
    "x row ignored": ("const uint row_in = thread_position_in_grid.z;", "const uint row_in = 0u;"),
}


def _inputs(config, out_dims, in_dims, rows, seed=0):
    bits, gs, x_dtype, scale_dtype, bias_dtype = config
    planes = nested.synthetic_planes(out_dims, in_dims, bits, gs, scale_dtype, seed)
    x = mx.random.normal((rows, in_dims), key=mx.random.key(seed + 1)).astype(x_dtype)
    bias = (
        None
        if bias_dtype is None
        else mx.random.normal((out_dims,), key=mx.random.key(seed + 2)).astype(bias_dtype)
    )
    return x, planes, bias


def _recorded_launch(config, x, planes, bias) -> dict:
    """What nested.launch hands the kernel: inputs in order, grid, threadgroup, output."""
    recorded = {}

    def kernel(**kwargs):
        recorded.update(kwargs)
        return [mx.zeros(kwargs["output_shapes"][0], kwargs["output_dtypes"][0])]

    nested.launch(kernel, x, planes, config[0], config[1], bias)
    recorded["names"] = nested.input_names(len(config[0]), bias is not None)
    return recorded


def _stdout_of(fn) -> str:
    # MLX prints the generated source from C++: capture file descriptor 1 itself.
    libc = ctypes.CDLL(None)
    sys.stdout.flush()
    libc.fflush(None)
    saved = os.dup(1)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 1)
        try:
            fn()
        finally:
            libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
        tmp.seek(0)
        return tmp.read().decode()


def _generated_source(config, folder) -> str:
    """The full Metal source MLX generates for this variant (printed by verbose=True)."""
    bits, gs = config[0], config[1]
    x, planes, bias = _inputs(config, 13, 384 + gs, 1)
    n, has_bias = len(bits), bias is not None
    kernel = nested.make_kernel(n, has_bias)
    arrays = [x] + [p[k] for p in planes for k in ("weight", "scales", "biases")]
    arrays += [bias] if has_bias else []

    def launch(*a):
        traced = [{"weight": a[1 + 3 * i], "scales": a[2 + 3 * i], "biases": a[3 + 3 * i]} for i in range(n)]
        return nested.launch(kernel, a[0], traced, bits, gs, a[-1] if has_bias else None, verbose=True)

    def export():  # export tracing records a Metal kernel without Metal, printing its source
        with contextlib.suppress(Exception):
            mx.export_function(str(folder / "trace.mlxfn"), launch, *arrays)

    match = re.search(r"```\n(.*)```", _stdout_of(export), re.S)
    if match is None:
        pytest.fail(NO_SOURCE.format(version=mx.__version__))
    return match.group(1)


def _variant(index: int, source: str) -> tuple[str, str]:
    """(namespace holding the kernel, the switch case that calls it) for the emulator."""
    name, params = re.search(r"\[\[kernel\]\] void (\w+)\((.*?)\) \{", source, re.S).groups()
    template_args = re.search(rf"decltype\({name}<(.*?)>\)", source).group(1)
    loads, args = [], []
    for param in params.split(",\n"):
        buffer = re.match(r"\s*(?:const )?(?:device|constant) (\w+)\* (\w+) \[\[buffer", param)
        if buffer:
            ctype, pname = buffer.groups()
            if pname.endswith("_shape"):
                loads.append(f'auto shape_{pname} = load_shape(dir + "/{pname[:-6]}.shape");')
                args.append(f"shape_{pname}.data()")
            elif pname == "out":
                args.append(f"reinterpret_cast<{ctype}*>(out.data())")
            else:
                loads.append(f'auto in_{pname} = load(dir + "/{pname}.bin");')
                args.append(f"reinterpret_cast<const {ctype}*>(in_{pname}.data())")
            continue
        attribute = re.match(r"\s*uint3? (\w+) \[\[(\w+)\]\]", param)
        assert attribute and attribute.group(2) in _ATTRIBUTES, f"emulator lacks {param.strip()}"
        args.append(_ATTRIBUTES[attribute.group(2)])
    # g++ rejects attributes on an explicit instantiation; the call below instantiates instead.
    body = re.sub(r"\ntemplate \[\[host_name.*", "\n", source, flags=re.S)
    namespace = f"namespace v{index} {{\n{body}\n}}  // namespace v{index}\n"
    case = (
        f"    case {index}: {{\n      " + "\n      ".join(loads) + "\n"
        f"      run_grid(gx, gy, gz, tx, [&](uint3 tpig, uint3 tptg, uint simd, uint lane) {{\n"
        f"        v{index}::{name}<{template_args}>({', '.join(args)});\n      }});\n"
        f"      break;\n    }}\n"
    )
    return namespace, case


def _program(sources: list[str]) -> str:
    parts = [_variant(i, s) for i, s in enumerate(sources)]
    return _PRELUDE + "".join(p[0] for p in parts) + _MAIN.replace("CASES", "".join(p[1] for p in parts))


def _edited(source: str, old: str, new: str) -> str:
    assert source.count(old) == 1, f"planted bug does not apply: {old!r}"
    return source.replace(old, new)


class Emulator:
    """Compiled emulators of the good variants (CONFIGS) and the bugged ones (BUGS)."""

    def __init__(self, folder):
        self.folder = folder
        good = [_generated_source(c, folder) for c in CONFIGS]
        base = good[CONFIGS.index(BUG_CONFIG)]
        bugged = [_edited(base, *BUGS[name]) for name in BUGS]
        jobs = []
        for label, sources in (("good", good), ("bugs", bugged)):
            src = folder / f"{label}.cpp"
            src.write_text(_program(sources))
            jobs.append(
                subprocess.Popen(
                    [
                        "g++",
                        "-std=c++20",
                        "-O1",
                        "-pthread",
                        "-Wno-attributes",
                        "-o",
                        str(folder / label),
                        str(src),
                    ],
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        for job in jobs:  # both compile at once: the two cores
            _, err = job.communicate(timeout=300)
            assert job.returncode == 0, err[-3000:]

    def run(self, program: str, index: int, config, x, planes, bias) -> mx.array:
        launch = _recorded_launch(config, x, planes, bias)
        for name, array in zip(launch["names"], launch["inputs"], strict=True):
            raw = array.view(mx.uint16) if array.dtype in (F16, BF16) else array
            (self.folder / f"{name}.bin").write_bytes(np.array(raw).tobytes())
            (self.folder / f"{name}.shape").write_text(" ".join(map(str, array.shape)))
        shape, dtype = launch["output_shapes"][0], launch["output_dtypes"][0]
        nbytes = int(np.prod(shape)) * dtype.size
        grid = [str(v) for v in launch["grid"]]
        subprocess.run(
            [
                str(self.folder / program),
                str(index),
                str(self.folder),
                *grid,
                str(launch["threadgroup"][0]),
                str(nbytes),
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        raw = np.frombuffer(
            (self.folder / "out.bin").read_bytes(), dtype=np.float32 if dtype == F32 else np.uint16
        )
        out = mx.array(raw)
        return (out if dtype == F32 else out.view(dtype)).reshape(shape)


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.fail(NO_GXX)
    return Emulator(tmp_path_factory.mktemp("nested_metal_emulation"))


def _config_id(config) -> str:
    bits, gs, xd, sd, bd = config
    short = {F32: "f32", F16: "f16", BF16: "bf16", None: "none"}
    return f"{'+'.join(map(str, bits))}-g{gs}-x{short[xd]}-s{short[sd]}-b{short[bd]}"


@needs_gxx
@pytest.mark.parametrize("config", CONFIGS, ids=_config_id)
def test_metal_source_emulated_matches_reference(config, emulator):
    index = CONFIGS.index(config)
    bits, gs = config[0], config[1]
    for seed, (out_dims, in_dims, rows) in enumerate(SHAPES):
        x, planes, bias = _inputs(config, out_dims, in_dims(gs), rows, seed)
        got = emulator.run("good", index, config, x, planes, bias)
        truth = nested.fp32_truth(x, planes, bits, gs, len(bits), bias)
        want = nested.reference_nested_matmul(x, planes, bits, gs, len(bits), bias)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert _err(got, truth) < TOL[got.dtype], (out_dims, rows)
        assert _err(got, want) < REF_TOL[got.dtype], (out_dims, rows)


@needs_gxx
@pytest.mark.parametrize("bug", list(BUGS))
def test_metal_source_emulation_catches_planted_bugs(bug, emulator):
    index = list(BUGS).index(bug)
    worst = 0.0
    for seed, (out_dims, in_dims, rows) in enumerate(SHAPES):
        x, planes, bias = _inputs(BUG_CONFIG, out_dims, in_dims(64), rows, seed)
        got = emulator.run("bugs", index, BUG_CONFIG, x, planes, bias)
        truth = nested.fp32_truth(x, planes, BUG_CONFIG[0], 64, 3, bias)
        worst = max(worst, _err(got, truth))
    assert worst > 100 * TOL[F32], f"{bug} went unnoticed (max err {worst:.1e})"


def _preloaded_blas_seen(preload: str | None) -> object:
    # A fresh interpreter: the dynamic linker reads LD_PRELOAD only at process start.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if preload is not None:
        env["LD_PRELOAD"] = preload
    code = "import json, mlxswitch.kernels as k; print(json.dumps(k.preloaded_mlx_blas()))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD and the mlx[cpu] wheel: Linux")
def test_a_blas_preloaded_into_mlx_is_named_and_the_bundled_one_is_not():
    bundled = sorted((Path(mx.__file__).parent.parent / "mlx_cpu.libs").glob("libblas*.so*"))
    if not bundled:
        pytest.skip("this MLX wheel bundles no reference BLAS")
    assert _preloaded_blas_seen(None) is None
    # The bundled library itself, preloaded: found in the global scope, so MLX's calls bind to it.
    assert _preloaded_blas_seen(str(bundled[0])) == {"path": os.path.realpath(bundled[0]), "threads": None}


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, 8, 13])
def test_the_resident_route_equals_a_float64_product_at_every_row_count(rows):
    # 2..RESIDENT_GEMV_MAX_ROWS rows take one sgemv a row, the others one sgemm (zero rows padding
    # 3, 4, 7 and 13 to a multiple of 8): all are x · W (+ bias) on the kept Wᵀ.
    rng = np.random.default_rng(rows)
    weight = rng.standard_normal((24, 40), dtype=np.float32)
    x = rng.standard_normal((1, rows, 40), dtype=np.float32)
    bias = rng.standard_normal(24, dtype=np.float32)
    weight_t = nested_cpu.transposed_copy(lambda r0, r1: weight[r0:r1], 24, 40)
    got = nested_cpu.resident_dense_matmul(mx.array(x), weight_t, mx.array(bias))
    want = x.astype(np.float64) @ weight.T.astype(np.float64) + bias
    assert got is not None and got.shape == (1, rows, 24) and got.dtype == mx.float32
    assert np.allclose(np.asarray(got), want, rtol=1e-5, atol=1e-4)


def test_a_resident_copy_is_the_dequantized_weight_transposed_block_by_block(monkeypatch):
    # Blocks of a few rows (a small TRANSPOSE_BLOCK) must tile W exactly: no row lost or repeated.
    monkeypatch.setattr(nested_cpu, "TRANSPOSE_BLOCK", 4 * 40 * 8)
    weight = np.random.default_rng(0).standard_normal((37, 40), dtype=np.float32)
    seen = []

    def rows_of(r0, r1):
        seen.append((r0, r1))
        return weight[r0:r1]

    weight_t = nested_cpu.transposed_copy(rows_of, 37, 40)
    assert weight_t.flags["C_CONTIGUOUS"] and np.array_equal(weight_t, weight.T)
    assert seen == [(0, 8), (8, 16), (16, 24), (24, 32), (32, 37)]


def test_an_mlx_that_prints_no_source_fails_the_emulation_instead_of_skipping(monkeypatch, tmp_path):
    # Without the printed source the kernel has no test off a Mac: that must fail, never skip.
    monkeypatch.setattr(mx, "export_function", lambda *a, **k: None)
    with pytest.raises(pytest.fail.Exception, match="printed no generated Metal source"):
        _generated_source(CONFIGS[0], tmp_path)
