"""A decoding pass (one sequence's, or a packed pass's: several conversations' rows, each against its
own cache) through a llama/qwen2 model body in one call of the compiled pass operations
(kernels/pass_ops.c, blocks_rows), where every product is the quantized kernel's on its tiles. The
same products, operations and order as cpu_blocks.numpy_block with the pass operations, so the
same bits; what it saves is Python's ~20 calls a block (kernels.md). Callers hand over only blocks
cpu_blocks made NumPy blocks (mlx-lm's llama/qwen2 structure: the plan below reads their layers by
name).
"""

from __future__ import annotations

import ctypes
import logging
import threading
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.base import create_attention_mask

from ..kernels.pass_ops import BlockPlan, Product, pass_ops
from ..kernels.quant_cpu import INT8_MAX_POSITIONS, quant_kernel
from ..kernels.quant_linear import bias_row
from ..kernels.quant_packs import weight_pack
from ..kernels.quant_weights import Q4K_TILED, Q6K_TILED, TILED
from ..kernels.route import current_route
from .block_tables import rms_norm_weight, rope_tables
from .numpy_attention import visible_ranges
from .numpy_cache import NumpyKVCache
from .packed_cache import PackedLayerCache

# Set while a body's first one-call pass is checked against the operations one by one: the call
# below steps aside for the reference pass (one flag a thread: serve's engine runs on its own).
_REFERENCE_PASS = threading.local()


def body_in_one_call(body: Any, inputs: mx.array, cache: Any, input_embeddings: Any) -> mx.array | None:
    """A decoding pass through every block in one call (PassOps.blocks: the products and
    operations cpu_blocks.numpy_block makes, in its order: the same bits), then the body's norm:
    one sequence's, or a packed pass's (several conversations' rows, each against its own cache);
    None where a block has no plan, a cache keeps no NumPy copy, the body is not mlx-lm's plain one
    (pipelined, sliding windows, given embeddings), or its first such pass differed from the
    operations one by one (_first_pass_checked)."""
    packed = bool(cache) and isinstance(cache[0], PackedLayerCache)
    layers = body.layers
    # Each kind of pass, and each count of a nested gear's active planes (other plans), is checked.
    planes = _active_planes(layers)
    kind = "packed_call_checked" if packed else "one_call_checked"
    checked = kind if planes == 1 else f"{kind}_{planes}"
    if getattr(_REFERENCE_PASS, "on", False) or getattr(body, checked, None) is False:
        return None
    if input_embeddings is not None or cache is None or inputs.ndim != 2:
        return None
    if current_route().pass_ops != "compiled" or len(cache) != len(layers):
        return None
    if getattr(body, "pipeline_size", 1) != 1 or getattr(body, "swa_idx", None) is not None:
        return None
    ops = pass_ops()
    pass_rows = _packed_rows(inputs, cache) if packed else _sequence_rows(inputs, cache)
    if ops is None or pass_rows is None:
        return None
    conversations, starts, lengths, seen = pass_rows
    plans = _block_plans(layers, planes)
    if plans is None:
        return None
    h = body.embed_tokens(inputs)
    try:
        mx.eval(h)
    except ValueError:  # under mx.compile, vmap or export: no evaluation
        return None
    if h.dtype != mx.float32:
        return None
    rows = np.array(np.asarray(h).reshape(sum(lengths), -1))  # a copy: the blocks write it in place
    positions = np.concatenate(
        [start + np.arange(n, dtype=np.float64) for start, n in zip(starts, lengths, strict=True)]
    )
    cos, sin = rope_tables(layers[0].self_attn.rope, positions, 1)  # a row's table at its position
    room = []
    for plan, layer_conversations in zip(plans, conversations, strict=True):
        layer_room = []
        for conversation, n in zip(layer_conversations, lengths, strict=True):
            shape = (1, plan.kv_heads, n, plan.head_dim)
            keys, values, _ = conversation.reserve_rows(shape, shape)
            layer_room.append((keys, values))
        room.append(layer_room)
    tables = (cos.reshape(len(positions), -1), sin.reshape(len(positions), -1))
    threads = current_route().blas_threads
    if not ops.blocks(plans, rows, tables, room, starts, lengths, seen, threads):
        return None  # nothing committed: mlx-lm's body computes the pass again
    out = body.norm(mx.array(rows.reshape(inputs.shape[0], inputs.shape[1], -1)))
    if getattr(body, checked, None) is None:
        return _first_pass_checked(body, inputs, cache, out, checked)
    for layer_conversations in conversations:
        for conversation, start, n in zip(layer_conversations, starts, lengths, strict=True):
            conversation.commit_rows(start + n)
    return out


_PassRows = tuple[list[list[NumpyKVCache]], list[int], list[int], list[slice]]


def _active_planes(layers: Any) -> int:
    """How many planes a nested gear's body multiplies now (its linears share one GearState), else 1."""
    attention = layers[0].get("self_attn") if len(layers) else None
    state = getattr(attention.get("q_proj"), "gear_state", None) if isinstance(attention, nn.Module) else None
    return 1 if state is None else state.active_planes


def _sequence_rows(inputs: mx.array, cache: list) -> _PassRows | None:
    """One sequence's pass: (per layer its one cache, its start, its rows, the keys each row sees);
    None where a cache keeps no NumPy copy, the layers' offsets differ or the mask is not plain."""
    if inputs.shape[0] != 1 or not all(isinstance(c, NumpyKVCache) for c in cache):
        return None
    length, start = inputs.shape[1], cache[0].offset
    if length > INT8_MAX_POSITIONS or any(c.offset != start for c in cache):
        return None
    seen = visible_ranges(create_attention_mask(inputs[..., None], cache[0]), 1, length, start + length)
    return None if seen is None else ([[c] for c in cache], [start], [length], seen)


def _packed_rows(inputs: mx.array, cache: list) -> _PassRows | None:
    """A packed pass (R rows as R sequences of length one, models/packed_cache.py): per layer its
    conversations' caches, each conversation's start and rows, and the keys each row sees (its own
    conversation's up to its position); None where a conversation keeps no NumPy copy or the
    layers disagree."""
    sizes = cache[0].sizes
    if inputs.shape[1] != 1 or inputs.shape[0] != sum(sizes):
        return None
    if not all(isinstance(c, PackedLayerCache) and c.sizes == sizes for c in cache):
        return None
    if not all(c.keeps_numpy_copies() for c in cache):
        return None
    conversations = [c.caches for c in cache]
    starts = [c.offset for c in conversations[0]]
    if any([c.offset for c in layer] != starts for layer in conversations):
        return None
    seen = [slice(0, start + j + 1) for start, n in zip(starts, sizes, strict=True) for j in range(n)]
    return conversations, starts, list(sizes), seen


def _first_pass_checked(body: Any, inputs: mx.array, cache: Any, out: mx.array, checked: str) -> mx.array:
    """A body's first one-call pass of a kind (one sequence's; a packed pass's), checked: the same
    pass made again by the operations one by one (which writes and commits the same keys and
    values), its hidden states compared bit for bit. On a difference the body keeps the operations
    one by one for that kind from then on (a warning says so); the reference's output is returned
    either way."""
    _REFERENCE_PASS.on = True
    try:
        want = body(inputs, cache=cache)
        mx.eval(want)
    finally:
        _REFERENCE_PASS.on = False
    same = bool(mx.array_equal(out, want).item())
    setattr(body, checked, same)
    if not same:
        logging.getLogger(__name__).warning(
            "a decoding pass in one call differed from its operations one by one: this model keeps them"
        )
    return want


@dataclass(frozen=True, eq=False)
class _KeptPlan:
    """A block's BlockPlan (None: the block cannot take one, remembered so that a pass does not try
    again), the objects it was made from (their identity says it still holds), the arrays it
    points into (kept alive with it) and its RoPE's settings (one table serves a pass)."""

    plan: BlockPlan | None
    sources: tuple
    arrays: tuple
    rope: tuple = ()


_ATTENTION_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP_LINEARS = ("gate_proj", "up_proj", "down_proj")


def _block_plans(layers: Any, planes: int = 1) -> list[BlockPlan] | None:
    """Every block's plan for PassOps.blocks (_block_plan) at `planes` active planes (a nested
    gear's; 1 for plain linears), or None where one has none, the route has no quantized kernel on
    int8 rows, or the blocks' RoPEs differ."""
    route = current_route()
    kernel = quant_kernel()
    if route.plain_linears != "quant-kernel" or route.quant_activations != "int8" or kernel is None:
        return None
    kept = [_block_plan(kernel, layer, planes) for layer in layers]
    if any(k.plan is None for k in kept) or len({k.rope for k in kept}) != 1:
        return None
    return [k.plan for k in kept if k.plan is not None]


def _block_plan(kernel: Any, block: Any, planes: int) -> _KeptPlan:
    """The block's plan, kept on the block while its weights and norms are the ones it was made
    from; its plan None where a product is not the quantized kernel's on tiles on int8 rows (int16
    for the down projection), the RoPE is not plain, or a pack does not form."""
    # A Module is a dict of its children: read as one, not through Module.__getattr__ (~0.3 ms a
    # pass for the Qwen 1.5B's 28 blocks, every pass).
    attention, mlp = block["self_attn"], block["mlp"]
    norms = (block["input_layernorm"], block["post_attention_layernorm"])
    linears = (*(attention[name] for name in _ATTENTION_LINEARS), *(mlp[name] for name in _MLP_LINEARS))
    sources = (*(_weights_of(linear) for linear in linears), *(n.get("weight") for n in norms))
    # A nested gear's blocks keep a plan for each count of active planes (they switch per token;
    # the pass reads the count once, _active_planes).
    plans = getattr(block, "pass_plans", None)
    if plans is None:
        plans = block.pass_plans = {}  # a plain attribute: a dict of plans, never parameters
    kept = plans.get(planes)
    if kept is None or not all(a is b for a, b in zip(kept.sources, sources, strict=True)):
        rope = attention.rope
        plain = all(type(norm) is nn.RMSNorm for norm in norms) and type(rope) is nn.RoPE
        made = _make_block_plan(kernel, attention, mlp, linears, norms) if plain else None
        plan, arrays = made if made is not None else (None, ())
        settings = (rope.dims, rope.base, rope.scale) if plain else ()
        kept = plans[planes] = _KeptPlan(plan, sources, arrays, settings)
    return kept


def _weights_of(linear: Any) -> Any:
    """What a linear's products are made from, for a kept plan to know it still holds: a plain
    linear's weight views, a nested gear's planes on tiles (None before its first integer pass)."""
    quant = getattr(linear, "quant", None)
    return quant.weights if quant is not None else getattr(linear, "tiled_planes", None)


def _linear_weights(linear: Any) -> tuple | None:
    """The weights a linear's rows are multiplied by on the tiles' path: a plain linear's one, a
    nested gear's active planes (NestedLinear.integer_planes); None where it takes another path."""
    quant = getattr(linear, "quant", None)
    if quant is not None:
        return tuple(quant.weights) if len(quant.weights) == 1 else None
    planes = getattr(linear, "integer_planes", None)
    return planes() if planes is not None else None


def _make_block_plan(kernel: Any, attention: Any, mlp: Any, linears: tuple, norms: tuple) -> tuple | None:
    """(BlockPlan, the arrays it points into), or None (_block_plan says where)."""
    arrays: list = []
    products = []
    # q, k and v; o; gate and up; down. Each group's rows take int8, or int16 where its linears
    # refuse int8 (quant_cpu.int8_inputs: a down projection's, rows too narrow).
    for group in (linears[:3], linears[3:4], linears[4:6], linears[6:]):
        product = _product(group, arrays)
        if product is None:
            return None
        products.append(product)
    views = [rms_norm_weight(norm) for norm in norms]
    arrays += views
    q_proj, gate = _linear_weights(linears[0]), _linear_weights(linears[4])
    assert q_proj is not None and gate is not None  # their products were made above
    head_dim = q_proj[0].out_dims // attention.n_heads
    plan = BlockPlan(
        *products,
        norm1=views[0].ctypes.data,
        norm2=views[1].ctypes.data,
        eps1=norms[0].eps,
        eps2=norms[1].eps,
        scale=attention.scale,
        dims=q_proj[0].in_dims,
        inter=gate[0].out_dims,
        heads=attention.n_heads,
        kv_heads=attention.n_kv_heads,
        head_dim=head_dim,
        rope_dims=attention.rope.dims,
        traditional=int(attention.rope.traditional),
        tiled=ctypes.cast(kernel.c.quant_tiled_rows, ctypes.c_void_p).value,
        q6k=ctypes.cast(kernel.c.quant_tiled_q6k, ctypes.c_void_p).value,
        run_parts=ctypes.cast(kernel.c.quant_run_parts, ctypes.c_void_p).value,
    )
    return plan, tuple(arrays)


def _product(linears: tuple, arrays: list) -> Product | None:
    """The Product of linears that read the same rows (one call, as _rows_times_together makes it;
    one linear as numpy_rows makes it; a nested gear's active planes, each plane's outputs summed
    as numpy_rows sums them), or None where they do not take the tiles' path or their rows would be
    rounded differently."""
    found = []
    narrow = linears[0].int8_inputs
    for linear in linears:
        weights = _linear_weights(linear)
        if weights is None or linear.int8_inputs != narrow:
            return None
        found.append(weights)
    planes = len(found[0])
    if any(len(weights) != planes for weights in found):
        return None
    biases = [linear.get("bias") for linear in linears]
    if any(b is None for b in biases) != all(b is None for b in biases):
        return None  # a bias on some only: added one by one in NumPy
    bias = None if biases[0] is None else np.concatenate([bias_row(b) for b in biases])
    if bias is not None:
        arrays.append(bias)
    bias_at = None if bias is None else bias.ctypes.data
    wide = int(not narrow)
    outputs = sum(weights[0].out_dims for weights in found)  # one plane's, summed over the planes
    if len(found) > 1 or planes > 1:
        pack = weight_pack([weights[plane] for plane in range(planes) for weights in found], bool(wide))
        if pack is None or not pack.tiled:
            return None
        arrays.append(pack)
        fields = ctypes.addressof(pack.fields)
        return Product(fields, bias_at, len(pack.weights), found[0][0].in_dims, outputs, 0, wide, planes)
    weight = found[0][0]
    if weight.layout in (TILED, Q4K_TILED):  # the tiles' call takes either
        fields = ctypes.addressof(weight.fields)
        return Product(fields, bias_at, 1, weight.in_dims, weight.out_dims, 0, wide, 1)
    if weight.layout == Q6K_TILED:
        return Product(weight.addresses[0], bias_at, 1, weight.in_dims, weight.out_dims, 1, wide, 1)
    return None
