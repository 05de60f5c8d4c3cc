"""Token signals: reference and NumPy path against float64, laziness, the Metal kernel.

The Metal kernel cannot run on Linux. Besides the Metal-only comparison, its exact generated
source (as MLX assembles it, captured through export tracing) is compiled with g++ against a
small emulation of the Metal built-ins it uses (lock-step SIMD groups of 32 threads, threadgroup
memory, barriers) and run on the same inputs.
"""

from __future__ import annotations

import contextlib
import math
import re
import shutil
import subprocess
import time
import warnings

import mlx.core as mx
import numpy as np
import pytest
from emulation import NO_GXX, NO_SOURCE, needs_gxx

from mlxswitch.kernels import entropy as entropy_kernel
from mlxswitch.kernels import float64_token_signals, kernel_self_check
from mlxswitch.kernels.route import resolve_route
from mlxswitch.routing.router import max_entropy_bits
from mlxswitch.routing.signals import token_signals, token_signals_numpy

VOCABS = (49152, 151936)
error = entropy_kernel.signals_error


def _logits(v: int, seed: int = 0, scale: float = 3.0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, scale, size=v).astype(np.float32)


def _special_cases(v: int = 49152) -> dict[str, np.ndarray]:
    masked = np.full(v, -np.inf, dtype=np.float32)
    masked[[5, 900, 4000, v - 1]] = 0.0
    sparse = _logits(v, seed=4)
    sparse[::3] = -np.inf
    one_hot = np.zeros(v, dtype=np.float32)
    one_hot[7] = 100.0
    tie = _logits(v, seed=5)
    tie[[10, v - 3]] = 40.0
    # Mostly far below the maximum: terms whose e^d underflows must add exactly nothing.
    spread = _logits(v, seed=6, scale=60.0)
    # Finite but so low that d² overflows fp32 where e^d is already 0 (no 0 · inf).
    huge = _logits(v, seed=7)
    huge[[1, v // 2 + 1]] = -1e30
    return {
        "masked": masked,
        "sparse": sparse,
        "one_hot": one_hot,
        "tie": tie,
        "uniform": np.zeros(v, dtype=np.float32),
        "spread": spread,
        "huge_negative": huge,
    }


def _nan_cases(v: int = 49152) -> dict[str, np.ndarray]:
    nan = _logits(v)
    nan[v // 3] = np.nan
    pos_inf = _logits(v)
    pos_inf[3] = np.inf
    return {"nan": nan, "pos_inf": pos_inf, "all_masked": np.full(v, -np.inf, dtype=np.float32)}


# -- reference and NumPy path against float64 --------------------------------------------------


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_reference_matches_float64(vocab, dtype):
    x = mx.array(_logits(vocab)).astype(dtype)
    want = float64_token_signals(np.array(x.astype(mx.float32)))  # truth for the rounded input
    got = entropy_kernel.reference_token_signals(x)
    assert got.dtype == mx.float32 and got.shape == (3,)
    got = np.array(got)
    # bf16 input still reduces in fp32: entropy right to ~1e-3 bits (in fact ~1e-5).
    assert abs(got[0] - want[0]) < 1e-4
    assert error(got, want) < 1e-4


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_numpy_path_matches_float64(vocab, dtype):
    x = mx.array(_logits(vocab, seed=1)).astype(dtype)
    want = float64_token_signals(np.array(x.astype(mx.float32)))
    got = token_signals_numpy(x)  # from mx (bf16 widened in MLX), and from NumPy directly
    assert got.dtype == np.float32 and got.shape == (3,)
    assert error(got, want) < 1e-4
    assert error(token_signals_numpy(np.array(x.astype(mx.float32))[None]), want) < 1e-4


@pytest.mark.parametrize("name", list(_special_cases()))
def test_masked_peaked_uniform_and_tied_logits(name):
    x = _special_cases()[name]
    want = float64_token_signals(x)
    for got in (np.array(token_signals(mx.array(x))), token_signals_numpy(x)):
        assert not np.isnan(got).any()
        assert error(got, want) < 1e-4


def test_known_values():
    v = 49152
    cases = _special_cases(v)
    assert np.allclose(np.array(token_signals(mx.array(cases["masked"]))), [2.0, 0.0, 0.0], atol=1e-5)
    h, var, margin = np.array(token_signals(mx.array(cases["one_hot"])))
    assert h < 1e-6 and var < 1e-6 and margin > 0.999999
    h, var, margin = np.array(token_signals(mx.zeros((1, v))))
    assert abs(h - max_entropy_bits(v)) < 1e-4 and var < 1e-4 and margin == 0
    assert np.array(token_signals(mx.array(cases["tie"])))[2] == 0.0
    assert float(token_signals(mx.zeros((v,), dtype=mx.bfloat16))[0]) == pytest.approx(math.log2(v))
    assert max_entropy_bits(151936) == pytest.approx(17.2131, abs=1e-4)


@pytest.mark.parametrize("name", list(_nan_cases()))
def test_nan_and_broken_logits_give_nan(name):
    # The router's catastrophic guard relies on a NaN entropy.
    x = _nan_cases()[name]
    assert np.isnan(np.array(token_signals(mx.array(x)))).all()
    assert np.isnan(token_signals_numpy(x)).all()


def test_signals_stay_lazy_until_evaluated():
    # Logits behind a slow computation, like a forward pass: building the signals must not run it.
    head = mx.random.normal((256, 151936), key=mx.random.key(2)) / 6
    hidden = mx.random.normal((1, 256), key=mx.random.key(1))
    mx.eval(head, hidden)
    logits = hidden @ head
    start = time.perf_counter()
    out = token_signals(logits)
    built = time.perf_counter() - start
    assert isinstance(out, mx.array) and out.shape == (3,) and out.dtype == mx.float32
    start = time.perf_counter()
    mx.async_eval(out)  # what the engine does, together with the sampled token
    values = np.array(out)
    evaluated = time.perf_counter() - start
    assert built < evaluated / 5, (built, evaluated)
    assert error(values, float64_token_signals(np.array(logits))) < 1e-4


def test_rejects_a_batch():
    with pytest.raises(ValueError):
        token_signals(mx.zeros((2, 10)))
    with pytest.raises(ValueError):
        token_signals_numpy(np.zeros((2, 10), dtype=np.float32))


# -- the Metal kernel --------------------------------------------------------------------------


def test_kernel_builds_and_self_check_reports():
    header, body = entropy_kernel._split_source()
    assert "token_signal_simd_combine" in header and "logits_shape" in body
    # Building records the source and works on every backend; calling needs Metal.
    assert entropy_kernel._make_kernel() is not None
    checks = kernel_self_check()
    assert checks[0].status == "ok"
    assert checks[1].name == entropy_kernel.KERNEL_NAME and checks[1].backend == "metal"
    if not mx.metal.is_available():
        assert not entropy_kernel.kernel_available()
        assert checks[1].status == "unavailable: no Metal backend"
        # and the dispatcher falls back to the reference
        x = mx.array(_logits(1000))
        assert np.array_equal(np.array(token_signals(x)), np.array(entropy_kernel.reference_token_signals(x)))
    else:
        assert checks[1].status == "ok"


def _fake_kernel(max_threads: int, wrong: bool = False):
    """Stands in for the built kernel: MLX raises past the pipeline's thread limit."""

    def kernel(*, inputs, threadgroup, **_):
        if threadgroup[0] > max_threads:
            raise ValueError(f"Thread group size ({threadgroup[0]}) is greater than the maximum")
        result = entropy_kernel.reference_token_signals(inputs[0])
        return [result + 1.0 if wrong else result * 1.0]

    return kernel


@pytest.mark.parametrize(
    ("max_threads", "wrong", "expected"),
    [(1024, False, 1024), (512, False, 256), (128, False, None), (1024, True, None)],
)
def test_dispatcher_checks_the_kernel_once_then_keeps_or_drops_it(monkeypatch, max_threads, wrong, expected):
    monkeypatch.setattr(entropy_kernel, "_KERNEL", _fake_kernel(max_threads, wrong))
    resolve_route(backend="metal")  # a Mac's route, the stand-in kernel in Metal's place
    monkeypatch.setattr(entropy_kernel, "_CHECKED", {})
    launched = []
    real_launch = entropy_kernel._launch

    def launch(kernel, flat, threads, verbose=False):
        launched.append(threads)
        return real_launch(kernel, flat, threads)

    monkeypatch.setattr(entropy_kernel, "_launch", launch)
    x = mx.array(_logits(2000))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = token_signals(x)
    assert [w.category for w in caught] == ([RuntimeWarning] if expected is None else [])
    assert {mx.float32: expected} == entropy_kernel._CHECKED
    launched.clear()
    second = token_signals(x)  # checked once per dtype, not again
    assert launched == ([expected] if expected is not None else [])
    want = np.array(entropy_kernel.reference_token_signals(x))
    for got in (first, second):
        assert np.allclose(np.array(got), want)


def test_reference_setting_bypasses_the_kernel(monkeypatch):
    monkeypatch.setattr(entropy_kernel, "_KERNEL", _fake_kernel(1024, False))
    monkeypatch.setattr(entropy_kernel, "_CHECKED", {})
    monkeypatch.setenv("MLXSWITCH_KERNELS", "reference")
    assert resolve_route(backend="metal").signals == "mx-ops"
    launched = []
    monkeypatch.setattr(entropy_kernel, "_launch", lambda *a, **k: launched.append(1))
    x = mx.array(_logits(2000))
    assert np.allclose(np.array(token_signals(x)), np.array(entropy_kernel.reference_token_signals(x)))
    assert launched == [] and entropy_kernel._CHECKED == {}


@pytest.mark.skipif(not mx.metal.is_available(), reason="needs Metal")
@pytest.mark.parametrize("vocab", (4099,) + VOCABS)
@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("threads", entropy_kernel.THREADGROUP_SIZES)
def test_metal_kernel_matches_reference(vocab, dtype, threads):
    x = mx.array(_logits(vocab)).astype(dtype)
    try:
        got = np.array(entropy_kernel.metal_token_signals(x, threads))
    except ValueError as exc:  # this GPU's pipeline limit; the dispatcher then uses a smaller size
        pytest.skip(str(exc))
    want = np.array(entropy_kernel.reference_token_signals(x))
    assert error(got, want) < 1e-4


@pytest.mark.skipif(not mx.metal.is_available(), reason="needs Metal")
def test_metal_kernel_special_values():
    for name, x in _special_cases().items():
        got = np.array(entropy_kernel.metal_token_signals(mx.array(x)))
        assert error(got, float64_token_signals(x)) < 1e-4, name
    for name, x in _nan_cases().items():
        assert np.isnan(np.array(entropy_kernel.metal_token_signals(mx.array(x)))).all(), name
    assert token_signals(mx.array(_logits(4099))).tolist()  # the dispatcher kept the kernel
    assert all(t is not None for t in entropy_kernel._CHECKED.values())


# -- the Metal kernel's exact source, emulated on the CPU ---------------------------------------

# Metal built-ins the kernel uses, for g++. SIMD functions run in lock step: every lane writes
# its value, waits for the other 31, reads, waits again (so divergence would deadlock, not pass).
_EMULATION_PRELUDE = r"""
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

typedef unsigned int uint;
typedef unsigned short ushort;
struct uint3 { uint x, y, z; };
struct bfloat16_t {
  uint16_t bits;
  operator float() const { uint32_t u = uint32_t(bits) << 16; float f; std::memcpy(&f, &u, 4); return f; }
};
struct float16_t {
  uint16_t bits;
  operator float() const {
    uint32_t sign = (bits >> 15) & 1, exp = (bits >> 10) & 31, man = bits & 1023;
    float mag = exp == 0 ? std::ldexp(float(man), -24)
              : exp == 31 ? (man ? NAN : INFINITY)
              : std::ldexp(float(man | 1024), int(exp) - 25);
    return sign ? -mag : mag;
  }
};
enum mem_flags { mem_none, mem_device, mem_threadgroup };

namespace emu {
struct Simd { std::barrier<>* sync; uint64_t slot[32]; };
thread_local uint lane_id, group_id;
std::vector<Simd> simds;
std::barrier<>* group_sync;

template <class T> void publish(T v) {
  std::memcpy(&simds[group_id].slot[lane_id], &v, sizeof(T));
  simds[group_id].sync->arrive_and_wait();
}
template <class T> T peek(uint lane) {
  T v;
  std::memcpy(&v, &simds[group_id].slot[lane], sizeof(T));
  return v;
}
template <class T, class F> T reduce(T v, F f) {
  publish(v);
  T acc = peek<T>(0);
  for (uint l = 1; l < 32; ++l) acc = f(acc, peek<T>(l));
  simds[group_id].sync->arrive_and_wait();
  return acc;
}
}  // namespace emu

namespace metal {
inline float exp(float x) { return std::exp(x); }
inline float log(float x) { return std::log(x); }
inline bool isnan(float x) { return std::isnan(x); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline float min(float a, float b) { return std::fmin(a, b); }
}  // namespace metal

template <class T> T simd_max(T v) { return emu::reduce(v, [](T a, T b) { return metal::max(a, b); }); }
template <> uint simd_max(uint v) { return emu::reduce(v, [](uint a, uint b) { return a > b ? a : b; }); }
template <class T> T simd_min(T v) { return emu::reduce(v, [](T a, T b) { return metal::min(a, b); }); }
template <> uint simd_min(uint v) { return emu::reduce(v, [](uint a, uint b) { return a < b ? a : b; }); }
template <class T> T simd_sum(T v) { return emu::reduce(v, [](T a, T b) { return a + b; }); }
template <class T> T simd_shuffle_down(T v, ushort delta) {
  emu::publish(v);
  T r = emu::lane_id + delta < 32 ? emu::peek<T>(emu::lane_id + delta) : v;
  emu::simds[emu::group_id].sync->arrive_and_wait();
  return r;
}
inline void threadgroup_barrier(mem_flags) { emu::group_sync->arrive_and_wait(); }

// Address spaces vanish; threadgroup variables become statics shared by the emulated threads.
#define device
#define constant
#define thread
#define threadgroup static
"""

_EMULATION_MAIN = r"""
#undef device
#undef constant
#undef thread
#undef threadgroup

int main(int argc, char** argv) {
  // argv: input file (raw logits), vocab, threads; prints the three outputs.
  int vocab = std::atoi(argv[2]);
  uint n = uint(std::atoi(argv[3]));
  std::vector<unsigned char> data(size_t(vocab) * sizeof(INPUT_TYPE));
  FILE* f = std::fopen(argv[1], "rb");
  if (std::fread(data.data(), 1, data.size(), f) != data.size()) return 2;
  std::fclose(f);
  const INPUT_TYPE* logits = reinterpret_cast<const INPUT_TYPE*>(data.data());
  int shape[1] = {vocab};
  float out[3] = {-1.0f, -1.0f, -1.0f};
  emu::simds.resize((n + 31) / 32);
  for (auto& s : emu::simds) s.sync = new std::barrier<>(32);
  emu::group_sync = new std::barrier<>(n);
  std::vector<std::thread> threads;
  for (uint tid = 0; tid < n; ++tid) {
    threads.emplace_back([=, &out] {
      emu::lane_id = tid % 32;
      emu::group_id = tid / 32;
      KERNEL_CALL;
    });
  }
  for (auto& t : threads) t.join();
  std::printf("%.9g %.9g %.9g\n", out[0], out[1], out[2]);
  return 0;
}
"""

_ARGUMENTS = {
    "logits": "logits",
    "logits_shape": "shape",
    "out": "out",
    "simdgroup_index_in_threadgroup": "tid / 32",
    "thread_index_in_simdgroup": "tid % 32",
    "thread_position_in_threadgroup": "uint3{tid, 0, 0}",
    "threads_per_threadgroup": "uint3{n, 1, 1}",
}


def _generated_source(dtype, capfd, folder) -> str:
    """The full Metal source MLX generates for this dtype (printed by verbose=True)."""
    kernel = entropy_kernel._make_kernel()

    def launch(x):
        return entropy_kernel._launch(kernel, x, entropy_kernel.THREADGROUP_SIZES[0], verbose=True)

    capfd.readouterr()
    # Export tracing records a Metal kernel without Metal; it prints the source on the way.
    with contextlib.suppress(Exception):
        mx.export_function(str(folder / "trace.mlxfn"), launch, mx.zeros((4099,), dtype=dtype))
    printed = capfd.readouterr().out
    match = re.search(r"```\n(.*)```", printed, re.S)
    if match is None:
        pytest.fail(NO_SOURCE.format(version=mx.__version__))
    return match.group(1)


def _emulator_program(source: str) -> str:
    signature = re.search(r"\[\[kernel\]\] void (\w+)\((.*?)\) \{", source, re.S)
    name, params = signature.group(1), signature.group(2)
    input_type = re.search(r"const device (\w+)\* logits", params).group(1)
    names = [re.search(r"(\w+) \[\[", p).group(1) for p in params.split(",\n")]
    unknown = [n for n in names if n not in _ARGUMENTS]
    assert not unknown, f"emulator lacks kernel arguments {unknown}"
    call = f"{name}<{input_type}>(" + ", ".join(_ARGUMENTS[n] for n in names) + ")"
    # g++ rejects attributes on an explicit instantiation; the call above instantiates instead.
    body = re.sub(r"\ntemplate \[\[host_name.*", "\n", source, flags=re.S)
    main = _EMULATION_MAIN.replace("INPUT_TYPE", input_type).replace("KERNEL_CALL", call)
    return _EMULATION_PRELUDE + body + main


def _emulated(dtype, x: np.ndarray, threads: int, build, capfd) -> np.ndarray:
    """Run the generated kernel for `dtype` on logits x with one threadgroup of `threads`."""
    if dtype not in build:
        src = build["dir"] / f"kernel_{str(dtype).rsplit('.', 1)[-1]}.cpp"
        src.write_text(_emulator_program(_generated_source(dtype, capfd, build["dir"])))
        exe = src.with_suffix("")
        subprocess.run(
            ["g++", "-std=c++20", "-O1", "-pthread", "-Wno-attributes", "-o", str(exe), str(src)],
            check=True,
            capture_output=True,
            text=True,
        )
        build[dtype] = exe
    data = build["dir"] / "logits.bin"
    raw = np.array(mx.array(x).astype(dtype).view(mx.uint16 if dtype != mx.float32 else mx.uint32))
    data.write_bytes(raw.tobytes())
    run = subprocess.run(
        [str(build[dtype]), str(data), str(x.size), str(threads)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return np.array([float(v) for v in run.stdout.split()])


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.fail(NO_GXX)
    return {"dir": tmp_path_factory.mktemp("metal_emulation")}


@needs_gxx
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16, mx.float16])
def test_metal_source_emulated_matches_reference(dtype, build, capfd):
    for vocab, threads in ((4099, 1024), (49152, 1024), (151936, 1024), (151936, 256)):
        x = _logits(vocab, seed=vocab)
        rounded = mx.array(x).astype(dtype)
        want = np.array(entropy_kernel.reference_token_signals(rounded))
        got = _emulated(dtype, x, threads, build, capfd)
        assert error(got, want) < 1e-4, (vocab, threads, got, want)


@needs_gxx
def test_metal_source_emulated_special_values(build, capfd):
    for name, x in _special_cases(4099).items():
        got = _emulated(mx.float32, x, 1024, build, capfd)
        assert error(got, float64_token_signals(x)) < 1e-4, (name, got)
    for name, x in _nan_cases(4099).items():
        assert np.isnan(_emulated(mx.float32, x, 1024, build, capfd)).all(), name
    # fewer logits than threads: most threads stay empty
    x = _logits(37, seed=9)
    assert error(_emulated(mx.float32, x, 1024, build, capfd), float64_token_signals(x)) < 1e-4


def test_the_float64_truth_equals_a_naive_log_softmax():
    # The truth shares the engine's identities (kernels/entropy.py); this keeps it honest against
    # the textbook formulas, written out independently.
    rng = np.random.default_rng(5)
    for v in (2, 7, 4099):
        x = rng.normal(0, 4, v)
        p = np.exp(x - x.max())
        p /= p.sum()
        bits = np.log2(p)
        entropy = -(p * bits).sum()
        top = np.sort(p)[-2:]
        want = [entropy, (p * bits * bits).sum() - entropy**2, top[1] - top[0]]
        assert np.allclose(float64_token_signals(x), want, rtol=1e-9, atol=1e-12)


def test_an_mlx_that_prints_no_source_fails_the_emulation_instead_of_skipping(monkeypatch, capfd, tmp_path):
    # Without the printed source the kernel has no test off a Mac: that must fail, never skip.
    monkeypatch.setattr(mx, "export_function", lambda *a, **k: None)
    with pytest.raises(pytest.fail.Exception, match="printed no generated Metal source"):
        _generated_source(mx.float32, capfd, tmp_path)
