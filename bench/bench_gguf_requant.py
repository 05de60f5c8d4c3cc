"""How each GGUF tensor type survives re-quantization to MLX's affine format (group 32).

For every tensor of the given GGUF files (a sample per type), the `gguf` package's dequantization
is the truth; each candidate width is compared with it: RMS error relative to the weights' RMS,
the worst error in units of the re-quantization step, and the share of groups reproduced exactly
(error below 1e-6 of the group's range). Run: uv run python bench/bench_gguf_requant.py FILE.gguf …
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

import mlx.core as mx
import numpy as np
from gguf import GGUFReader

from mlxswitch.models.gguf_convert import REQUANT_BITS, dequantized, requantize

GROUP = 32


def errors(values: np.ndarray, bits: int, ours: bool = False) -> dict:
    """Error of one re-quantization of `values` against themselves: plain mx.quantize, or
    mlxswitch's conversion (the group's grid recovered where it has one)."""
    if ours:
        out = requantize(values, bits)
        weight, scales, biases = out[""], out["scales"], out["biases"]
    else:
        weight, scales, biases = mx.quantize(mx.array(values), group_size=GROUP, bits=bits)
    back = np.asarray(mx.dequantize(weight, scales, biases, group_size=GROUP, bits=bits))
    diff = (back - values).reshape(-1, GROUP)
    span = np.ptp(values.reshape(-1, GROUP), axis=1) + 1e-30
    exact = (np.abs(diff).max(axis=1) <= 1e-6 * span).mean()
    return {"rel_rms": float(np.sqrt((diff**2).mean() / (values**2).mean())), "groups_exact": float(exact)}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--per-type", type=int, default=3, help="tensors sampled per type and file")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    rows: dict = defaultdict(lambda: defaultdict(list))
    for file in args.files:
        reader = GGUFReader(file)
        seen: dict = defaultdict(int)
        for tensor in reader.tensors:
            kind = tensor.tensor_type.name
            if len(tensor.shape) != 2 or seen[kind] >= args.per_type or kind in ("F32", "F16", "BF16"):
                continue
            seen[kind] += 1
            values = dequantized(tensor)
            for bits in (4, 5, 6, 8):
                rows[kind][bits].append(errors(values, bits))
            rows[kind]["ours"].append(errors(values, REQUANT_BITS[kind], ours=True))
            print(f"{file}: {tensor.name} {kind} {values.shape}", file=sys.stderr)
    table = {
        kind: {
            bits: {key: float(np.mean([r[key] for r in results])) for key in results[0]}
            for bits, results in by_bits.items()
        }
        for kind, by_bits in rows.items()
    }
    head = " | ".join(f"mx.quantize {b}-bit" for b in (4, 5, 6, 8))
    print(f"| type | mlxswitch: bits, rel. RMS error (exact groups) | {head} |")
    for kind, by_bits in sorted(table.items()):
        cells = [
            f"{by_bits[b]['rel_rms']:.2e} ({100 * by_bits[b]['groups_exact']:.0f}%)" for b in (4, 5, 6, 8)
        ]
        ours = by_bits["ours"]
        mine = f"{REQUANT_BITS[kind]}-bit, {ours['rel_rms']:.2e} ({100 * ours['groups_exact']:.0f}%)"
        print(f"| {kind} | {mine} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"command": " ".join(sys.argv), "files": args.files, "table": table}, handle, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
