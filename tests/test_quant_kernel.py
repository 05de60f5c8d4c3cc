"""The compiled quantized kernel (mlxswitch/kernels/quant_cpu.py, quant_rows.c): equal to a float64
product of MLX's own dequantized weight at every bit width, group size, row grouping, path and
thread count; its life cycle (cached build, check, fall-backs that say why); the models and
nested gears that run on it give the reference's logits."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import os

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from mlxswitch.kernels import cbuild, quant_check, quant_cpu
from mlxswitch.kernels.quant_check import check_kernel
from mlxswitch.kernels.quant_cpu import build_quant_kernel
from mlxswitch.kernels.quant_tiles import (
    leading_rows,
    q4k_tiled_values_mx,
    q6k_tiled_values_mx,
    tiled_codes,
    tiled_q4k_weight,
    tiled_q6k_weight,
    tiled_weight,
    tiles_q6k,
    tiles_weight,
)
from mlxswitch.kernels.quant_weights import (
    Q4K_TILED,
    Q6K,
    Q6K_TILED,
    SUPPORTED_BITS,
    TILED,
    QuantWeight,
    q4k_values,
    q6k_values,
    q6k_values_mx,
    quant_views,
    unpack_codes,
)
from mlxswitch.kernels.route import resolve_route

KERNEL = build_quant_kernel().kernel
needs_kernel = pytest.mark.skipif(
    KERNEL is None, reason=f"no quantized kernel: {build_quant_kernel().detail}"
)


class KernelDouble:
    """The kernel with `off(xs, weight, many_from, int8, wide)` deciding which products to spoil:
    every other attribute the real kernel's, so a check sees a kernel wrong only there."""

    def __init__(self, off):
        self.off = off

    def __getattr__(self, name):
        return getattr(KERNEL, name)

    def times(self, xs, weight, threads=1, many_from=None, int8=False, wide=False):
        y = KERNEL.times(xs, weight, threads, many_from, int8, wide)
        if self.off(xs, weight, many_from, int8, wide):
            y[-1, -1] += 1e-2
        return y


@pytest.fixture(autouse=True)
def int8_on_tiny_rows(monkeypatch):
    """The tiny models here stand for real ones: int8 (or int16) activations on rows of any length."""
    from mlxswitch.kernels import quant_cpu

    monkeypatch.setattr(quant_cpu, "INT8_MIN_INPUTS", 32)
    monkeypatch.setattr(quant_cpu, "WIDE_MIN_INPUTS", 32)


def _weight(out_dims, in_dims, bits, group_size, seed=0, scale_dtype=mx.float32):
    rng = np.random.default_rng(seed)
    w = mx.array(rng.standard_normal((out_dims, in_dims)).astype(np.float32))
    q, s, b = mx.quantize(w, group_size=group_size, bits=bits)
    s, b = s.astype(scale_dtype), b.astype(scale_dtype)
    # The truth in fp32 arithmetic from the stored scales (a half dequantization rounds its output).
    wide = (s.astype(mx.float32), b.astype(mx.float32))
    truth = np.array(mx.dequantize(q, *wide, group_size=group_size, bits=bits))
    return QuantWeight.from_arrays(q, s, b, group_size, bits), truth.astype(np.float64)


@needs_kernel
@pytest.mark.parametrize("bits", SUPPORTED_BITS)
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_the_kernel_equals_a_float64_product_of_mlx_dequantized_weight(bits, group_size):
    weight, truth = _weight(21, 2 * group_size, bits, group_size, seed=bits)  # odd output count
    rng = np.random.default_rng(group_size)
    for rows in (1, 2, 3, 4, 5, 8, 11, 12, 13, 25):
        xs = rng.standard_normal((rows, weight.in_dims)).astype(np.float32)
        want = xs.astype(np.float64) @ truth.T
        for many_from in (1 << 30, 1, None):  # registers, dequantized panel, the default rule
            got = KERNEL.times(xs, weight, 2, many_from)
            assert got.shape == want.shape
            assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), (rows, many_from)


@needs_kernel
def test_one_and_two_threads_give_the_same_bits():
    weight, _ = _weight(301, 256, 4, 32)
    xs = np.random.default_rng(1).standard_normal((7, 256)).astype(np.float32)
    for many_from in (1 << 30, 1):
        assert np.array_equal(KERNEL.times(xs, weight, 1, many_from), KERNEL.times(xs, weight, 2, many_from))


@needs_kernel
def test_products_from_other_threads_and_a_forked_child_give_the_same_bits():
    # The kernel's one thread pool serves whichever thread calls (a server's engine thread after
    # the main thread's checks), several callers at once, and a forked child starts its own.
    weight, _ = _weight(301, 256, 4, 32)
    xs = np.random.default_rng(2).standard_normal((3, 256)).astype(np.float32)
    want = {int8: KERNEL.times(xs, weight, 2, int8=int8) for int8 in (False, True)}
    with concurrent.futures.ThreadPoolExecutor(4) as callers:
        got = list(callers.map(lambda i: KERNEL.times(xs, weight, 2, int8=i % 2 == 1), range(40)))
    for i, y in enumerate(got):
        assert np.array_equal(y, want[i % 2 == 1])
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: one product on its own pool, its bytes sent back
        try:
            os.write(write, KERNEL.times(xs, weight, 2).tobytes())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        sent = pipe.read()
    os.waitpid(child, 0)
    assert np.array_equal(np.frombuffer(sent, dtype=np.float32).reshape(want[False].shape), want[False])


@needs_kernel
@pytest.mark.parametrize("scale_dtype", [mx.float16, mx.bfloat16])
@pytest.mark.parametrize("bits", [4, 8, 5])
def test_half_precision_scales_are_read_in_place_and_give_the_float64_products(scale_dtype, bits):
    from mlxswitch.kernels.quant_check import int8_reference

    weight, truth = _weight(19, 320, bits, 32, seed=bits, scale_dtype=scale_dtype)
    assert weight.scales.itemsize == weight.biases.itemsize == 2  # no fp32 copy of them
    assert weight.nbytes == weight.codes.nbytes + 2 * weight.scales.size * 2
    rng = np.random.default_rng(2)
    for rows in (1, 3, 13):
        xs = rng.standard_normal((rows, 320)).astype(np.float32)
        want = xs.astype(np.float64) @ truth.T
        for many_from in (1 << 30, 1):  # registers, dequantized panel
            got = KERNEL.times(xs, weight, 2, many_from)
            assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), (rows, many_from)
        exact = int8_reference(xs, weight, truth)
        got = KERNEL.times(xs, weight, 2, None, int8=True)
        assert np.abs(got - exact).max() <= 1e-5 * np.abs(exact).max()


def test_fp32_scales_become_fp16_only_where_every_scale_is_in_its_normal_range():
    from mlxswitch.kernels.quant_weights import FP16_NORMAL_MIN, fp16_scales

    scales = mx.array([[0.5, 0.0], [FP16_NORMAL_MIN, 3.0]])
    biases = mx.array([[-4.0, 1e-9], [0.0, -24.0]])
    narrowed = fp16_scales(scales, biases)
    assert narrowed is not None and all(a.dtype == mx.float16 for a in narrowed)
    assert np.array_equal(np.array(narrowed[0].astype(mx.float32)), np.array(scales))
    # a step fp16 holds with fewer than 11 significant bits, or a value past its range: kept
    assert fp16_scales(mx.array([[0.5, FP16_NORMAL_MIN / 2]]), mx.zeros((1, 2))) is None
    assert fp16_scales(mx.array([[0.5, 1.0]]), mx.array([[0.0, 70000.0]])) is None
    assert fp16_scales(scales.astype(mx.float16), biases.astype(mx.float16)) is None  # not fp32


def test_4_and_8_bit_codes_are_read_in_place_and_other_widths_unpacked_once():
    for bits in (4, 8):
        q, s, b = mx.quantize(mx.ones((16, 64)), group_size=32, bits=bits)
        view = QuantWeight.from_arrays(q, s, b, 32, bits)
        assert np.shares_memory(view.codes, np.asarray(q)) and view.bits == bits
        assert view.nbytes == q.nbytes + s.nbytes + b.nbytes  # fp32 scales: no copy either
    for bits in (2, 3, 5, 6):
        w = mx.array(np.random.default_rng(bits).standard_normal((8, 64)).astype(np.float32))
        q, s, b = mx.quantize(w, group_size=32, bits=bits)
        codes = unpack_codes(np.asarray(q), bits, 64)
        rebuilt = codes.reshape(8, 2, 32) * np.asarray(s)[..., None] + np.asarray(b)[..., None]
        assert np.allclose(rebuilt.reshape(8, 64), np.array(mx.dequantize(q, s, b, group_size=32, bits=bits)))


@needs_kernel
@pytest.mark.parametrize("bits", [3, 5, 6])
def test_narrow_codes_are_widened_in_place_to_bytes_and_give_the_reference_logits(bits):
    from tinymodels import llama_config, make_model

    from mlxswitch.models import row_routes
    from mlxswitch.models.nesting import source_bits

    ids = mx.array([[5, 17, 42, 7, 99, 3]])
    logits = {}
    for kernels in ("reference", "exact"):
        resolve_route(kernels, "cpu")
        model = make_model(llama_config(vocab_size=300, tie=True), seed=5)
        nn.quantize(model, group_size=32, bits=bits)
        mx.eval(model.parameters())
        row_routes.use_fast_rows(model)
        logits[kernels] = np.array(model(ids))
    layer = model.model.layers[0].self_attn.q_proj
    view = layer.quant.weights[0]
    # MLX's own 8-bit layout, read in place: the kernel's codes are the layer's only copy...
    assert layer.bits == 8 and view.keep[0] is layer["weight"] and view.code_bits == bits == layer.code_bits
    assert source_bits(model) == bits  # what a gear build reads: the source's own width
    assert np.shares_memory(view.codes, np.asarray(layer["weight"]))
    assert model.model.embed_tokens.bits == 8  # the tied head too
    # ...and W is the same: the reference route's logits on the packed codes
    assert np.allclose(logits["exact"], logits["reference"], rtol=1e-4, atol=1e-4)


def test_shapes_the_kernel_does_not_take_get_no_view():
    q, s, b = mx.quantize(mx.ones((8, 64)), group_size=32, bits=4)
    assert quant_views([{"weight": q, "scales": s, "biases": None}], (4,), 32) is None
    assert quant_views([{"weight": q, "scales": s, "biases": b}], (4,), 32) is not None


@needs_kernel
def test_the_check_catches_a_wrong_row_and_a_wrong_code():
    assert "differed" in check_kernel(KernelDouble(lambda *_: True))

    class WrongCode:
        times = staticmethod(KERNEL.times)

        @staticmethod
        def unpack(packed, bits, in_dims):
            codes = KERNEL.unpack(packed, bits, in_dims)
            codes[-1, -1] ^= 1
            return codes

    assert "unpacked differently" in check_kernel(WrongCode())


def _q6k_blocks(out_dims: int, in_dims: int, seed: int = 0) -> np.ndarray:
    """Random Q6_K blocks: every code, scale and sign, d a normal fp16 (gguf has no Python Q6_K
    quantizer)."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(out_dims, in_dims // 256, 210), dtype=np.uint8)
    d = (rng.standard_normal(blocks.shape[:2]) * 1e-2).astype(np.float16)
    blocks[..., 208:] = d.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(out_dims, -1)


def test_q6k_values_are_ggufs_own_dequantization():
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    blocks = _q6k_blocks(7, 768)
    want = dequantize(blocks, GGMLQuantizationType.Q6_K).astype(np.float64).reshape(7, 768)
    assert np.array_equal(q6k_values(blocks, 768), want)
    assert np.array_equal(np.asarray(q6k_values_mx(mx.array(blocks), 768)), want.astype(np.float32))


@needs_kernel
def test_q6k_blocks_are_read_as_stored_and_equal_float64_products_on_every_path():
    blocks = _q6k_blocks(21, 512)  # an odd output count
    weight = QuantWeight.from_q6k(mx.array(blocks), 512)
    assert weight.nbytes == blocks.nbytes == 21 * 2 * 210  # 6.5625 bits a weight, nothing beside
    truth = q6k_values(blocks, 512)
    rng = np.random.default_rng(3)
    for rows in (1, 2, 3, 4, 5, 8, 13):
        xs = rng.standard_normal((rows, 512)).astype(np.float32)
        exact = xs.astype(np.float64) @ truth.T
        int16, int8 = (quant_check.rounded_rows(xs, wide=wide) @ truth.T for wide in (True, False))
        assert KERNEL.gemm_takes(weight, wide=True) and not KERNEL.gemm_takes(weight)
        for many_from in (1 << 30, 1):
            for threads in (1, 2):
                got = KERNEL.times(xs, weight, threads, many_from)  # fp32 rows: the panel
                assert np.abs(got - exact).max() <= 1e-5 * np.abs(exact).max(), (rows, many_from)
                # in registers int16 rows (a down projection's) or int8 ones (a head's); tiles: int16
                for wide in (True, False):
                    got = KERNEL.times(xs, weight, threads, many_from, int8=True, wide=wide)
                    want = int16 if wide or rows >= many_from else int8
                    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), (rows, many_from, wide)
                    # each row's bits do not depend on the rows beside it, or the threads
                    alone = KERNEL.times(xs[-1:], weight, 1, many_from, int8=True, wide=wide)
                    assert np.array_equal(got[-1:], alone)


@needs_kernel
def test_the_check_catches_a_wrong_q6k_product():
    assert "Q6_K" in check_kernel(KernelDouble(lambda xs, weight, *_: weight.layout == Q6K))


@needs_kernel
def test_the_check_catches_a_wrong_product_of_the_int8_tiles():
    def off(xs, weight, many_from, int8, wide):
        many = many_from is not None and xs.shape[0] >= many_from
        return int8 and many and weight.layout != TILED and KERNEL.gemm_takes(weight, wide)

    assert "activations by the tile path" in check_kernel(KernelDouble(off))


@needs_kernel
@pytest.mark.skipif(KERNEL is None or not KERNEL.tiled, reason="this build lays no weight out as tiles")
def test_the_check_catches_a_wrong_product_of_a_weight_laid_out_as_tiles():
    off = KernelDouble(lambda xs, weight, *_: weight.layout == TILED and xs.shape[0] == 9)
    assert "4-bit tiles, group 32" in check_kernel(off) and "9 int8 rows" in check_kernel(off)


@needs_kernel
@pytest.mark.skipif(KERNEL is None or not KERNEL.tiled, reason="this build lays no weight out as tiles")
def test_the_check_catches_a_wrong_product_of_q6k_blocks_laid_out_as_tiles():
    off = KernelDouble(lambda xs, weight, many_from, int8, wide: weight.layout == Q6K_TILED and wide)
    found = check_kernel(off)
    assert found.startswith("Q6_K tiles: ") and "int16 rows" in found


@needs_kernel
@pytest.mark.skipif(KERNEL is None or not KERNEL.tiled, reason="this build lays no weight out as tiles")
def test_q6k_blocks_laid_out_as_tiles_hold_their_values_and_give_every_row_count_the_same_bits():
    blocks = _q6k_blocks(48, 768)
    weight = QuantWeight.from_q6k(mx.array(blocks), 768)
    assert tiles_q6k(weight) and not tiles_q6k(QuantWeight.from_q6k(mx.array(_q6k_blocks(21, 256)), 256))
    tiled = tiled_q6k_weight(KERNEL, weight)
    assert tiled.layout == Q6K_TILED and tiled.nbytes == weight.nbytes  # 6.5625 bits a weight still
    truth = q6k_values(blocks, 768)
    assert np.array_equal(np.asarray(q6k_tiled_values_mx(tiled.keep[0], 768)), truth.astype(np.float32))
    rng = np.random.default_rng(4)  # int8 rows (a head's), int16 (a down's)
    _assert_tiled_rows(tiled, rng, lambda xs, wide: quant_check.rounded_rows(xs, wide) @ truth.T)


def _assert_tiled_rows(tiled: QuantWeight, rng, reference) -> None:
    """A laid-out weight times 1-33 random rows, int8 and int16, within fp32 rounding of
    `reference(xs, wide)` on 2 threads, and a row's bits the same alone on one."""
    for rows, wide in itertools.product((1, 3, 8, 9, 33), (False, True)):
        xs = rng.standard_normal((rows, tiled.in_dims)).astype(np.float32)
        want = reference(xs, wide)
        got = KERNEL.times(xs, tiled, 2, int8=True, wide=wide)
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), (rows, wide)
        for row in (0, rows - 1):
            assert np.array_equal(
                got[row], KERNEL.times(xs[row : row + 1], tiled, 1, int8=True, wide=wide)[0]
            )


@needs_kernel
@pytest.mark.skipif(KERNEL is None or not KERNEL.tiled, reason="this build lays no weight out as tiles")
def test_the_check_catches_a_wrong_product_of_q4k_blocks_laid_out_as_tiles():
    off = KernelDouble(lambda xs, weight, *_: weight.layout == Q4K_TILED and xs.shape[0] == 5)
    found = check_kernel(off)
    assert found.startswith("Q4_K tiles: ") and "5 int8 rows" in found


@needs_kernel
@pytest.mark.skipif(KERNEL is None or not KERNEL.tiled, reason="this build lays no weight out as tiles")
def test_q4k_blocks_laid_out_as_tiles_hold_their_values_and_give_every_row_count_the_same_bits():
    """Q4_K blocks as stored (4.5 bits a weight) equal ggml's dequantization laid out as tiles, and
    multiply int8 rows (q, k, gate, up) and int16 ones (a down projection) as the rounded rows times
    the codes' part plus the exact rows times the mins', each row's bits the same alone."""
    rng = np.random.default_rng(5)
    blocks = quant_check.random_q4k_blocks(rng, 48, 768)
    codes, mins = q4k_values(blocks, 768)
    # 24 outputs do not tile
    assert tiled_q4k_weight(KERNEL, mx.array(quant_check.random_q4k_blocks(rng, 24, 256)), 256) is None
    tiled = tiled_q4k_weight(KERNEL, mx.array(blocks), 768)
    assert tiled.layout == Q4K_TILED and tiled.nbytes == blocks.nbytes == 48 * 768 * 4.5 / 8
    values = np.asarray(q4k_tiled_values_mx(tiled.keep[0], 768))
    assert np.abs(values - (codes - mins)).max() <= 1e-6 * np.abs(codes - mins).max()

    def reference(xs: np.ndarray, wide: bool) -> np.ndarray:
        return quant_check.rounded_rows(xs, wide) @ codes.T - xs.astype(np.float64) @ mins.T

    _assert_tiled_rows(tiled, rng, reference)


@needs_kernel
@pytest.mark.skipif(KERNEL is None or not KERNEL.tiled, reason="this build lays no weight out as tiles")
@pytest.mark.parametrize("bits, group_size", [(4, 32), (4, 64), (5, 32), (8, 64)])
def test_a_weight_laid_out_as_tiles_gives_every_row_count_the_filled_tiles_bits(bits, group_size):
    rng = np.random.default_rng(group_size + bits)
    weight, truth = quant_check._random_weight(
        rng, 48, 320 if group_size == 32 else 384, bits, group_size, mx.float16
    )
    assert tiles_weight(weight) and not tiles_weight(quant_check._random_weight(rng, 40, 64, 4, 32)[0])
    assert tiles_weight(weight, wide=True) == (bits == 4)  # int16 rows: 4-bit codes only
    tiled = tiled_weight(KERNEL, weight)
    assert tiled.layout == TILED and tiled.bits == bits  # 5-bit codes held a byte each: 5-bit tiles
    assert tiled.codes.nbytes * 8 == weight.out_dims * weight.in_dims * bits  # 4 and 8: the same bytes
    codes = weight.codes if weight.bits == 8 else unpack_codes(weight.codes, 4, weight.in_dims)
    assert np.array_equal(tiled_codes(tiled.codes, 48, weight.in_dims), codes)
    for rows, wide in itertools.product((1, 2, 4, 7, 8, 9, 16, 33), (False, True) if bits == 4 else (False,)):
        xs = rng.standard_normal((rows, weight.in_dims)).astype(np.float32)
        want = quant_check.int8_reference(xs, weight, truth, wide)  # int16 rows where wide
        got = KERNEL.times(xs, tiled, 2, int8=True, wide=wide)
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
        # the bits of MLX's layout multiplied through tiles filled per call (a prefill's)
        assert np.array_equal(got, KERNEL.times(xs, weight, 1, 1, int8=True, wide=wide))
        for row in (0, rows - 1):  # a row's bits, alone or beside others, on 1 or 2 threads
            assert np.array_equal(
                got[row], KERNEL.times(xs[row : row + 1], tiled, 1, int8=True, wide=wide)[0]
            )
    with pytest.raises(ValueError, match="integer activations only"):
        KERNEL.times(xs, tiled, 1)


@needs_kernel
@pytest.mark.skipif(KERNEL is None or not KERNEL.tiled, reason="this build lays no weight out as tiles")
def test_a_weights_leading_rows_are_its_first_outputs_bit_for_bit_in_every_layout():
    """A drafter's head (heads.leading_outputs) multiplies a prefix of its weight's arrays: in
    MLX's layout, as tiles of 4-bit or byte codes, and as Q6_K or Q4_K blocks (as stored or tiled),
    the first outputs' bits; a prefix that would cut a tile is refused."""
    rng = np.random.default_rng(11)
    four, _ = quant_check._random_weight(rng, 64, 256, 4, 32, mx.float16)
    five, _ = quant_check._random_weight(rng, 64, 256, 5, 32, mx.float16)
    q6k = QuantWeight.from_q6k(mx.array(_q6k_blocks(64, 256)), 256)
    weights = {
        "affine": four,
        "tiles": tiled_weight(KERNEL, four),
        "byte tiles": tiled_weight(KERNEL, five),
        "q6_k": q6k,
        "q6_k tiles": tiled_q6k_weight(KERNEL, q6k),
        "q4_k tiles": tiled_q4k_weight(KERNEL, mx.array(quant_check.random_q4k_blocks(rng, 64, 256)), 256),
    }
    xs = rng.standard_normal((3, 256)).astype(np.float32)
    for name, weight in weights.items():
        lead = leading_rows(weight, 32)
        assert lead is not None and lead.out_dims == 32 and lead.layout == weight.layout, name
        whole = KERNEL.times(xs, weight, 2, int8=True)
        assert np.array_equal(KERNEL.times(xs, lead, 2, int8=True), whole[:, :32]), name
    assert leading_rows(weights["tiles"], 24) is None and leading_rows(four, 24) is not None
    assert leading_rows(four, 65) is None


@needs_kernel
@pytest.mark.skipif(KERNEL is None or not KERNEL.tiled, reason="this build lays no weight out as tiles")
@pytest.mark.parametrize("bits", [4, 8, 6])
def test_a_weight_laid_out_in_place_holds_the_tiles_a_copy_would_in_its_own_array(bits):
    rng = np.random.default_rng(bits)
    if bits == 6:
        made = lambda: QuantWeight.from_q6k(mx.array(_q6k_blocks(32, 512)), 512)
        lay = tiled_q6k_weight
    else:
        w = mx.array(rng.standard_normal((32, 256)).astype(np.float32))
        made = lambda: QuantWeight.from_arrays(*mx.quantize(w, group_size=32, bits=bits), 32, bits)
        lay = tiled_weight
    copied, own = lay(KERNEL, made()), made()
    stored = np.array(own.codes)
    in_place = lay(KERNEL, own, 2, in_place=True)
    assert in_place.keep[0] is own.keep[0]  # the weight's own array, now holding the tiles
    assert not np.array_equal(own.codes, stored)  # its view of that array reads the tiles too
    assert np.array_equal(np.asarray(in_place.keep[0]), np.asarray(copied.keep[0]))
    for mine, theirs in zip(in_place.keep[1:], copied.keep[1:], strict=True):
        assert np.array_equal(np.asarray(mine), np.asarray(theirs))
    with pytest.raises(ValueError, match="its own array"):
        lay(KERNEL, dataclasses.replace(made(), codes=stored), 2, in_place=True)


@needs_kernel
@pytest.mark.skipif(KERNEL is None or not KERNEL.tiled, reason="this build lays no weight out as tiles")
@pytest.mark.parametrize("bits", [4, 5])
def test_a_model_lays_its_4_and_5_bit_layers_out_as_tiles_and_a_check_gives_a_step_s_bits(bits):
    from tinymodels import llama_config, make_model

    from mlxswitch.models import row_routes, rows

    resolve_route("auto", "cpu")
    model = make_model(llama_config(vocab_size=300), seed=3)
    nn.quantize(model, group_size=32, bits=bits)
    mx.eval(model.parameters())
    reference = np.array(model(mx.array([[5, 9, 2, 7]])))  # MLX's own quantized layers
    assert row_routes.use_fast_rows(model) == "quant-kernel"
    layer = model.model.layers[0]
    assert isinstance(layer.mlp.gate_proj, rows.TiledLinear) and isinstance(
        layer.self_attn.o_proj, rows.TiledLinear
    )
    # on int16 activations 4-bit codes only; 5-bit ones as 5-bit tiles: 5 bits a code held, not 8
    assert isinstance(layer.mlp.down_proj, rows.TiledLinear) == (bits == 4)
    view = layer.mlp.gate_proj.quant.weights[0]
    assert (
        layer.mlp.gate_proj.bits == view.bits == bits
        and view.codes.nbytes * 8 == view.out_dims * view.in_dims * bits
    )
    ids = mx.array([[5, 9, 2, 7]])
    together = np.array(model(ids))  # four positions in one pass, as a check multiplies them
    assert np.abs(together - reference).max() <= 0.05 * np.abs(reference).max()  # int8 activations
    # a check's positions get the bits each gets alone (a step)
    gate = layer.mlp.gate_proj
    x = mx.random.normal((1, 5, gate.quant.weights[0].in_dims), key=mx.random.key(0))
    checked = np.array(gate(x))[0]
    for position in range(5):
        assert np.array_equal(checked[position], np.array(gate(x[:, position : position + 1]))[0, 0])
    # off the kernel (mx.compile refuses it) the layout's values in plain mx: MLX's W
    resolve_route("exact", "cpu")
    assert np.allclose(np.array(gate(x)), np.array(x @ gate.stored_values().T), atol=1e-5)
    resolve_route("auto", "cpu")


def _rebuilt(monkeypatch, **patches):
    for name, value in patches.items():
        monkeypatch.setattr(quant_cpu, name, value)
    build_quant_kernel.cache_clear()
    return build_quant_kernel()


def test_without_a_compiler_the_route_keeps_fp32_copies_and_says_why(monkeypatch):
    try:
        monkeypatch.setattr(cbuild.shutil, "which", lambda name: None)
        build = _rebuilt(monkeypatch)
        assert build.kernel is None and "no C compiler" in build.detail
        resolved = resolve_route("auto", "cpu")
        assert resolved.plain_linears == "resident-fp32"
        assert "no C compiler" in dict(resolved.describe())["plain_linears"]
    finally:
        build_quant_kernel.cache_clear()


@pytest.mark.parametrize(
    ("text", "said"),
    [("this is not C\n", "failed"), ("int nothing_here(void) { return 0; }\n", "lacks a function")],
)
def test_a_source_that_does_not_build_or_lacks_the_kernel_falls_back(monkeypatch, tmp_path, text, said):
    source = tmp_path / "quant_rows.c"
    source.write_text(text)
    try:
        build = _rebuilt(monkeypatch, SOURCE=source)
        assert build.kernel is None and said in build.detail
        assert resolve_route("auto", "cpu").plain_linears != "quant-kernel"
    finally:
        build_quant_kernel.cache_clear()


@needs_kernel
def test_a_later_process_loads_the_cached_library_instead_of_compiling(monkeypatch):
    build_quant_kernel.cache_clear()
    try:
        first = build_quant_kernel()
        assert first.kernel is not None  # compiled into this test's own cache directory
        assert list(cbuild.kernels_cache().glob("quant_rows-*.so"))
        build_quant_kernel.cache_clear()
        monkeypatch.setattr(cbuild.subprocess, "run", _no_compiler_run)
        again = build_quant_kernel()
        assert again.kernel is not None and "cached build" in again.detail
    finally:
        build_quant_kernel.cache_clear()


@needs_kernel
def test_a_checked_library_is_not_checked_again_until_its_bytes_change(monkeypatch):
    build_quant_kernel.cache_clear()
    try:
        first = build_quant_kernel()  # compiled and checked in this test's own cache directory
        assert first.kernel is not None and "kept from an earlier process" not in first.detail
        checks = []
        monkeypatch.setattr(quant_cpu, "check_kernel", lambda kernel: checks.append(kernel) or "planted")
        build_quant_kernel.cache_clear()
        again = build_quant_kernel()  # a later process: the pass kept beside the library
        assert again.kernel is not None and "kept from an earlier process" in again.detail
        assert checks == []
        (library,) = cbuild.kernels_cache().glob("quant_rows-*.so")
        other = library.with_suffix(".other")  # a new file: this process has the old one mapped
        other.write_bytes(library.read_bytes() + b"\0")
        os.replace(other, library)  # other bytes: checked again, and refused
        build_quant_kernel.cache_clear()
        refused = build_quant_kernel()
        assert refused.kernel is None and refused.detail == "check failed: planted"
        assert len(checks) == 1
        build_quant_kernel.cache_clear()
        assert build_quant_kernel().kernel is None and len(checks) == 2  # a failure is never kept
    finally:
        build_quant_kernel.cache_clear()


_REAL_RUN = cbuild.subprocess.run


def _no_compiler_run(command, **kwargs):
    if "--version" in command:  # the cache key asks the compiler's version: that is allowed
        return _REAL_RUN(command, **kwargs)
    raise AssertionError(f"compiled again: {command}")


@needs_kernel
def test_a_source_change_compiles_a_new_library(tmp_path):
    source = tmp_path / "k.c"
    source.write_text("int quant_threaded(void) { return 0; }\n")
    first = cbuild.library_key(source, "cc", ("-O3",))
    source.write_text("int quant_threaded(void) { return 1; }\n")
    assert cbuild.library_key(source, "cc", ("-O3",)) != first
    assert cbuild.library_key(source, "cc", ("-O2",)) != cbuild.library_key(source, "cc", ("-O3",))


@needs_kernel
def test_a_model_and_nested_gears_on_the_kernel_give_the_reference_logits():
    from tinymodels import llama_config, make_model

    from mlxswitch.models import row_routes
    from mlxswitch.models.nesting import nest_model

    ids = mx.array([[5, 17, 42, 7, 99, 3]])
    logits = {}
    for kernels in ("reference", "exact", "auto"):
        resolve_route(kernels, "cpu")
        model = make_model(llama_config(vocab_size=300, tie=True), seed=5)
        nn.quantize(model, group_size=32, bits=4)
        mx.eval(model.parameters())
        linears = row_routes.use_fast_rows(model)
        logits[kernels] = np.array(model(ids))
        if kernels != "reference":
            assert linears == "quant-kernel"
    # fp32 activations: the reference's logits; int8 activations (the default): close to them
    assert np.allclose(logits["exact"], logits["reference"], rtol=1e-4, atol=1e-4)
    assert np.abs(logits["auto"] - logits["reference"]).max() <= 0.05 * np.abs(logits["reference"]).max()
    geared = {}
    for kernels in ("reference", "exact"):
        resolve_route(kernels, "cpu")
        model = make_model(llama_config(vocab_size=300), seed=6)
        state = nest_model(model, (4, 4, 8), 32)
        for gear in (4, 8, 16):
            state.set(gear)
            geared[kernels, gear] = np.array(model(ids))
    for gear in (4, 8, 16):
        assert np.allclose(geared["exact", gear], geared["reference", gear], rtol=1e-4, atol=1e-4)


@needs_kernel
@pytest.mark.parametrize("wide", [False, True])  # int8, or int16 (a down projection's)
@pytest.mark.parametrize("bits", [4, 8, 5])  # 5: codes unpacked a byte each, centred at 16
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int8_activations_equal_their_reference_and_stay_close_to_the_exact_product(group_size, bits, wide):
    from mlxswitch.kernels.quant_check import int8_reference

    # a whole tree of 8 blocks of 32 and a part of one (and for 4-bit codes, a half pair of blocks)
    weight, truth = _weight(37, 256 + group_size, bits, group_size, seed=group_size)
    rng = np.random.default_rng(3)
    for rows in (1, 2, 3, 4, 5, 8, 9, 33):
        xs = rng.standard_normal((rows, weight.in_dims)).astype(np.float32)
        got = KERNEL.times(xs, weight, 2, rows + 1, int8=True, wide=wide)  # in registers
        # x rounded as the C rounds it: the same numbers up to fp32 summation order...
        want = int8_reference(xs, weight, truth, wide)
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
        # ...within x's 8-bit (or 16-bit) rounding of the exact product...
        exact = xs.astype(np.float64) @ truth.T
        assert np.abs(got - exact).max() <= (1e-4 if wide else 2e-2) * np.abs(exact).max()
        # ...and each row the same bits as when it is multiplied alone, on one thread: a check's
        # logits are a step's
        for row in (0, rows - 1):
            alone = KERNEL.times(xs[row : row + 1], weight, 1, int8=True, wide=wide)
            assert np.array_equal(got[row], alone[0])
        # many rows (a prefill): integer activations through the tiles where they take the codes
        tiles = KERNEL.times(xs, weight, 2, 1, int8=True, wide=wide)
        takes = KERNEL.gemm_takes(weight, wide)  # full bytes on int8: where the CPU has VNNI
        assert takes or (bits == 8 and not wide)
        target = want if takes else exact
        assert np.abs(tiles - target).max() <= 1e-5 * np.abs(target).max()
        assert np.array_equal(tiles, KERNEL.times(xs, weight, 1, 1, int8=True, wide=wide))
        for row in (0, rows - 1):  # a row's bits do not depend on the rows beside it
            alone = KERNEL.times(xs[row : row + 1], weight, 2, 1, int8=True, wide=wide)
            assert np.array_equal(tiles[row], alone[0])


def test_int8_activations_take_codes_of_every_width_on_rows_long_enough_to_pay(monkeypatch):
    from mlxswitch.kernels import quant_cpu

    monkeypatch.setattr(quant_cpu, "INT8_MIN_INPUTS", 768)
    wide = [quant_cpu.int8_applies(_weight(8, 768, bits, 32)[0]) for bits in (2, 3, 4, 5, 6, 8)]
    assert wide == [True] * 6
    assert not quant_cpu.int8_applies(_weight(8, 576, 4, 32)[0])  # SmolLM2's rows: no gain there


def test_the_cpu_default_takes_int8_activations_and_exact_takes_fp32():
    from mlxswitch.kernels.route import route_for

    assert route_for("cpu", "auto", quant_kernel=True).quant_activations == "int8"
    assert route_for("cpu", "exact", quant_kernel=True).quant_activations == "fp32"
    assert route_for("cpu", "exact", quant_kernel=True).plain_linears == "quant-kernel"
    assert route_for("cpu", "auto", quant_kernel=False).quant_activations == "none"
    assert route_for("cpu", "fp32", quant_kernel=True).quant_activations == "none"
    assert route_for("metal", "auto", quant_kernel=True).quant_activations == "none"
    # fp16 scales with int8 activations; exact keeps the scales as loaded
    assert route_for("cpu", "auto", quant_kernel=True).quant_scales == "fp16"
    assert route_for("cpu", "exact", quant_kernel=True).quant_scales == "stored"
    assert route_for("cpu", "fp32", quant_kernel=True).quant_scales == "none"
    assert route_for("metal", "auto", quant_kernel=True).quant_scales == "none"


@needs_kernel
def test_the_cpu_default_holds_a_models_scales_as_fp16_and_its_lookups_stay_fp32():
    from tinymodels import llama_config, make_model

    from mlxswitch.models import row_routes

    ids = mx.array([[5, 17, 42, 7, 99, 3]])
    held = {}
    for kernels in ("exact", "auto"):
        resolve_route(kernels, "cpu")
        model = make_model(llama_config(vocab_size=300, tie=True), seed=5)
        nn.quantize(model, group_size=32, bits=4)
        mx.eval(model.parameters())
        stored = model.model.embed_tokens["scales"], model.model.embed_tokens["biases"]
        row_routes.use_fast_rows(model)
        layer, embed = model.model.layers[0].mlp.up_proj, model.model.embed_tokens
        held[kernels] = (layer["scales"].dtype, embed["scales"].dtype, layer.quant.weights[0].scale_type)
        looked_up = embed(ids)
        assert looked_up.dtype == mx.float32
        # the lookup is the narrowed W's rows, computed in fp32
        want = mx.dequantize(
            embed["weight"][ids],
            embed["scales"][ids].astype(mx.float32),
            embed["biases"][ids].astype(mx.float32),
            group_size=32,
            bits=4,
        )
        assert np.array_equal(np.array(looked_up), np.array(want))
        if kernels == "auto":  # each narrowed value is its fp32 one to fp16's 11 bits
            for narrowed, loaded in zip((embed["scales"], embed["biases"]), stored, strict=True):
                loaded_np = np.array(loaded)
                gap = np.abs(np.array(narrowed.astype(mx.float32)) - loaded_np)
                assert (gap <= 2.0**-11 * np.abs(loaded_np)).all()
    assert held["exact"] == (mx.float32, mx.float32, 0)
    assert held["auto"] == (mx.float16, mx.float16, 1)


def test_every_pass_a_decoding_round_makes_takes_the_int8_path():
    from mlxswitch.decoding.drafting import MAX_DRAFT
    from mlxswitch.kernels.quant_cpu import INT8_MAX_POSITIONS

    # a check of the longest draft is MAX_DRAFT + 1 positions: its logits must be computed as a step's
    assert INT8_MAX_POSITIONS >= MAX_DRAFT + 1


@needs_kernel
def test_a_sequence_gets_the_same_bits_alone_or_batched_and_a_prefill_takes_the_int8_tiles():
    from mlxswitch.kernels.quant_cpu import INT8_MAX_POSITIONS
    from mlxswitch.kernels.quant_linear import quant_matmul

    weight, truth = _weight(24, 320, 4, 64, seed=11)
    rng = np.random.default_rng(12)
    resolve_route("auto", "cpu")
    # three sequences of a check's length batched: each the bits it gets alone (int8)
    batch = rng.standard_normal((3, INT8_MAX_POSITIONS, 320)).astype(np.float32)
    together = np.array(quant_matmul(mx.array(batch), [weight]))
    for row in range(3):
        alone = np.array(quant_matmul(mx.array(batch[row : row + 1]), [weight]))
        assert np.array_equal(together[row], alone[0])
    assert not np.array_equal(together[0], KERNEL.times(batch[0], weight))  # int8, not fp32
    # a prefill (one more position a sequence) multiplies int8 activations through the tiles
    prompt = rng.standard_normal((1, INT8_MAX_POSITIONS + 1, 320)).astype(np.float32)
    prefill = np.array(quant_matmul(mx.array(prompt), [weight]))[0]
    assert np.array_equal(prefill, KERNEL.times(prompt[0], weight, 1, 1, int8=True))
    assert not np.array_equal(prefill, KERNEL.times(prompt[0], weight))  # not the fp32 panel


@needs_kernel
def test_a_down_projection_takes_no_int8_activations_and_the_others_do():
    from tinymodels import llama_config, make_model

    from mlxswitch.models import row_routes

    resolve_route("auto", "cpu")
    model = make_model(llama_config(vocab_size=300), seed=7)
    nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    assert row_routes.use_fast_rows(model) == "quant-kernel"
    mlp = model.model.layers[0].mlp
    assert not mlp.down_proj.int8_inputs and mlp.gate_proj.int8_inputs and mlp.up_proj.int8_inputs
    x = mx.random.normal((1, 3, mlp.down_proj.quant.weights[0].in_dims), key=mx.random.key(1))
    x_in = mx.random.normal((1, 3, mlp.gate_proj.quant.weights[0].in_dims), key=mx.random.key(2))
    down, gate = np.array(mlp.down_proj(x)), np.array(mlp.gate_proj(x_in))
    rows_in = np.array(x)[0]
    int8_down = KERNEL.times(rows_in, mlp.down_proj.quant.weights[0], 2, int8=True)
    int16_down = KERNEL.times(rows_in, mlp.down_proj.quant.weights[0], 2, int8=True, wide=True)
    assert np.array_equal(down[0], int16_down) and not np.array_equal(down[0], int8_down)
    resolve_route("exact", "cpu")
    assert not np.array_equal(down, np.array(mlp.down_proj(x)))  # fp32 activations on exact
    assert not np.array_equal(gate, np.array(mlp.gate_proj(x_in)))  # int8 on the default


@needs_kernel
def test_rows_too_narrow_for_int8_take_int16_and_a_model_nested_into_gears_keeps_every_mark(monkeypatch):
    # SmolLM2's 576-wide rows moved its argmax on int8 and kept fp32's on int16 (quant_cpu.py):
    # a layer narrower than INT8_MIN_INPUTS is marked as a down projection is, on its own load and
    # again once gears replace its linears (they were not: a geared down projection took int8).
    from tinymodels import llama_config, make_model

    from mlxswitch.kernels import quant_cpu
    from mlxswitch.models import row_routes, rows
    from mlxswitch.models.gear_files import prepare_geared
    from mlxswitch.models.weights import LoadedModel

    resolve_route("auto", "cpu")
    assert not quant_cpu.int8_inputs("model.layers.0.self_attn.q_proj", quant_cpu.INT8_MIN_INPUTS - 1)
    assert quant_cpu.int8_inputs("model.layers.0.self_attn.q_proj", quant_cpu.INT8_MIN_INPUTS)
    assert not quant_cpu.int8_inputs("model.layers.0.mlp.down_proj", quant_cpu.INT8_MIN_INPUTS)

    def loaded() -> LoadedModel:
        model = make_model(llama_config(vocab_size=300), seed=7)  # rows of 64 (q..up) and 128 (down)
        nn.quantize(model, group_size=32, bits=4)
        mx.eval(model.parameters())
        row_routes.use_fast_rows(model)
        return LoadedModel("tiny", "tiny", model, None, {})

    def marks(model: nn.Module) -> dict[str, bool]:
        return {
            name.rsplit(".", 1)[-1]: module.int8_inputs
            for name, module in model.named_modules()
            if name.startswith("model.layers.0.") and hasattr(module, "int8_inputs")
        }

    wide_rows = {"q_proj": False, "k_proj": False, "v_proj": False, "o_proj": False, "gate_proj": False,
                 "up_proj": False, "down_proj": False}  # fmt: skip
    int8_rows = {**{name: True for name in wide_rows}, "down_proj": False}
    assert marks(prepare_geared(loaded(), (4, 8)).model) == int8_rows  # the fixture: int8 from 32
    monkeypatch.setattr(quant_cpu, "INT8_MIN_INPUTS", 96)  # 64-wide rows are too narrow now
    plain = loaded()
    assert marks(plain.model) == wide_rows
    q_proj = plain.model.model.layers[0].self_attn.q_proj
    assert isinstance(q_proj, rows.TiledLinear)  # int16 rows on tiles, not fp32 on the panel
    x = mx.random.normal((1, 3, 64), key=mx.random.key(3))
    weight = q_proj.quant.weights[0]
    int16 = KERNEL.times(np.array(x)[0], weight, 2, int8=True, wide=True)
    assert np.array_equal(np.array(q_proj(x))[0], int16)
    assert marks(prepare_geared(loaded(), (4, 8)).model) == wide_rows


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])
def test_a_down_projection_takes_int16_activations_on_4_bit_codes_and_fp32_on_wider_ones(bits):
    from mlxswitch.kernels.quant_check import int8_reference
    from mlxswitch.kernels.quant_cpu import INT8_MIN_INPUTS
    from mlxswitch.kernels.quant_linear import quant_matmul

    weight, truth = _weight(24, INT8_MIN_INPUTS + 32, bits, 32, seed=13)
    rng = np.random.default_rng(14)
    xs = rng.standard_normal((3, weight.in_dims)).astype(np.float32)
    xs[:, 5] *= 300  # a massive activation, as a down projection's inputs hold
    resolve_route("auto", "cpu")
    down = np.array(quant_matmul(mx.array(xs[None]), [weight], int8_inputs=False))[0]
    exact = xs.astype(np.float64) @ truth.T
    if bits == 4:
        want = int8_reference(xs, weight, truth, wide=True)
        assert np.abs(down - want).max() <= 1e-5 * np.abs(want).max()
        assert np.abs(down - exact).max() <= 1e-4 * np.abs(exact).max()
        int8 = KERNEL.times(xs, weight, 2, int8=True)  # what int8 would have lost
        assert np.abs(int8 - exact).max() > 10 * np.abs(down - exact).max()
    else:
        assert np.array_equal(down, KERNEL.times(xs, weight, 2, xs.shape[0] + 1))  # fp32 activations


@needs_kernel
@pytest.mark.parametrize("kernels", ["auto", "exact"])
def test_a_check_gets_the_bits_of_the_steps_it_replaces(kernels):
    from mlx_lm.models.cache import make_prompt_cache
    from tinymodels import llama_config, make_model

    from mlxswitch.models import row_routes

    resolve_route(kernels, "cpu")
    model = make_model(llama_config(vocab_size=300), seed=8)
    nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    row_routes.use_fast_rows(model)  # int8 activations and fp32 ones (a down projection) both in play
    prompt, drafted = mx.array([[5, 17, 42, 7, 99, 3]]), [11, 250, 8, 63, 1, 77, 140, 9, 2, 31, 12, 6, 4]
    stepped = make_prompt_cache(model)
    model(prompt, cache=stepped)
    steps = [np.array(model(mx.array([[token]]), cache=stepped))[0, -1] for token in drafted]
    checked = make_prompt_cache(model)
    model(prompt, cache=checked)
    check = np.array(model(mx.array([drafted]), cache=checked))[0]  # 13 rows: past the panel's 12
    for position, step in enumerate(steps):
        assert np.array_equal(check[position], step), position


@needs_kernel
def test_weights_reading_the_same_rows_multiply_together_with_the_bits_of_a_call_each(monkeypatch):
    from mlxswitch.kernels.quant_packs import times_together, weight_pack

    # a block's q, k and v shapes in small: 4-bit, a byte a code (5-bit), full bytes, mixed scales,
    # and a second 4-bit weight of the first one's groups
    weights = [
        _weight(40, 256, 4, 32, seed=1)[0],
        _weight(9, 256, 5, 64, seed=2, scale_dtype=mx.float16)[0],
        _weight(17, 256, 8, 32, seed=3, scale_dtype=mx.bfloat16)[0],
        _weight(11, 256, 4, 32, seed=5, scale_dtype=mx.float16)[0],  # rows rounded as for the first
    ]
    pack = weight_pack(weights)
    assert pack is not None and pack.ends == (40, 49, 66, 77)
    rng = np.random.default_rng(4)
    for rows in (1, 3, 6):  # 6: past the int8 path's group of 4 rows
        xs = rng.standard_normal((rows, 256)).astype(np.float32)
        want = np.concatenate([KERNEL.times(xs, w, 2, int8=True) for w in weights], axis=1)
        for threads in (1, 2):
            assert np.array_equal(times_together(KERNEL, xs, pack, threads), want), (rows, threads)
    # another input width, a single weight, or a weight the int8 path does not take: no pack
    assert weight_pack([weights[0], _weight(8, 128, 4, 32)[0]]) is None
    assert weight_pack(weights[:1]) is None
    monkeypatch.setattr(quant_cpu, "INT8_MIN_INPUTS", 512)  # rows of 256 inputs keep fp32 now
    assert weight_pack(weights) is None


@needs_kernel
def test_a_block_multiplies_its_projections_together_and_gets_a_call_eachs_logits(monkeypatch):
    from mlx_lm.models.cache import make_prompt_cache
    from tinymodels import llama_config, make_model

    from mlxswitch.kernels import quant_linear
    from mlxswitch.models import cpu_blocks, row_routes

    resolve_route("auto", "cpu")
    model = make_model(llama_config(vocab_size=300), seed=9)
    nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    row_routes.use_fast_rows(model)
    calls = []
    real = quant_linear.numpy_quant_rows_together
    monkeypatch.setattr(cpu_blocks, "numpy_quant_rows_together", lambda *a: calls.append(1) or real(*a))

    def logits() -> np.ndarray:
        cache = make_prompt_cache(model)
        model(mx.array([[5, 17, 42, 7]]), cache=cache)
        return np.array(model(mx.array([[11, 250, 8]]), cache=cache))

    together = logits()
    layers = len(model.model.layers)
    # q, k, v together and gate, up together in every block, on both passes (4 and 3 positions)
    assert len(calls) == 4 * layers
    monkeypatch.setattr(cpu_blocks, "weight_pack", lambda weights: None)  # a call each
    for layer in model.model.layers:
        layer.self_attn.weight_pack = layer.mlp.weight_pack = None
    assert np.array_equal(logits(), together)
    assert len(calls) == 4 * layers


@needs_kernel
def test_a_build_without_avx2_has_no_integer_paths_and_passes_its_check_on_fp32_rows():
    # the C's portable vector code (x86-64's baseline here; ARM elsewhere): no int8 or int16 path,
    # so every product, asked for integer activations or not, is the exact one
    built = cbuild.compile_source(quant_cpu.SOURCE, (("-O3", "-pthread"),))
    assert not isinstance(built, str), built
    kernel = quant_cpu.QuantKernel(built.library, built.flags)
    if kernel.integer_paths:
        pytest.skip("this compiler's default target has AVX2")
    assert check_kernel(kernel) is None
    weight, truth = _weight(19, 320, 4, 32, seed=4)
    xs = np.random.default_rng(5).standard_normal((13, 320)).astype(np.float32)
    exact = xs.astype(np.float64) @ truth.T
    for many_from in (1 << 30, 1):
        got = kernel.times(xs, weight, 2, many_from, int8=True)
        assert np.abs(got - exact).max() <= 1e-5 * np.abs(exact).max()


@needs_kernel
@pytest.mark.skipif(KERNEL is None or not KERNEL.tiled, reason="this machine runs no tiled build")
def test_an_avx2_build_tiles_what_it_sums_exactly_and_gives_rows_the_avx512_builds_bits():
    # an AVX2 machine's kernel (two 256-bit halves a tile run, maddubs for VNNI's byte products):
    # it passes its check, tiles 4-bit and narrow byte codes but not full bytes (maddubs' int16
    # pairs would saturate), and where both builds tile a weight they give every row one sum
    built = cbuild.compile_source(quant_cpu.SOURCE, (("-O3", "-mavx2", "-mfma", "-mf16c", "-pthread"),))
    assert not isinstance(built, str), built
    avx2 = quant_cpu.QuantKernel(built.library, built.flags)
    assert avx2.tiled and check_kernel(avx2) is None
    rng = np.random.default_rng(9)
    narrow = quant_check._random_weight(rng, 48, 320, 5, 32)[0]
    full = quant_check._random_weight(rng, 48, 320, 8, 32)[0]
    assert avx2.tiles(narrow) and not avx2.tiles(full)
    assert avx2.layout_traits == (True, True, False)  # a layout cache's key tells the two builds apart
    four = quant_check._random_weight(rng, 48, 320, 4, 32, mx.float16)[0]
    cases = [(w, tiled_weight(avx2, w), wide) for w, wide in ((four, False), (four, True), (narrow, False))]
    blocks = QuantWeight.from_q6k(mx.array(_q6k_blocks(32, 512)), 512)
    cases += [(blocks, tiled_q6k_weight(avx2, blocks), wide) for wide in (False, True)]
    for stored, weight, wide in cases:
        assert KERNEL.tiles(stored, wide) or stored.layout == Q6K  # this machine's build tiles it too
        for rows in (1, 3, 4, 5, 9):
            xs = rng.standard_normal((rows, weight.in_dims)).astype(np.float32)
            got = avx2.times(xs, weight, 2, int8=True, wide=wide)
            assert np.array_equal(got, KERNEL.times(xs, weight, 1, int8=True, wide=wide)), (rows, wide)


@needs_kernel
def test_an_answers_catch_up_gets_the_bits_of_the_steps_it_replaces():
    """A tier catching up on more of the answer's ids than a decoding pass takes (a routed answer's
    strong tier after a run of the weak one's tokens) computes them as steps would: its next row is
    the steps' bit for bit, however the answer's passes were planned. A prefill chunk's path (what
    a catch-up took before, and a prompt still takes) gives other bits."""
    from tinymodels import llama_config, make_model

    from mlxswitch.decoding.tiers import CacheGroup
    from mlxswitch.kernels.quant_cpu import INT8_MAX_POSITIONS
    from mlxswitch.models import row_routes
    from mlxswitch.models.weights import LoadedModel

    resolve_route("auto", "cpu")
    model = make_model(llama_config(vocab_size=300), seed=8)
    nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    row_routes.use_fast_rows(model)
    loaded = LoadedModel("tiny", "tiny", model, None, {"vocab_size": 300})
    prompt = [5, 17, 42, 7, 99, 3]
    answer = [(7 * i + 11) % 300 for i in range(INT8_MAX_POSITIONS + 12)]

    def last_row(answer_from: int | None, at_once: bool) -> np.ndarray:
        group = CacheGroup(loaded, "tiny", answer_from=answer_from)
        group.score(mx.array(prompt), 1, None, 512)
        pieces = [answer] if at_once else [[token] for token in answer]
        for piece in pieces:
            row = group.score(mx.array(piece), 1, None, 512)
        assert group.seen == len(prompt) + len(answer)
        return np.array(row)

    stepped = last_row(len(prompt), at_once=False)
    assert np.array_equal(last_row(len(prompt), at_once=True), stepped)
    assert not np.array_equal(last_row(None, at_once=True), stepped)  # no answer known: a prefill chunk
