"""A decoding pass's small operations between its quantized products, in C (pass_ops.c).

Why our own: a decoding pass's block (models/cpu_blocks.py) ran RMSNorm, RoPE, attention a query
at a time and silu(gate)·up as NumPy operations of a few microseconds each: ~1,500 of them in a
Qwen 1.5B step, ~8 ms of ~80, and ~20 ms of an 8-row check. Here each is one call for the pass's
rows. RMSNorm and RoPE give NumPy's bits (the same float operations in the same order: its
pairwise sum included); attention and silu take their own exponential and summation order. Each
row is computed alone in one order, so a check's rows keep a step's bits.

Life cycle as the quantized kernel's: compiled on first use into the per-machine kernel cache
(cbuild.py), checked against float64 NumPy before a model runs on it (a pass kept beside the
library), and where it cannot be built or fails, `pass_ops()` is None and the blocks keep NumPy
(`mlxswitch doctor` says why: the route's `pass_ops`).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from .cbuild import build_checked
from .signals_numpy import numpy_token_signals

SOURCE = Path(__file__).with_name("pass_ops.c")
# -ffp-contract=off: no multiply-add fused where NumPy rounds twice (RMSNorm and RoPE keep its bits).
COMPILE_FLAGS = (
    ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno"),
    ("-O3", "-ffp-contract=off", "-fno-math-errno"),
)
MOST_GROUP = 16  # query heads a key head may serve (pass_ops.c)

_P, _L = ctypes.c_void_p, ctypes.c_long


class Product(ctypes.Structure):
    """One product of a block (pass_ops.c's struct product): tiled weights' fields (`count` of
    them, quant_rows.c's quant_tiled_rows; a nested gear's planes one plane after another) or Q6_K
    tiles (quant_tiled_q6k), and a bias or NULL."""

    _fields_ = [
        ("weights", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("count", ctypes.c_long),
        ("n_in", ctypes.c_long),
        ("n_out", ctypes.c_long),
        ("q6k", ctypes.c_int),
        ("wide", ctypes.c_int),
        ("planes", ctypes.c_long),  # a nested gear's active planes, summed (1: a plain linear)
    ]


class BlockPlan(ctypes.Structure):
    """A decoder block as block_rows reads it (pass_ops.c's struct block_plan): its four products,
    norms, attention's shape and the quantized kernel's entry points (its products; its threads,
    which attention shares). Whoever makes one keeps the arrays it points to alive
    (cpu_blocks.block_plan)."""

    _fields_ = [
        ("qkv", Product),
        ("o", Product),
        ("gate_up", Product),
        ("down", Product),
        ("norm1", ctypes.c_void_p),
        ("norm2", ctypes.c_void_p),
        ("eps1", ctypes.c_float),
        ("eps2", ctypes.c_float),
        ("scale", ctypes.c_float),
        ("dims", ctypes.c_long),
        ("inter", ctypes.c_long),
        ("heads", ctypes.c_long),
        ("kv_heads", ctypes.c_long),
        ("head_dim", ctypes.c_long),
        ("rope_dims", ctypes.c_long),
        ("traditional", ctypes.c_int),
        ("tiled", ctypes.c_void_p),
        ("q6k", ctypes.c_void_p),
        ("run_parts", ctypes.c_void_p),  # quant_run_parts (attention on the products' threads), or None
    ]


def _seen_bounds(seen: list[slice]) -> tuple[np.ndarray, np.ndarray]:
    """The first and past-the-last key each row sees, as the C functions read them (int64)."""
    starts = np.array([s.start for s in seen], dtype=np.int64)
    return starts, np.array([s.stop for s in seen], dtype=np.int64)


def _strides(array: np.ndarray) -> list[int]:
    """An fp32 array's strides in elements."""
    return [stride // 4 for stride in array.strides]


class PassOps:
    """The compiled pass_ops.c, on fp32 NumPy arrays."""

    def __init__(self, library: ctypes.CDLL):
        self._library = library  # kept: the functions below live in it
        self._norm = library.rms_norm_rows
        self._norm.argtypes = [_P, _P, ctypes.c_float, _P, _L, _L]
        self._rope = library.rope_rows
        self._rope.argtypes = [_P, _L, _L, _L, _L, _L, _L, _L, _L, ctypes.c_int, _P, _P, _L, _P]
        self._attend = library.attend_rows
        self._attend.argtypes = [_P, _L, _L, _L, _P, _P, *[_L] * 8, _P, _P, ctypes.c_float, _P]
        self._silu = library.silu_times_rows
        self._silu.argtypes = [_P, _P, _L, _L, _L, _P]
        self._blocks = library.blocks_rows
        self._blocks.argtypes = [_P, _L, _P, _L, _P, _P, _P, _P, _P, _P, _P, _L, _P, _P, ctypes.c_int]
        self._signals = library.token_signals_rows
        self._signals.argtypes = [_P, _L, _L, _P]
        for function in (self._norm, self._rope, self._attend, self._silu, self._blocks, self._signals):
            function.restype = ctypes.c_int

    def rms_norm(self, rows: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        """rows / sqrt(mean(rows²) + eps) · weight for fp32 rows (N × dims): nn.RMSNorm's values
        with NumPy's bits."""
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        out = np.empty_like(rows)
        if self._norm(rows.ctypes.data, weight.ctypes.data, eps, out.ctypes.data, *rows.shape) < 1:
            raise MemoryError("pass_ops could not get its scratch memory")
        return out

    def rope(
        self, x: np.ndarray, dims: int, traditional: bool, cos: np.ndarray, sin: np.ndarray
    ) -> np.ndarray:
        """x (B × H × L × D, fp32, D contiguous) rotated as nn.RoPE (its first `dims` dims) at the
        angles of the tables (1 or B × 1 × L × dims/2, contiguous), as a new contiguous array."""
        batch, heads, length, dim = x.shape
        if x.strides[3] != 4:
            x = np.ascontiguousarray(x)
        out = np.empty((batch, heads, length, dim), dtype=np.float32)
        table_stride = 0 if cos.shape[0] == 1 else cos.strides[0] // 4
        self._rope(
            x.ctypes.data, *_strides(x)[:3], batch, heads, length, dim, dims, int(traditional),
            cos.ctypes.data, sin.ctypes.data, table_stride, out.ctypes.data,
        )  # fmt: skip
        return out

    def attend(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, seen: list[slice], scale: float
    ) -> np.ndarray | None:
        """softmax(q·kᵀ·scale)·v for q (B × H × L × D) and k, v (B × KV × T × D, one layout), query
        (b, l) over the keys seen[b·L + l]; None where the kernel refuses the shapes (a head dim
        not a multiple of 16, more than MOST_GROUP query heads a key head)."""
        batch, heads, length, dim = q.shape
        if q.strides[3] != 4:
            q = np.ascontiguousarray(q)
        if k.strides != v.strides or k.strides[3] != 4:  # one layout for both, D contiguous
            k, v = np.ascontiguousarray(k), np.ascontiguousarray(v)
        seen_from, seen_to = _seen_bounds(seen)
        out = np.empty((batch, heads, length, dim), dtype=np.float32)
        done = self._attend(
            q.ctypes.data, *_strides(q)[:3], k.ctypes.data, v.ctypes.data, *_strides(k)[:3],
            batch, heads, k.shape[1], length, dim, seen_from.ctypes.data, seen_to.ctypes.data,
            scale, out.ctypes.data,
        )  # fmt: skip
        return out if done >= 1 else None

    def blocks(
        self,
        plans: list[BlockPlan],
        h: np.ndarray,
        tables: tuple[np.ndarray, np.ndarray],
        caches: list[list[tuple[np.ndarray, np.ndarray]]],
        starts: list[int],
        lengths: list[int],
        seen: list[slice],
        threads: int,
    ) -> bool:
        """h's rows through every block of a model body in turn, one call a pass: the rows of
        len(starts) sequences one after another (sequence s's lengths[s] rows at its positions
        starts[s]..; several where a pass is packed), caches[i][s] layer i's keys and values of
        sequence s, this pass's written at starts[s]. False where a block refused (h is then
        unusable)."""
        count, sequences = len(plans), len(starts)
        plan_at = (ctypes.c_void_p * count)(*(ctypes.addressof(plan) for plan in plans))
        rooms = [room for layer in caches for room in layer]  # layer-major, as blocks_rows reads them
        keys_at = (ctypes.c_void_p * len(rooms))(*(keys.ctypes.data for keys, _ in rooms))
        values_at = (ctypes.c_void_p * len(rooms))(*(values.ctypes.data for _, values in rooms))
        caps = np.array([keys.shape[2] for keys, _ in rooms], dtype=np.int64)
        starts_at, lengths_at = (np.array(a, dtype=np.int64) for a in (starts, lengths))
        seen_from, seen_to = _seen_bounds(seen)
        done = self._blocks(
            plan_at, count, h.ctypes.data, h.shape[0], tables[0].ctypes.data, tables[1].ctypes.data,
            keys_at, values_at, caps.ctypes.data, starts_at.ctypes.data, lengths_at.ctypes.data, sequences,
            seen_from.ctypes.data, seen_to.ctypes.data, threads,
        )  # fmt: skip
        return done >= 1

    def token_signals(self, rows: np.ndarray) -> np.ndarray:
        """[entropy bits, varentropy bits², p1 − p2] of each fp32 logits row (N × V), as N × 3 fp32:
        signals_numpy.numpy_token_signals's values (NaN where it gives NaN), in two passes a row."""
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        out = np.empty((rows.shape[0], 3), dtype=np.float32)
        self._signals(rows.ctypes.data, rows.shape[0], rows.shape[1], out.ctypes.data)
        return out

    def silu_times(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        """silu(gate)·up for fp32 rows (N × n) whose rows lie one stride apart in both (gate and up
        may be column views of one product), as a new contiguous array."""
        rows, n = gate.shape
        if gate.strides != up.strides or gate.strides[1] != 4:
            gate, up = np.ascontiguousarray(gate), np.ascontiguousarray(up)
        out = np.empty((rows, n), dtype=np.float32)
        self._silu(gate.ctypes.data, up.ctypes.data, gate.strides[0] // 4, rows, n, out.ctypes.data)
        return out


@dataclass(frozen=True)
class PassOpsBuild:
    """What building the operations gave: them, or None and why not (for `mlxswitch doctor`)."""

    ops: PassOps | None
    detail: str


def _differs(got: np.ndarray | None, want: np.ndarray, tolerance: float = 1e-5) -> bool:
    """Whether got is missing or off float64 `want` by more than fp32 rounding."""
    if got is None or got.shape != want.shape:
        return True
    return not np.allclose(got, want, rtol=tolerance, atol=tolerance)


def check_ops(ops: PassOps) -> str | None:
    """None when every operation equals a float64 NumPy reference within fp32 rounding on odd
    shapes, and RMSNorm and RoPE equal NumPy's fp32 bits; else what differed."""
    rng = np.random.default_rng(0)
    for rows, dims in ((1, 7), (3, 129), (2, 1000)):
        x = (rng.standard_normal((rows, dims)) * 4).astype(np.float32)
        weight = rng.standard_normal(dims).astype(np.float32)
        mean_square = np.add.reduce(np.square(x), axis=-1, keepdims=True) / np.float32(dims)
        numpy_norm = x / np.sqrt(mean_square + np.float32(1e-5)) * weight
        if not np.array_equal(ops.rms_norm(x, weight, 1e-5), numpy_norm):
            return f"RMSNorm of {rows} × {dims} differed from NumPy's bits"
    for traditional in (False, True):
        x = rng.standard_normal((2, 3, 5, 32)).astype(np.float32)
        angles = rng.uniform(-3, 3, (2, 1, 5, 12))
        cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
        first, second = (slice(0, 24, 2), slice(1, 24, 2)) if traditional else (slice(0, 12), slice(12, 24))
        want = x.copy()
        want[..., first] = x[..., first] * cos - x[..., second] * sin
        want[..., second] = x[..., first] * sin + x[..., second] * cos
        if not np.array_equal(ops.rope(x, 24, traditional, cos, sin), want):
            return "RoPE differed from NumPy's bits"
    q = rng.standard_normal((2, 6, 3, 32)).astype(np.float32)
    k, v = (rng.standard_normal((2, 2, 9, 32)).astype(np.float32) for _ in range(2))
    seen = [slice(0, 7), slice(0, 8), slice(2, 9), slice(0, 1), slice(4, 6), slice(0, 9)]
    got = ops.attend(q, k, v, seen, 0.3)
    want = np.empty(q.shape, dtype=np.float64)
    for b in range(2):
        for h in range(6):
            for i in range(3):
                keys = k[b, h // 3, seen[b * 3 + i]].astype(np.float64)
                scores = keys @ q[b, h, i].astype(np.float64) * 0.3
                weights = np.exp(scores - scores.max())
                want[b, h, i] = weights @ v[b, h // 3, seen[b * 3 + i]] / weights.sum()
    if _differs(got, want):
        return "attention differed from a float64 product"
    gate_up = (rng.standard_normal((3, 2 * 37)) * 6).astype(np.float32)
    gate, up = gate_up[:, :37].astype(np.float64), gate_up[:, 37:].astype(np.float64)
    if _differs(ops.silu_times(gate_up[:, :37], gate_up[:, 37:]), gate / (1 + np.exp(-gate)) * up):
        return "silu(gate)·up differed from float64"
    return _signals_differ(ops, rng)


def _signals_differ(ops: PassOps, rng: np.random.Generator) -> str | None:
    """None where the token signals equal float64 NumPy's (signals_numpy.numpy_token_signals) within
    fp32 rounding on odd widths, masked, tied, flat and broken rows; else what differed."""
    logits = (rng.standard_normal((7, 4133)) * 3).astype(np.float32)
    logits[1, ::3] = -np.inf  # masked tokens
    logits[2, [5, 900]] = 40.0  # a tie for the largest: margin 0
    logits[3] = 0.5  # flat: the most uncertain
    logits[4, 17] = np.nan  # broken: NaN
    logits[5] = -np.inf  # fully masked: NaN
    logits[6, 4000] = 200.0  # near certain: every other e^d is 0
    got, want = ops.token_signals(logits), numpy_token_signals(logits, np.float64)
    if got.shape != want.shape or not np.array_equal(np.isnan(got), np.isnan(want)):
        return "the token signals' NaNs differed from NumPy's"
    finite = ~np.isnan(want)
    if not np.allclose(got[finite], want[finite], rtol=1e-5, atol=1e-6):
        return "the token signals differed from float64 NumPy's"
    return None


@cache
def build_pass_ops() -> PassOpsBuild:
    """Compile (or load from the per-machine cache), load and check the operations once a process."""
    made = build_checked(SOURCE, COMPILE_FLAGS, lambda built: PassOps(built.library), check_ops, CHECKED_BY)
    if isinstance(made, str):
        return PassOpsBuild(None, made)
    ops, built = made
    return PassOpsBuild(ops, built.detail(True, "float64 and NumPy", pool="one thread"))


CHECKED_BY = (Path(__file__),)  # the check and the library's Python face


def pass_ops() -> PassOps | None:
    """The checked operations, or None where they could not be built (see build_pass_ops)."""
    return build_pass_ops().ops
