"""Attention and the gated MLP on the CPU's eager route: NumPy where MLX's CPU ops are slow.

Why our own: on MLX's CPU backend `mx.fast.scaled_dot_product_attention` ran at ~2 GFLOP/s (a
512-token prefill chunk of the Qwen 1.5B spent ~0.76 s a layer in it, a decoding step at a
500-token context ~2 ms a layer) and `silu(g)·u` over 8,960 values took 0.31 ms a row (NumPy:
0.03). NumPy's BLAS and vectorised exp do the same work many times faster. Only the layouts of
mlx-lm's llama and qwen2 blocks are taken (their __call__ is followed step for step); the
linears, RoPE and the KV cache stay theirs (a plain cache made by decoding_caches also keeps a
decoding pass's keys and values in NumPy, numpy_cache.py). Where evaluation is refused
(mx.compile) or the cache is not a plain one (a quantized KV cache), MLX's own code runs.
"""

from __future__ import annotations

import contextlib
import ctypes
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models import llama, qwen2
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from ..kernels._common import single_threaded_blas
from ..kernels.pass_ops import BlockPlan, PassOps, Product, pass_ops
from ..kernels.quant_cpu import INT8_MAX_POSITIONS, quant_kernel
from ..kernels.quant_linear import bias_row, numpy_quant_rows_together
from ..kernels.quant_packs import weight_pack
from ..kernels.quant_weights import Q6K_TILED, TILED
from ..kernels.route import current_route
from .numpy_attention import SMALL_QUERIES, attention_rows, evaluated, numpy_attention, visible_ranges
from .numpy_cache import NumpyKVCache

# The block classes whose __call__ the subclasses below follow step for step.
ATTENTION_CLASSES = (llama.Attention, qwen2.Attention)
MLP_CLASSES = (llama.MLP, qwen2.MLP)
BLOCK_CLASSES = (llama.TransformerBlock, qwen2.TransformerBlock)
BODY_CLASSES = (llama.LlamaModel, qwen2.Qwen2Model)


def _silu_times(gate: np.ndarray, up: np.ndarray, ops: PassOps | None = None) -> np.ndarray:
    """silu(gate)·up, the gated MLP's activation, as a new contiguous array (gate and up may be
    column views of one product: the down projection then reads it without another copy); by the
    compiled pass operations where given (a decoding pass's)."""
    if ops is not None:
        return ops.silu_times(gate, up)
    # Through one array, not four temporaries: a prefill chunk's 512 × 8,960 values a layer.
    with np.errstate(over="ignore"):  # exp(-g) overflows to inf for g ≪ 0: silu is then -0
        out = np.negative(gate)
        np.exp(out, out=out)
        out += 1
        np.divide(gate, out, out=out)
        out *= up
        return out


class NumpyAttention(nn.Module):
    """mlx-lm's llama/qwen2 attention, its scaled dot product in NumPy (module docstring)."""

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        """The mlx-lm block's steps; only the attention product is NumPy's."""
        if cache is not None and hasattr(cache, "bits"):  # a quantized KV cache: mlx-lm's own
            return super().__call__(x, mask=mask, cache=cache)
        batch, length, _ = x.shape
        queries, keys, values = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        queries = queries.reshape(batch, length, self.n_heads, -1).transpose(0, 2, 1, 3)
        keys = keys.reshape(batch, length, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        values = values.reshape(batch, length, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        if cache is not None:
            queries = self.rope(queries, offset=cache.offset)
            keys = self.rope(keys, offset=cache.offset)
            keys, values = cache.update_and_fetch(keys, values)
        else:
            queries = self.rope(queries)
            keys = self.rope(keys)
        output = numpy_attention(queries, keys, values, self.scale, mask)
        if output is None:
            output = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=self.scale, mask=mask)
        output = output.astype(x.dtype).transpose(0, 2, 1, 3).reshape(batch, length, -1)
        return self.o_proj(output)


class NumpyMLP(nn.Module):
    """mlx-lm's llama/qwen2 MLP, down(silu(gate(x))·up(x)), its activation in NumPy."""

    def __call__(self, x: mx.array) -> mx.array:
        """down(silu(gate)·up), silu·up computed in NumPy on the evaluated projections."""
        gate, up = self.gate_proj(x), self.up_proj(x)
        views = evaluated(gate, up)
        if views is None:
            return super().__call__(x)
        return self.down_proj(mx.array(_silu_times(views[0], views[1])).astype(x.dtype))


class NumpyBlock(nn.Module):
    """mlx-lm's llama/qwen2 decoder block whose passes run in NumPy (numpy_block)."""

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        """The block's output: numpy_block's where it takes the pass, else mlx-lm's."""
        out = numpy_block(self, x, mask, cache)
        return super().__call__(x, mask, cache) if out is None else out


class NumpyBody(nn.Module):
    """mlx-lm's llama/qwen2 model body whose decoding pass of one sequence runs all its blocks in
    one call of the pass operations (PassOps.blocks) where each block has a plan; else its own
    (each block then numpy_block's way)."""

    def __call__(self, inputs: mx.array, cache: Any = None, input_embeddings: Any = None) -> mx.array:
        """The body's hidden states, as mlx-lm's __call__ gives them."""
        out = _body_in_one_call(self, inputs, cache, input_embeddings)
        if out is None:
            out = super().__call__(inputs, cache=cache, input_embeddings=input_embeddings)
        return out


def _body_in_one_call(body: Any, inputs: mx.array, cache: Any, input_embeddings: Any) -> mx.array | None:
    """One sequence's decoding pass through every block in one call (PassOps.blocks: each block as
    _block_in_one_call makes it, the same bits), then the body's norm; None where a block has no
    plan, a cache is not a NumpyKVCache, or the body is not mlx-lm's plain one (pipelined,
    sliding windows, given embeddings)."""
    if input_embeddings is not None or cache is None or inputs.ndim != 2 or inputs.shape[0] != 1:
        return None
    length, layers = inputs.shape[1], body.layers
    if length > INT8_MAX_POSITIONS or current_route().pass_ops != "compiled" or len(cache) != len(layers):
        return None
    if getattr(body, "pipeline_size", 1) != 1 or getattr(body, "swa_idx", None) is not None:
        return None
    ops = pass_ops()
    if ops is None or not all(isinstance(c, NumpyKVCache) for c in cache):
        return None
    found = [_block_plan(layer) if isinstance(layer, NumpyBlock) else None for layer in layers]
    plans = [kept for kept in found if kept is not None]
    ropes = {(a.rope.dims, a.rope.base, a.rope.scale) for a in (layer.self_attn for layer in layers)}
    start = cache[0].offset
    if len(plans) != len(layers) or len(ropes) != 1 or any(c.offset != start for c in cache):
        return None
    h = body.embed_tokens(inputs)
    try:
        mx.eval(h)
    except ValueError:  # under mx.compile, vmap or export: no evaluation
        return None
    mask = create_attention_mask(h, cache[0])
    seen = visible_ranges(mask, 1, length, start + length)
    if h.dtype != mx.float32 or seen is None:
        return None
    rope = layers[0].self_attn.rope
    cos, sin = _rope_tables(rope, np.asarray(start, dtype=np.float64).reshape(-1), length)
    rows = np.array(np.asarray(h).reshape(length, -1))  # a copy: the blocks write it in place
    room = []
    for kept, layer_cache in zip(plans, cache, strict=True):
        shape = (1, kept.plan.kv_heads, length, kept.plan.head_dim)
        keys, values, _ = layer_cache.reserve_rows(shape, shape)
        room.append((keys, values))
    tables = (cos.reshape(length, -1), sin.reshape(length, -1))
    threads = current_route().blas_threads
    if not ops.blocks([kept.plan for kept in plans], rows, tables, room, start, seen, threads):
        return None  # nothing committed: mlx-lm's body computes the pass again
    for layer_cache in cache:
        layer_cache.commit_rows(start + length)
    return body.norm(mx.array(rows.reshape(1, length, -1)))


def numpy_block(block: Any, x: mx.array, mask: Any, cache: Any) -> mx.array | None:
    """One decoder block on a pass's rows (fp32) with no MLX evaluation where the cache is a
    NumpyKVCache (else one, where mlx-lm's block made six: each evaluation of a small graph costs
    ~0.13 ms on MLX's CPU backend, and a prefill's rows went to NumPy and back at each linear).
    The norms, residuals, linears (their `numpy_rows`), RoPE (nn.RoPE's) and attention run in
    NumPy; a scaled RoPE stays the model's, and a cache of mlx-lm's own its own. A decoding pass
    (≤ INT8_MAX_POSITIONS a sequence) computes each row as a step would; a longer one (a
    prefill chunk) by the kernel's many-row paths and attention a block of queries at a time. None where
    the pass cannot (another dtype, a quantized cache, another layout, under mx.compile):
    mlx-lm's block runs."""
    attention, mlp = block.self_attn, block.mlp
    norms = (block.input_layernorm, block.post_attention_layernorm)
    if (
        x.dtype != mx.float32
        or x.ndim != 3
        or not isinstance(attention, NumpyAttention)
        or not isinstance(mlp, NumpyMLP)
        or not all(type(norm) is nn.RMSNorm for norm in norms)
        or (cache is not None and hasattr(cache, "bits"))
        or not (mask is None or isinstance(mask, mx.array) or (isinstance(mask, str) and mask == "causal"))
    ):
        return None
    try:
        mx.eval(x)
    except ValueError:  # under mx.compile, vmap or export: no evaluation
        return None
    batch, length, dims = x.shape
    decoding = length <= INT8_MAX_POSITIONS
    # A decoding pass's small operations in C where the route has them (kernels/pass_ops.py).
    ops = pass_ops() if decoding and current_route().pass_ops == "compiled" else None
    h = np.asarray(x).reshape(-1, dims)
    if ops is not None and batch == 1 and isinstance(cache, NumpyKVCache):
        fused = _block_in_one_call(block, ops, h, mask, cache)
        if fused is not None:
            return mx.array(fused.reshape(batch, length, dims))
    normed = _rms_norm(h, norms[0], ops)
    projections = (attention.q_proj, attention.k_proj, attention.v_proj)
    queries_rows, keys_rows, values_rows = _rows_times_together(attention, projections, normed, decoding)
    shaped = [
        rows.reshape(batch, length, heads, -1).transpose(0, 2, 1, 3)
        for rows, heads in ((queries_rows, attention.n_heads), (keys_rows, attention.n_kv_heads))
    ]
    values_rows = values_rows.reshape(batch, length, attention.n_kv_heads, -1).transpose(0, 2, 1, 3)
    offset = 0 if cache is None else cache.offset
    if type(attention.rope) is nn.RoPE and isinstance(cache, NumpyKVCache):
        # MLX's rope of a step cost more than its linears; keys and values go to the NumPy copy
        q, rotated_keys = (_rope(a, attention.rope, offset, ops) for a in shaped)
        k, v = cache.append_rows(rotated_keys, values_rows)  # copied into the cache: any layout
    else:
        q, k, v = _mlx_cache_rows(attention, shaped, values_rows, offset, cache, ops)
    # One BLAS thread up to a prefill chunk's queries (numpy_attention.SMALL_QUERIES says why).
    with single_threaded_blas() if length <= SMALL_QUERIES else contextlib.nullcontext():
        attended = attention_rows(q, k, v, attention.scale, mask, ops)
    attended_rows = attended.transpose(0, 2, 1, 3).reshape(batch * length, -1)
    h = h + _rows_times(attention.o_proj, attended_rows, decoding)
    normed = _rms_norm(h, norms[1], ops)
    gate, up = _rows_times_together(mlp, (mlp.gate_proj, mlp.up_proj), normed, decoding)
    hidden = _silu_times(gate, up, ops)
    h += _rows_times(mlp.down_proj, hidden, decoding)
    return mx.array(h.reshape(batch, length, dims))


@dataclass(frozen=True, eq=False)
class _KeptPlan:
    """A block's BlockPlan, the objects it was made from (their identity says it still holds) and
    the arrays it points into (kept alive with it)."""

    plan: BlockPlan
    sources: tuple
    arrays: tuple


def _block_in_one_call(
    block: Any, ops: PassOps, h: np.ndarray, mask: Any, cache: NumpyKVCache
) -> np.ndarray | None:
    """One sequence's decoding pass through the block in one call of the pass operations
    (PassOps.block: the products and operations numpy_block makes, in its order: the same bits),
    where every product is the quantized kernel's on tiles; None where not (numpy_block's way)."""
    kept = _block_plan(block)
    if kept is None:
        return None
    attention, length = block.self_attn, h.shape[0]
    plan = kept.plan
    shape = (1, plan.kv_heads, length, plan.head_dim)
    keys, values, start = cache.reserve_rows(shape, shape)
    seen = visible_ranges(mask, 1, length, start + length)
    if seen is None:
        return None
    cos, sin = _rope_tables(attention.rope, np.asarray(start, dtype=np.float64).reshape(-1), length)
    out = np.array(h, dtype=np.float32)  # a copy: the block writes its rows in place
    tables = (cos.reshape(length, -1), sin.reshape(length, -1))
    if not ops.block(plan, out, tables, (keys, values, start), seen, current_route().blas_threads):
        return None
    cache.commit_rows(start + length)
    return out


def _block_plan(block: Any) -> _KeptPlan | None:
    """The block's plan for PassOps.block, kept on the block while its weights and norms are the
    ones it was made from; None where a product is not the quantized kernel's on tiles on int8
    rows (int16 for the down projection), the RoPE is not plain, or a pack does not form."""
    route = current_route()
    kernel = quant_kernel()
    if route.plain_linears != "quant-kernel" or route.quant_activations != "int8" or kernel is None:
        return None
    attention, mlp = block.self_attn, block.mlp
    norms = (block.input_layernorm, block.post_attention_layernorm)
    if not isinstance(attention, NumpyAttention) or not isinstance(mlp, NumpyMLP):
        return None
    if not all(type(norm) is nn.RMSNorm for norm in norms):
        return None
    linears = (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj) + (
        mlp.gate_proj,
        mlp.up_proj,
        mlp.down_proj,
    )
    weights = [getattr(linear, "quant", None) for linear in linears]
    sources = (*(w.weights if w is not None else None for w in weights), *(n.weight for n in norms))
    kept = getattr(block, "pass_plan", None)
    if kept is not None and all(a is b for a, b in zip(kept.sources, sources, strict=True)):
        return kept
    made = _make_block_plan(kernel, attention, mlp, linears, norms)
    block.pass_plan = None if made is None else _KeptPlan(made[0], sources, made[1])
    return block.pass_plan


def _make_block_plan(kernel: Any, attention: Any, mlp: Any, linears: tuple, norms: tuple) -> tuple | None:
    """(BlockPlan, the arrays it points into), or None (_block_plan says where)."""
    if type(attention.rope) is not nn.RoPE:
        return None
    arrays: list = []
    products = []
    # q, k and v; o; gate and up; down (whose rows take int16, not int8: FP32_INPUT_LAYERS)
    groups = ((linears[:3], True), (linears[3:4], True), (linears[4:6], True), (linears[6:], False))
    for group, narrow in groups:
        product = _product(group, narrow, arrays)
        if product is None:
            return None
        products.append(product)
    views = [_rms_norm_weight(norm) for norm in norms]
    arrays += views
    head_dim = attention.q_proj.quant.weights[0].out_dims // attention.n_heads
    plan = BlockPlan(
        *products,
        norm1=views[0].ctypes.data,
        norm2=views[1].ctypes.data,
        eps1=norms[0].eps,
        eps2=norms[1].eps,
        scale=attention.scale,
        dims=linears[0].quant.weights[0].in_dims,
        inter=linears[4].quant.weights[0].out_dims,
        heads=attention.n_heads,
        kv_heads=attention.n_kv_heads,
        head_dim=head_dim,
        rope_dims=attention.rope.dims,
        traditional=int(attention.rope.traditional),
        tiled=ctypes.cast(kernel.tiled_together, ctypes.c_void_p).value,
        q6k=ctypes.cast(kernel.tiled_q6k, ctypes.c_void_p).value,
    )
    return plan, tuple(arrays)


def _product(linears: tuple, narrow: bool, arrays: list) -> Product | None:
    """The Product of linears that read the same rows (one call, as _rows_times_together makes it;
    one linear as numpy_rows makes it), or None where they do not take the tiles' path."""
    found = []
    for linear in linears:
        quant = getattr(linear, "quant", None)
        if quant is None or len(quant.weights) != 1 or linear.int8_inputs != narrow:
            return None
        found.append(quant.weights[0])
    biases = [linear.get("bias") for linear in linears]
    if any(b is None for b in biases) != all(b is None for b in biases):
        return None  # a bias on some only: added one by one in NumPy
    bias = None if biases[0] is None else np.concatenate([bias_row(b) for b in biases])
    if bias is not None:
        arrays.append(bias)
    bias_at = None if bias is None else bias.ctypes.data
    if len(found) > 1:
        pack = weight_pack(found)
        if pack is None or not pack.tiled:
            return None
        arrays.append(pack)
        fields = ctypes.addressof(pack.fields)
        return Product(fields, bias_at, len(found), found[0].in_dims, pack.ends[-1], 0, 0)
    weight = found[0]
    wide = int(not narrow)
    if weight.layout == TILED:
        return Product(ctypes.addressof(weight.fields), bias_at, 1, weight.in_dims, weight.out_dims, 0, wide)
    if weight.layout == Q6K_TILED:
        return Product(weight.addresses[0], bias_at, 1, weight.in_dims, weight.out_dims, 1, wide)
    return None


def _mlx_cache_rows(
    attention: Any,
    shaped: list[np.ndarray],
    values_rows: np.ndarray,
    offset: Any,
    cache: Any,
    ops: PassOps | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Queries, keys and values (B × heads × T × D, fp32 NumPy) of a decoding pass whose cache
    is mlx-lm's own (a packed pass's, a rotating one) or whose RoPE is scaled (Llama 3's, YaRN:
    the model's own runs): through MLX, one evaluation."""
    values = mx.array(values_rows)
    q: np.ndarray | None = None
    if type(attention.rope) is nn.RoPE:  # the queries stay NumPy's
        q, rotated_keys = (_rope(a, attention.rope, offset, ops) for a in shaped)
        keys = mx.array(rotated_keys)
    else:
        queries, keys = (attention.rope(mx.array(a), offset=offset) for a in shaped)
    if cache is not None:
        keys, values = cache.update_and_fetch(keys, values)
    views = evaluated(keys, values) if q is not None else evaluated(queries, keys, values)
    assert views is not None, "x was evaluated: so are these"
    return (q, views[0], views[1]) if q is not None else (views[0], views[1], views[2])


def _rope(x: np.ndarray, rope: nn.RoPE, offset: Any, ops: PassOps | None = None) -> np.ndarray:
    """nn.RoPE on fp32 NumPy x (B, heads, L, D) at positions offset + 0..L-1; offset is an int or
    one per sequence (an array of B, as a packed pass gives). The same bits by the compiled pass
    operations where given."""
    half = rope.dims // 2
    cos, sin = _rope_tables(rope, np.asarray(offset, dtype=np.float64).reshape(-1), x.shape[2])
    if ops is not None:
        return ops.rope(x, rope.dims, rope.traditional, cos, sin)
    out = x.copy()
    if rope.traditional:  # pairs of neighbours
        first, second = x[..., 0 : rope.dims : 2], x[..., 1 : rope.dims : 2]
        out[..., 0 : rope.dims : 2] = first * cos - second * sin
        out[..., 1 : rope.dims : 2] = first * sin + second * cos
    else:  # the first half of the rotated dims paired with the second
        first, second = x[..., :half], x[..., half : rope.dims]
        out[..., :half] = first * cos - second * sin
        out[..., half : rope.dims] = first * sin + second * cos
    return out


def _rope_tables(rope: nn.RoPE, offsets: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin (1 or B, 1, L, dims/2) of nn.RoPE's angles at positions offsets + 0..L-1. Every
    layer of a pass rotates its queries and keys at the same positions: the last tables are kept
    (one entry; a pass of 28 layers computes them once, not 56 times)."""
    key = (rope.dims, rope.base, rope.scale, length, offsets.tobytes())
    last = _ROPE_TABLES.get("last")
    if last is not None and last[0] == key:
        return last[1]
    half = rope.dims // 2
    positions = offsets.reshape(-1, 1) + np.arange(length)  # (1 or B, L)
    frequencies = np.asarray(rope.base, dtype=np.float64) ** (-np.arange(half) / half)
    angles = (rope.scale * positions)[:, None, :, None] * frequencies  # (1 or B, 1, L, half)
    tables = (np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32))
    _ROPE_TABLES["last"] = (key, tables)  # one assignment: a reader on another thread sees a pair
    return tables


_ROPE_TABLES: dict[str, tuple] = {}


@dataclass(frozen=True)
class _NumpyWeight:
    """A norm's weight and its fp32 NumPy view, kept on the norm (a plain attribute, never a
    parameter: not an mx.array, dict, list or tuple) while that array is still its weight."""

    weight: mx.array
    view: np.ndarray


def _rms_norm_weight(norm: nn.RMSNorm) -> np.ndarray:
    """The norm's weight as an fp32 NumPy view, kept on the norm while it is its weight."""
    kept = getattr(norm, "numpy_weight", None)
    if kept is None or kept.weight is not norm.weight:
        view = np.asarray(norm.weight if norm.weight.dtype == mx.float32 else norm.weight.astype(mx.float32))
        kept = norm.numpy_weight = _NumpyWeight(norm.weight, view)
    return kept.view


def _rms_norm(rows: np.ndarray, norm: nn.RMSNorm, ops: PassOps | None = None) -> np.ndarray:
    """nn.RMSNorm on fp32 NumPy rows (the same bits by the compiled pass operations where given)."""
    weight = _rms_norm_weight(norm)
    if ops is not None:
        return ops.rms_norm(rows, weight, norm.eps)
    # np.mean's own bits (a sum, then one division), without its Python-level wrapper
    mean_square = np.add.reduce(np.square(rows), axis=-1, keepdims=True) / np.float32(rows.shape[-1])
    return rows / np.sqrt(mean_square + np.float32(norm.eps)) * weight


def _rows_times(linear: nn.Module, rows: np.ndarray, decoding: bool) -> np.ndarray:
    """rows · Wᵀ (+ bias) as fp32 NumPy: in NumPy by the layer's numpy_rows where it has one and
    its route takes it, else by the layer's own call (an evaluation). decoding: as numpy_rows."""
    numpy_rows = getattr(linear, "numpy_rows", None)
    y = numpy_rows(rows, decoding) if numpy_rows is not None else None
    if y is None:
        out = linear(mx.array(rows))
        y = np.asarray(out if out.dtype == mx.float32 else out.astype(mx.float32))
    return y


def _rows_times_together(
    owner: nn.Module, linears: tuple[nn.Module, ...], rows: np.ndarray, decoding: bool
) -> list[np.ndarray]:
    """rows · Wᵀ (+ bias) for linears that read the same rows (a block's q, k and v; its gate and
    up): one kernel call where each takes the int8 path in one product (the same bits as a call
    each, kernels/quant_packs.py; a prefill's rows only where they are tiles, whose one path
    takes every row count), else a call each. The pack is kept on `owner` (a plain attribute)
    while its weights are the linears'."""
    found = [getattr(linear, "int8_weight", lambda: None)() for linear in linears]
    weights = [weight for weight in found if weight is not None]
    if len(weights) == len(linears):
        kept = getattr(owner, "weight_pack", None)
        if kept is None or not all(a is b for a, b in zip(kept.weights, weights, strict=False)):
            kept = owner.weight_pack = weight_pack(weights)
        if kept is not None and len(kept.weights) == len(weights) and (decoding or kept.tiled):
            together = numpy_quant_rows_together(rows, kept, [linear.get("bias") for linear in linears])
            if together is not None:
                return together
    return [_rows_times(linear, rows, decoding) for linear in linears]


def _subclass(base: type, mixin: type) -> type:
    """The mixin's __call__ over `base` (one class per pair, made once)."""
    key = (base, mixin)
    if key not in _CLASSES:
        _CLASSES[key] = type(f"{mixin.__name__}{base.__name__}", (mixin, base), {})
    return _CLASSES[key]


_CLASSES: dict[tuple[type, type], type] = {}


def decoding_caches(model: nn.Module, caches: list) -> list:
    """`caches` (mlx-lm's for `model`) as NumpyKVCache where they are plain KV caches and the
    model's blocks take the NumPy route (their decoding passes then keep keys and values in NumPy);
    else as they are."""
    numpy_blocks = any(isinstance(module, NumpyBlock) for _, module in model.named_modules())
    if not numpy_blocks or not all(type(cache) is KVCache for cache in caches):
        return caches
    return [NumpyKVCache() for _ in caches]


def use_numpy_blocks(model: nn.Module) -> int:
    """Give every llama/qwen2 attention and MLP block of `model` its NumPy route (changing the
    class leaves the parameters untouched); how many blocks took it."""
    taken = 0
    for _, module in model.named_modules():
        base = type(module)
        if base in ATTENTION_CLASSES:
            module.__class__ = _subclass(base, NumpyAttention)
            taken += 1
        elif base in MLP_CLASSES:
            module.__class__ = _subclass(base, NumpyMLP)
            taken += 1
        elif base in BLOCK_CLASSES:
            module.__class__ = _subclass(base, NumpyBlock)
        elif base in BODY_CLASSES:
            module.__class__ = _subclass(base, NumpyBody)
    return taken
