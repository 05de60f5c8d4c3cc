"""Plain quantized linears on the multi-row route: prefill and catch-up at BLAS speed on a CPU."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from ..kernels.nested import quantized_matmul_rows


class RowsQuantizedLinear(nn.QuantizedLinear):
    """nn.QuantizedLinear whose product takes the dispatcher's route (same arrays, same results)."""

    def __call__(self, x: mx.array) -> mx.array:
        """x · Wᵀ (+ bias); many rows go through one dequantized product (kernels/nested.py)."""
        return quantized_matmul_rows(
            x,
            self["weight"],
            self["scales"],
            self.get("biases"),
            self.group_size,
            self.bits,
            self.get("bias"),
            mode=self.mode,
        )


def use_fast_rows(model: nn.Module) -> int:
    """Give every plain nn.QuantizedLinear the multi-row route; the count of layers changed."""
    changed = 0
    for _, module in model.named_modules():
        # Only the exact class: a subclass (or another library's layer) keeps its own __call__.
        # Changing the class leaves the parameters, and so loading and saving, untouched.
        if type(module) is nn.QuantizedLinear:
            module.__class__ = RowsQuantizedLinear
            changed += 1
    return changed
