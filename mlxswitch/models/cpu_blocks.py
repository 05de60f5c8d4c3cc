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
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models import llama, qwen2
from mlx_lm.models.cache import KVCache

from ..kernels._common import single_threaded_blas
from ..kernels.pass_ops import PassOps, pass_ops
from ..kernels.quant_cpu import INT8_MAX_POSITIONS
from ..kernels.quant_linear import numpy_quant_rows_together
from ..kernels.quant_packs import weight_pack
from ..kernels.route import current_route
from .block_calls import body_in_one_call
from .block_tables import rms_norm_weight, rope_tables
from .numpy_attention import SMALL_QUERIES, attention_rows, evaluated, numpy_attention
from .numpy_cache import NumpyKVCache
from .packed_cache import PackedLayerCache

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
        plain = all(_numpy_layer(layer) for layer in self.layers)
        out = body_in_one_call(self, inputs, cache, input_embeddings) if plain else None
        if out is None:
            out = super().__call__(inputs, cache=cache, input_embeddings=input_embeddings)
        return out


def _numpy_layer(layer: Any) -> bool:
    """Whether a body's layer is mlx-lm's llama/qwen2 block on the NumPy route (use_numpy_blocks)."""
    # Its children read as the Module's dict entries (Module.__getattr__ is slow, and this is every pass).
    return (
        isinstance(layer, NumpyBlock)
        and isinstance(layer.get("self_attn"), NumpyAttention)
        and isinstance(layer.get("mlp"), NumpyMLP)
    )


def numpy_block(block: Any, x: mx.array, mask: Any, cache: Any) -> mx.array | None:
    """One decoder block on a pass's rows (fp32) with no MLX evaluation where the cache is a
    NumpyKVCache (else one, where mlx-lm's block made six: each evaluation of a small graph costs
    ~0.13 ms on MLX's CPU backend, and a prefill's rows went to NumPy and back at each linear).
    The norms, residuals, linears (their `numpy_rows`), RoPE (nn.RoPE's) and attention run in
    NumPy (the norms, RoPE and silu·up by the compiled pass operations where the route has them);
    a scaled RoPE stays the model's, and a cache of mlx-lm's own its own. A decoding pass
    (≤ INT8_MAX_POSITIONS a sequence) computes each row as a step would; a longer one (a
    prefill chunk) by the kernel's many-row paths and BLAS's attention a block of queries at a
    time. None where
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
    # The small operations in C where the route has them (kernels/pass_ops.py); a prefill chunk's
    # attention stays BLAS's, a block of queries at a time.
    ops = pass_ops() if current_route().pass_ops == "compiled" else None
    h = np.asarray(x).reshape(-1, dims)
    normed = _rms_norm(h, norms[0], ops)
    projections = (attention.q_proj, attention.k_proj, attention.v_proj)
    queries_rows, keys_rows, values_rows = _rows_times_together(attention, projections, normed, decoding)
    shaped = [
        rows.reshape(batch, length, heads, -1).transpose(0, 2, 1, 3)
        for rows, heads in ((queries_rows, attention.n_heads), (keys_rows, attention.n_kv_heads))
    ]
    values_rows = values_rows.reshape(batch, length, attention.n_kv_heads, -1).transpose(0, 2, 1, 3)
    offset = 0 if cache is None else cache.offset
    plain_rope = type(attention.rope) is nn.RoPE
    # One BLAS thread up to a prefill chunk's queries (numpy_attention.SMALL_QUERIES says why).
    with single_threaded_blas() if length <= SMALL_QUERIES else contextlib.nullcontext():
        if plain_rope and isinstance(cache, NumpyKVCache):
            # MLX's rope of a step cost more than its linears; keys and values go to the NumPy copy
            q, rotated_keys = (_rope(a, attention.rope, offset, ops) for a in shaped)
            k, v = cache.append_rows(rotated_keys, values_rows)  # copied into the cache: any layout
            attended = attention_rows(q, k, v, attention.scale, mask, ops if decoding else None)
        elif plain_rope and isinstance(cache, PackedLayerCache) and cache.keeps_numpy_copies():
            q, rotated_keys = (_rope(a, attention.rope, offset, ops) for a in shaped)
            attended = _packed_attention(q, rotated_keys, values_rows, cache, attention.scale, ops)
        else:
            q, k, v = _mlx_cache_rows(attention, shaped, values_rows, offset, cache, ops)
            attended = attention_rows(q, k, v, attention.scale, mask, ops if decoding else None)
    attended_rows = attended.transpose(0, 2, 1, 3).reshape(batch * length, -1)
    h = h + _rows_times(attention.o_proj, attended_rows, decoding)
    normed = _rms_norm(h, norms[1], ops)
    gate, up = _rows_times_together(mlp, (mlp.gate_proj, mlp.up_proj), normed, decoding)
    hidden = _silu_times(gate, up, ops)
    h += _rows_times(mlp.down_proj, hidden, decoding)
    return mx.array(h.reshape(batch, length, dims))


def _packed_attention(
    q: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    cache: PackedLayerCache,
    scale: float,
    ops: PassOps | None,
) -> np.ndarray:
    """A packed pass's attention (rows as a batch of R sequences of length one: R × heads × 1 × D)
    conversation by conversation: each one's new keys and values appended to its own NumPy copy,
    its rows attending as its own decoding pass would (the same keys, in order: the same bits), with
    no trip through MLX's arrays, padding to the widest or gathering per row (what the view's
    update_and_fetch does)."""
    out = np.empty_like(q)
    for conversation, rows, (queries, new_keys, new_values) in cache.by_conversation(q, keys, values):
        k, v = conversation.append_rows(new_keys, new_values)
        mask = "causal" if queries.shape[2] > 1 else None
        out[rows, :, 0, :] = attention_rows(queries, k, v, scale, mask, ops)[0].transpose(1, 0, 2)
    return out


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
    cos, sin = rope_tables(rope, np.asarray(offset, dtype=np.float64).reshape(-1), x.shape[2])
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


def _rms_norm(rows: np.ndarray, norm: nn.RMSNorm, ops: PassOps | None = None) -> np.ndarray:
    """nn.RMSNorm on fp32 NumPy rows (the same bits by the compiled pass operations where given)."""
    weight = rms_norm_weight(norm)
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
